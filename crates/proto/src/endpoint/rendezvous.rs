//! Running rendezvous: the clc machine of each TCP connection, how its outputs are
//! carried out, and how a finished one becomes a connection.

use ::core::net::IpAddr;
use std::time::Instant;

use smc_wire::common::BufSize;
use smc_wire::decline::DeclineCode;
use tracing::{debug, info, warn};

use super::env::Env;
use super::{BufSizes, ConnEntry, Endpoint, Host, NewConn, Output, RendezvousOutcome, TcpId};
use crate::clc::{self, LgrId, LinkEvent, Outcome, Output as ClcOutput, Rendezvous};
use crate::conn::{ConnParams, RmbeGeometry};
use crate::llc::{self, DeviceId, RToken};

/// A milestone for a rendezvous, delivered after the step that produced it.
pub(super) enum Note {
    Link(LinkEvent),
    Rkey(Result<(), DeclineCode>),
}

/// One running rendezvous.
pub(super) struct Rdv {
    pub machine: Rendezvous,
    pub local: IpAddr,
    pub peer: IpAddr,
    pub device: Option<DeviceId>,
    /// Server: bytes were fed to the machine (it is past the first-contact gate).
    pub started: bool,
    /// Link groups this rendezvous holds a reference on (idle accounting).
    pub lgr_refs: Vec<LgrId>,
    pub done: bool,
    /// The connection's buffer sizes (the endpoint's where `None`).
    pub bufs: BufSizes,
}

impl Rdv {
    pub fn new(
        machine: Rendezvous,
        local: IpAddr,
        peer: IpAddr,
        device: Option<DeviceId>,
        started: bool,
        bufs: BufSizes,
    ) -> Rdv {
        Rdv {
            machine,
            local,
            peer,
            device,
            started,
            lgr_refs: Vec::new(),
            done: false,
            bufs,
        }
    }
}

