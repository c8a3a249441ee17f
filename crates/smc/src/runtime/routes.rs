//! What the runtime tells a rendezvous about the connection's route: CLC eligibility
//! (the TCP option), and the device and interface facts of the Proposal and Accept.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsFd;

use arrayvec::ArrayVec;
use smc_wire::clc::Ipv6Prefix;

use super::{sys, Inner};
use crate::clc::{
    ClientRoute, ClientV2Route, Eligibility, LocalDevice, LocalPrefix, ProposalIp, ServerRoute,
};
use crate::endpoint::DeviceInfo;
use crate::tcp_option::{ClcBasis, Decision};

/// Whether CLC may start (RFC 7609 §3.5.1.1): the TCP option of both SYNs, or the
/// policy override.
pub(crate) fn eligibility(inner: &Inner, sock: &TcpStream, peer: SocketAddr) -> Eligibility {
    let outcome = inner.tcp_option.outcome(sock.as_fd());
    match inner.cfg.skip_tcp_option.decide(&outcome, peer) {
        // A private transport (SMC-R over iWARP, outside RFC 7609) is never offered on the
        // strength of the TCP option, which every SMC-R host sends: only to peers the
        // override policy names, i.e. that were configured for it too.
        Decision::Clc(ClcBasis::BothAnnounced) if inner.cfg.provider.private_transport().is_some() => {
            Eligibility::NotEligible {
                reason: format!(
                    "SMC-R over {} is a private extension: only with peers listed in SMC_RS_SKIP_TCP_OPTION",
                    inner.cfg.provider.private_transport().unwrap_or("a private transport")
                ),
            }
        }
        Decision::Clc(ClcBasis::BothAnnounced) => Eligibility::BothAnnounced,
        Decision::Clc(ClcBasis::PolicyOverride { pattern }) => {
            Eligibility::PolicyOverride { pattern }
        }
        Decision::Fallback { reason } => Eligibility::NotEligible { reason },
    }
}

/// The client's route facts for the Proposal (RFC 7609 §3.5.1.1, Linux
/// `smc_find_proposal_devices`): our device, and the IPv4 subnet or IPv6 prefixes of the
/// interface the connection leaves on.
pub(crate) fn client_route(inner: &Inner, dev: Option<&DeviceInfo>, local: IpAddr) -> ClientRoute {
    let mac = dev.map(|d| d.mac).unwrap_or_default();
    let peer_id = inner.peer_id(mac);
    let Some(d) = dev else {
        return ClientRoute {
            peer_id,
            v1: None,
            v2: None,
            same_host: None,
        };
    };
    let ld = LocalDevice {
        gid: d.gid,
        mac: d.mac,
    };
    let ip = sys::interface_of(local).map(|i| match local {
        IpAddr::V4(_) => {
            let subnet = match sys::masked(local, i.prefix_len) {
                IpAddr::V4(a) => a,
                IpAddr::V6(_) => std::net::Ipv4Addr::UNSPECIFIED,
            };
            ProposalIp::V4 {
                subnet,
                prefix_len: i.prefix_len,
            }
        }
        IpAddr::V6(_) => {
            let mut prefixes: ArrayVec<Ipv6Prefix, 8> = ArrayVec::new();
            for a in sys::addrs_of(&i.name) {
                if let IpAddr::V6(v6) = a.addr {
                    if (v6.segments()[0] & 0xffc0) == 0xfe80 || prefixes.is_full() {
                        continue;
                    }
                    if let IpAddr::V6(p) = sys::masked(a.addr, a.prefix_len) {
                        prefixes.push(Ipv6Prefix {
                            prefix: p,
                            len: a.prefix_len,
                        });
                    }
                }
            }
            ProposalIp::V6 { prefixes }
        }
    });
    ClientRoute {
        peer_id,
        v1: ip.map(|ip| (ld, ip)),
        v2: local.is_ipv4().then(|| ClientV2Route {
            device: ld,
            gid_list: ArrayVec::new(),
        }),
        same_host: None,
    }
}

/// The server's route facts: our device and the prefixes of the interface the
/// connection arrived on (for the same-LAN check, RFC 7609 §3.5.1.2).
pub(crate) fn server_route(inner: &Inner, dev: Option<&DeviceInfo>, local: IpAddr) -> ServerRoute {
    let mac = dev.map(|d| d.mac).unwrap_or_default();
    let peer_id = inner.peer_id(mac);
    if dev.is_none() {
        return ServerRoute {
            peer_id,
            v1_prefixes: None,
            v2: false,
            same_host: false,
        };
    }
    let prefixes = sys::interface_of(local).map(|i| {
        let mut v: Vec<LocalPrefix> = sys::addrs_of(&i.name)
            .into_iter()
            .map(|a| LocalPrefix {
                addr: a.addr,
                prefix_len: a.prefix_len,
            })
            .collect();
        if !v.iter().any(|p| p.addr == local) {
            v.push(LocalPrefix {
                addr: local,
                prefix_len: i.prefix_len,
            });
        }
        v
    });
    ServerRoute {
        peer_id,
        v1_prefixes: prefixes,
        v2: local.is_ipv4(),
        same_host: false,
    }
}
