//! An explicit override for hosts without eBPF: **outside RFC 7609**, off by
//! default.
//!
//! RFC 7609 §3.5.1.1 (CHECKLIST TO-4) says SMC-R MUST NOT be used unless both
//! SYN and SYN-ACK carried the SMC-R option. Where the option cannot be
//! written (no eBPF, no root to install the program, a kernel without
//! `BPF_SOCK_OPS_WRITE_HDR_OPT_CB`), an administrator may list peers for
//! which the option is ignored and CLC is tried directly. This is off by
//! default because a peer that does not speak SMC-R then receives a CLC
//! Proposal as application data (the client) or has its first bytes taken
//! for a Proposal (the server): both ends must list each other, and only
//! peers known to run smc-rs with the same policy belong in the list.
//!
//! Syntax: a comma- or whitespace-separated list of patterns,
//! `ADDR[/PREFIX][:PORT]` for IPv4, `[ADDR[/PREFIX]][:PORT]` or a bare
//! `ADDR[/PREFIX]` for IPv6, `*` for any address, `:*` or no port for any
//! port. Examples: `10.0.0.0/8:5000`, `192.0.2.7`, `[fd00::/64]:*`, `*:6000`.
//! IPv4-mapped IPv6 peers match IPv4 patterns.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use thiserror::Error;

use super::Outcome;

/// Environment variable read by [`SkipOptionPolicy::from_env`].
pub const POLICY_ENV: &str = "SMC_RS_SKIP_TCP_OPTION";

/// A malformed policy.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("bad peer pattern `{pattern}`: {why}")]
pub struct PolicyError {
    /// The offending pattern.
    pub pattern: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// One `ADDR[/PREFIX][:PORT]` pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPattern {
    /// Network address (host bits cleared) and prefix length; `None` = any.
    net: Option<(IpAddr, u8)>,
    /// `None` = any port.
    port: Option<u16>,
}

fn masked(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix))
            };
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

impl PeerPattern {
    /// True when `peer` matches.
    pub fn matches(&self, peer: SocketAddr) -> bool {
        if let Some(p) = self.port {
            if p != peer.port() {
                return false;
            }
        }
        match self.net {
            None => true,
            Some((net, prefix)) => {
                let ip = peer.ip().to_canonical();
                net.is_ipv4() == ip.is_ipv4() && masked(ip, prefix) == net
            }
        }
    }
}

fn parse_net(s: &str, pattern: &str) -> Result<Option<(IpAddr, u8)>, PolicyError> {
    let err = |why| PolicyError {
        pattern: pattern.to_string(),
        why,
    };
    if s == "*" {
        return Ok(None);
    }
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let addr: IpAddr = addr.parse().map_err(|_| err("not an IP address"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) => p
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| err("prefix length out of range"))?,
    };
    Ok(Some((masked(addr, prefix), prefix)))
}

fn parse_port(s: &str, pattern: &str) -> Result<Option<u16>, PolicyError> {
    if s == "*" {
        return Ok(None);
    }
    match s.parse::<u16>() {
        Ok(p) if p != 0 => Ok(Some(p)),
        _ => Err(PolicyError {
            pattern: pattern.to_string(),
            why: "port must be 1-65535 or *",
        }),
    }
}

impl FromStr for PeerPattern {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let err = |why| PolicyError {
            pattern: s.to_string(),
            why,
        };
        let (net, port) = if let Some(rest) = s.strip_prefix('[') {
            let (inner, after) = rest.split_once(']').ok_or_else(|| err("missing `]`"))?;
            let port = match after {
                "" => None,
                a => Some(
                    a.strip_prefix(':')
                        .ok_or_else(|| err("expected `:PORT` after `]`"))?,
                ),
            };
            (inner, port)
        } else if s.matches(':').count() >= 2 {
            // A bare IPv6 address or prefix: no port.
            (s, None)
        } else {
            match s.split_once(':') {
                Some((a, p)) => (a, Some(p)),
                None => (s, None),
            }
        };
        if net.is_empty() {
            return Err(err("empty address"));
        }
        Ok(PeerPattern {
            net: parse_net(net, s)?,
            port: port.map(|p| parse_port(p, s)).transpose()?.flatten(),
        })
    }
}

impl fmt::Display for PeerPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.net {
            None => write!(f, "*")?,
            Some((IpAddr::V4(a), p)) => write!(f, "{a}/{p}")?,
            Some((IpAddr::V6(a), p)) => write!(f, "[{a}/{p}]")?,
        }
        match self.port {
            None => write!(f, ":*"),
            Some(p) => write!(f, ":{p}"),
        }
    }
}

/// Peers for which the option result is ignored and CLC is tried anyway.
/// Empty (the default) means RFC 7609 behaviour.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkipOptionPolicy {
    patterns: Vec<PeerPattern>,
}

impl FromStr for SkipOptionPolicy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, PolicyError> {
        let patterns = s
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|p| !p.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        Ok(SkipOptionPolicy { patterns })
    }
}