impl Endpoint {
    /// Runs `f` on the rendezvous of `tcp` with its environment, then carries out what
    /// the machine produced; a finished rendezvous is removed.
    pub(super) fn step(
        &mut self,
        now: Instant,
        host: &mut dyn Host,
        tcp: TcpId,
        f: impl FnOnce(&mut Rdv, &mut Env<'_>),
    ) {
        let Some(mut r) = self.rdvs.remove(&tcp) else {
            return;
        };
        let mut refs = std::mem::take(&mut r.lgr_refs);
        {
            let rmb = r
                .bufs
                .rmb
                .map(|n| BufSize::encode(n, BufSize::LINUX_MAX_CODE));
            let mut env = Env::new(
                self, host, tcp, r.device, r.local, r.peer, &mut refs, now, rmb,
            );
            f(&mut r, &mut env);
        }
        r.lgr_refs = refs;
        self.drain_rdv(now, host, tcp, &mut r);
        if r.done {
            for l in r.lgr_refs.drain(..) {
                if let Some(g) = self.lgrs.get_mut(&l) {
                    g.rendezvous = g.rendezvous.saturating_sub(1);
                }
                self.update_idle(now, host, l);
            }
        } else {
            self.rdvs.insert(tcp, r);
        }
    }

    /// Carries out a rendezvous' outputs, in order.
    fn drain_rdv(&mut self, now: Instant, host: &mut dyn Host, tcp: TcpId, r: &mut Rdv) {
        while let Some(o) = r.machine.poll_output() {
            match o {
                ClcOutput::Send(msg) => match msg.to_vec() {
                    Ok(bytes) => self.out.push_back(Output::TcpSend { tcp, bytes }),
                    Err(e) => warn!(error = %e, "CLC message does not encode"),
                },
                ClcOutput::ConfirmRkey { lgr, link: _, rmb } => {
                    self.confirm_rkey(now, tcp, lgr, rmb.0)
                }
                ClcOutput::OutOfSync { lgr } => {
                    // Only the link group this rendezvous referenced (RFC 7609 A.2.5,
                    // AMB-15).
                    warn!(lgr = lgr.0, "link group out of sync: terminating");
                    if let Some(l) = self.lgrs.get_mut(&lgr).and_then(|g| g.llc.as_mut()) {
                        l.terminate(now);
                        self.dirty.insert(lgr);
                    }
                }
                ClcOutput::AbortConn { conn } => {
                    let token = conn.0 as u32;
                    warn!(
                        token,
                        "RMB element reassigned by the peer: aborting the old connection"
                    );
                    self.out.push_back(Output::Conn {
                        token,
                        action: super::ConnAction::Kill(crate::conn::AbortReason::PeerAbort),
                    });
                }
                ClcOutput::Done(outcome) => {
                    r.done = true;
                    self.finish(host, tcp, r, outcome, now);
                }
            }
        }
    }

    /// CONFIRM RKEY for a new RMB before the Accept/Confirm (§3.5.2.1, §3.5.2.2): the
    /// RMB's RTokens on every link with a QP; the result comes back as a note.
    fn confirm_rkey(&mut self, now: Instant, tcp: TcpId, lgr: LgrId, rmb: u32) {
        let started = self.lgrs.get_mut(&lgr).and_then(|g| {
            let r = g.rmbs.get(&rmb)?;
            let tokens: Vec<(llc::LinkId, RToken)> = g
                .llc
                .as_ref()?
                .links_with_qp()
                .filter_map(|l| Some((l, *r.tokens.get(&l)?)))
                .collect();
            let res = g.llc.as_mut()?.add_rmb(now, llc::RmbId(rmb), &tokens);
            if res.is_ok() {
                if let Some(x) = g.rmbs.get_mut(&rmb) {
                    x.announced = true;
                }
                g.rkey_waiters.insert(rmb, tcp);
            }
            Some(res)
        });
        match started {
            Some(Ok(())) => {
                self.dirty.insert(lgr);
            }
            other => {
                debug!(?other, "CONFIRM RKEY could not start");
                self.notes
                    .push_back((tcp, Note::Rkey(Err(DeclineCode::ERR_RTOK))));
            }
        }
    }

    /// A finished rendezvous: the connection's entry and [`Output::Rendezvous`].
    fn finish(&mut self, host: &mut dyn Host, tcp: TcpId, r: &Rdv, outcome: Outcome, now: Instant) {
        let outcome = match outcome {
            Outcome::Smc(est) => match self.new_conn(&est, r.bufs.sndbuf) {
                Ok(c) => {
                    self.counters.smc_total += 1;
                    if est.contact.is_first() {
                        self.counters.first_contacts += 1;
                    }
                    info!(
                        lgr = est.lgr.0,
                        token = format_args!("{:#x}", c.token),
                        contact = ?est.contact,
                        version = ?est.version,
                        peer = %r.peer,
                        "SMC-R connection established"
                    );
                    RendezvousOutcome::Smc(Box::new(c))
                }
                Err(e) => {
                    // Local failure after the point of no return: give back what the
                    // rendezvous allocated and reset the TCP connection (RFC 7609 C.1).
                    warn!(peer = %r.peer, error = %e, "cannot set up the connection");
                    self.counters.resets += 1;
                    if let Some(g) = self.lgrs.get_mut(&est.lgr) {
                        let rmb = est.local_rmb.rmb.0;
                        g.release_rmb(host, &self.cfg, rmb, now, false);
                        self.dirty.insert(est.lgr);
                    } else {
                        host.release_token(est.local_rmb.alert_token);
                    }
                    RendezvousOutcome::Reset(clc::ResetReason::LocalFailure(DeclineCode::INTERR))
                }
            },
            Outcome::Fallback(reason) => {
                self.counters.fallbacks += 1;
                info!(peer = %r.peer, %reason, "TCP fallback");
                RendezvousOutcome::Fallback(reason)
            }
            Outcome::Reset(reason) => {
                self.counters.resets += 1;
                info!(peer = %r.peer, %reason, "rendezvous failed, TCP reset");
                RendezvousOutcome::Reset(reason)
            }
            Outcome::SameHost(est) => {
                // No link group, RMB or token of the endpoint's: the runtime owns the
                // shared memory it set up for this nonce, and the connection.
                self.counters.same_host_total += 1;
                info!(peer = %r.peer, peer_stack = format_args!("{:016x}", est.peer_stack),
                    role = ?est.role, "same-host connection established");
                RendezvousOutcome::SameHost(est)
            }
        };
        let moved = match &outcome {
            RendezvousOutcome::Smc(c) if !self.link_active(c.lgr, c.link) => Some((c.lgr, c.token)),
            _ => None,
        };
        self.out.push_back(Output::Rendezvous { tcp, outcome });
        if let Some((lgr, token)) = moved {
            // Its link went down during the rendezvous (after the LinkDown that moved
            // the other connections): it moves, or ends, at once.
            self.fail_over_conn(lgr, token);
        }
    }

    /// The connection's entry in its link group, and what the host needs to create it.
    fn new_conn(
        &mut self,
        est: &clc::SmcEstablished,
        sndbuf: Option<u32>,
    ) -> Result<NewConn, String> {
        let g = self.lgrs.get_mut(&est.lgr).ok_or("link group vanished")?;
        let link = est.link;
        if !g.links.contains_key(&link) {
            return Err(format!("link {link} vanished"));
        }
        let rmb = est.local_rmb.rmb.0;
        if !g.rmbs.contains_key(&rmb) {
            return Err("RMB vanished".into());
        }
        let geo = |len: usize| {
            let len = len as u32;
            if g.eyecatcher {
                RmbeGeometry::rfc(len)
            } else {
                RmbeGeometry::linux(len)
            }
        };
        let local = geo(est.local_rmb.size.bytes()).map_err(|e| e.to_string())?;
        let peer = geo(est.peer_rmb.size.bytes()).map_err(|e| e.to_string())?;
        let token = est.local_rmb.alert_token;
        let params = ConnParams::new(
            local,
            peer,
            // Rounded as the RMB (Linux compresses both sizes, smc_compress_bufsize).
            sndbuf
                .map(|n| BufSize::encode(n as usize, BufSize::LINUX_MAX_CODE).bytes() as u32)
                .unwrap_or(self.cfg.sndbuf_size),
            token,
            est.peer_rmb.alert_token,
        );
        // Element i of the peer's RMB starts at vaddr + (i-1)·size (CHECKLIST AMB-10);
        // peer values, so no arithmetic that can overflow.
        let peer_off = u64::from(est.peer_rmb.rmbe_idx.saturating_sub(1))
            .wrapping_mul(est.peer_rmb.size.bytes() as u64);
        let peer_base = est.peer_rmb.vaddr.wrapping_add(peer_off);
        // The peer's RMB as the llc machine knows it (CLC: first contact; CONFIRM RKEY or
        // ADD LINK: later), to find its RToken on another link in a failover (§4.6).
        let peer_rmb = g
            .llc
            .as_ref()
            .and_then(|l| l.peer_rmb_by_rkey(link, est.peer_rmb.rkey));
        g.conns.insert(token);
        g.peer_rmbes
            .insert((est.peer_rmb.rkey, est.peer_rmb.rmbe_idx), token);
        self.conns.insert(
            token,
            ConnEntry {
                lgr: est.lgr,
                link,
                rmb,
                first_contact: est.contact.is_first(),
                peer_rmb,
                peer_off,
            },
        );
        Ok(NewConn {
            token,
            lgr: est.lgr,
            link,
            rmb: llc::RmbId(rmb),
            params,
            peer_rkey: est.peer_rmb.rkey,
            peer_base,
            version: est.version.wire(),
            contact: est.contact,
        })
    }
}