/// Why CLC may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClcBasis {
    /// RFC 7609: SYN and SYN-ACK both carried the option.
    BothAnnounced,
    /// Outside RFC 7609: the peer matched this policy pattern.
    PolicyOverride {
        /// The pattern, as text.
        pattern: String,
    },
}

/// What the core does after the TCP handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start CLC (client: send a Proposal; server: wait for one).
    Clc(ClcBasis),
    /// Stay plain TCP; the reason in words.
    Fallback {
        /// Human-readable reason, e.g. "SMC-R option unavailable: ...".
        reason: String,
    },
}

impl SkipOptionPolicy {
    /// The default: no override.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Reads [`POLICY_ENV`]; unset or empty means disabled.
    pub fn from_env() -> Result<Self, PolicyError> {
        match smc_verbs::process::config_var(POLICY_ENV) {
            Some(v) => v.parse(),
            None => Ok(Self::disabled()),
        }
    }

    /// True when no pattern is configured.
    pub fn is_disabled(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The patterns.
    pub fn patterns(&self) -> &[PeerPattern] {
        &self.patterns
    }

    /// The first pattern matching `peer`.
    pub fn matching(&self, peer: SocketAddr) -> Option<&PeerPattern> {
        self.patterns.iter().find(|p| p.matches(peer))
    }

    /// The rendezvous decision for a connection to/from `peer` whose
    /// handshake gave `outcome`.
    pub fn decide(&self, outcome: &Outcome, peer: SocketAddr) -> Decision {
        if outcome.both_announced() {
            return Decision::Clc(ClcBasis::BothAnnounced);
        }
        if let Some(p) = self.matching(peer) {
            tracing::warn!(%peer, pattern = %p, %outcome,
                "SMC-R option check skipped by policy (outside RFC 7609)");
            return Decision::Clc(ClcBasis::PolicyOverride {
                pattern: p.to_string(),
            });
        }
        Decision::Fallback {
            reason: outcome.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp_option::{NotAnnounced, Unavailable};
    use proptest::prelude::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_matches() {
        let p: SkipOptionPolicy = "10.0.0.0/8:5000, 192.0.2.7 [fd00::/64]:*  *:6000 2001:db8::1"
            .parse()
            .unwrap();
        assert_eq!(p.patterns().len(), 5);
        assert!(p.matching(sa("10.1.2.3:5000")).is_some());
        assert!(p.matching(sa("10.1.2.3:5001")).is_none());
        assert!(p.matching(sa("192.0.2.7:1")).is_some());
        assert!(p.matching(sa("192.0.2.8:1")).is_none());
        assert!(p.matching(sa("[fd00::9]:80")).is_some());
        assert!(p.matching(sa("[fd01::9]:80")).is_none());
        assert!(p.matching(sa("203.0.113.1:6000")).is_some());
        assert!(p.matching(sa("[2001:db8::1]:7")).is_some());
        // IPv4-mapped IPv6 peers match IPv4 patterns.
        assert!(p.matching(sa("[::ffff:10.9.9.9]:5000")).is_some());
    }

    #[test]
    fn rejects_bad_patterns() {
        for bad in [
            "10.0.0.0/33",
            "10.0.0.1:0",
            "10.0.0.1:70000",
            "[fd00::",
            "[fd00::]x",
            "host.example:5",
            ":5",
            "fd00::/129",
        ] {
            assert!(bad.parse::<SkipOptionPolicy>().is_err(), "{bad}");
        }
    }

    #[test]
    fn disabled_by_default_and_rfc_otherwise() {
        let off = SkipOptionPolicy::disabled();
        let peer = sa("10.0.0.1:5000");
        let u = Outcome::Unavailable {
            reason: Unavailable {
                reason: "eBPF program not installed".into(),
            },
        };
        assert_eq!(
            off.decide(&u, peer),
            Decision::Fallback {
                reason: "SMC-R option unavailable: eBPF program not installed".into()
            }
        );
        assert_eq!(
            off.decide(&Outcome::BothAnnounced, peer),
            Decision::Clc(ClcBasis::BothAnnounced)
        );
        let on: SkipOptionPolicy = "10.0.0.0/24".parse().unwrap();
        assert!(matches!(
            on.decide(&u, peer),
            Decision::Clc(ClcBasis::PolicyOverride { .. })
        ));
        let other = Outcome::LocalNotAnnounced {
            why: NotAnnounced::SynCookie,
        };
        assert!(matches!(
            on.decide(&other, sa("10.0.1.1:5000")),
            Decision::Fallback { .. }
        ));
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,64}") {
            let _ = s.parse::<SkipOptionPolicy>();
        }

        #[test]
        fn display_round_trips(a in any::<u32>(), p in 0u8..=32, port in proptest::option::of(1u16..)) {
            let text = match port {
                Some(port) => format!("{}/{p}:{port}", std::net::Ipv4Addr::from(a)),
                None => format!("{}/{p}", std::net::Ipv4Addr::from(a)),
            };
            let pat: PeerPattern = text.parse().unwrap();
            let again: PeerPattern = pat.to_string().parse().unwrap();
            prop_assert_eq!(pat, again);
        }
    }
}
