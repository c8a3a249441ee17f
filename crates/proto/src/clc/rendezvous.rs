//! [`Rendezvous`]: one CLC rendezvous, client or server side. What both sides do the
//! same way (reading framed CLC messages, the TCP connection's end, timers and outputs)
//! is here once; the side decides what it expects and what a message means
//! (`client.rs`, `server.rs`).

use std::time::Instant;

use smc_wire::decline::DeclineCode;

use super::client::Client;
use super::config::ClcConfig;
use super::core::Core;
use super::env::{ClcEnv, ClientRoute, ServerRoute};
use super::{Eligibility, LinkEvent, Outcome, Output, ResetReason, Role};

enum Side {
    Client(Box<Client>),
    Server(Box<super::server::Server>),
}

/// One rendezvous on one TCP connection. See the [module docs](super) for how it is
/// driven.
pub struct Rendezvous {
    side: Side,
}

impl Rendezvous {
    /// Client: starts after the TCP handshake completed.
    ///
    /// Not eligible: ends at once in a fallback, nothing is sent. Nothing to offer on
    /// this route (no device, or v2 without a UEID and v1 off): a Decline in place of the
    /// Proposal, then fallback (Linux `smc_find_proposal_devices` → NOSMCDEV). Otherwise
    /// the Proposal goes out and the Accept is awaited.
    pub fn client(
        now: Instant,
        cfg: &ClcConfig,
        route: ClientRoute,
        eligibility: Eligibility,
    ) -> Rendezvous {
        Rendezvous {
            side: Side::Client(Box::new(Client::new(now, cfg, route, eligibility))),
        }
    }

    /// Server: starts on an accepted TCP connection. Not eligible: ends at once in a
    /// fallback (no CLC is expected). Otherwise waits for the Proposal.
    pub fn server(
        now: Instant,
        cfg: &ClcConfig,
        route: ServerRoute,
        eligibility: Eligibility,
    ) -> Rendezvous {
        Rendezvous {
            side: Side::Server(Box::new(super::server::Server::new(
                now,
                cfg,
                route,
                eligibility,
            ))),
        }
    }

    /// Which side this is.
    pub fn role(&self) -> Role {
        match self.side {
            Side::Client(_) => Role::Client,
            Side::Server(_) => Role::Server,
        }
    }

    fn core(&self) -> &Core {
        match &self.side {
            Side::Client(c) => &c.core,
            Side::Server(s) => &s.core,
        }
    }

    fn core_mut(&mut self) -> &mut Core {
        match &mut self.side {
            Side::Client(c) => &mut c.core,
            Side::Server(s) => &mut s.core,
        }
    }

    /// The next thing for the runtime to do.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.core_mut().poll_output()
    }

    /// When [`Self::on_timeout`] must be called, if a wait is running.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.core().deadline
    }

    /// How the rendezvous ended, once it has.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.core().done.as_ref()
    }

    /// True once [`Output::Done`] was produced.
    pub fn is_done(&self) -> bool {
        self.core().is_done()
    }

    /// How many bytes to read from the TCP socket and pass to
    /// [`Self::handle_tcp_bytes`] now; 0 while no CLC message is expected (leave the
    /// bytes in the socket: after a Decline they are the application's).
    pub fn bytes_wanted(&self) -> usize {
        let expected = match &self.side {
            Side::Client(c) => c.expected(),
            Side::Server(s) => s.expected(),
        };
        match expected {
            Some(_) => self.core().reader_wanted(),
            None => 0,
        }
    }

    /// Bytes read from the TCP socket. Returns how many were taken (the rest is not
    /// CLC: application data after a fallback, or nothing the machine expects yet).
    pub fn handle_tcp_bytes<E: ClcEnv + ?Sized>(
        &mut self,
        now: Instant,
        bytes: &[u8],
        env: &mut E,
    ) -> usize {
        let mut used = 0;
        while used < bytes.len() {
            let expected = match &self.side {
                Side::Client(c) => c.expected(),
                Side::Server(s) => s.expected(),
            };
            let Some(expected) = expected else { break };
            let (n, inc) = self.core_mut().read(&bytes[used..], expected);
            used += n;
            if let Some(inc) = inc {
                match &mut self.side {
                    Side::Client(c) => c.incoming(now, inc, env),
                    Side::Server(s) => s.incoming(now, inc, env),
                }
            }
            if n == 0 {
                break;
            }
        }
        used
    }

    /// The TCP connection failed (an error or RST): the rendezvous ends in a reset.
    pub fn handle_tcp_closed<E: ClcEnv + ?Sized>(&mut self, _now: Instant, env: &mut E) {
        if !self.is_done() {
            self.core_mut().reset(ResetReason::TcpClosed, env);
            self.set_done();
        }
    }

    /// The peer's TCP FIN (EOF): no error during the first contact's link wait (see
    /// `Core::peer_fin`); a reset anywhere else. Nothing more is read afterwards.
    pub fn handle_tcp_fin<E: ClcEnv + ?Sized>(&mut self, _now: Instant, env: &mut E) {
        let link_wait = match &self.side {
            Side::Client(c) => c.in_link_wait(),
            Side::Server(s) => s.in_link_wait(),
        };
        self.core_mut().peer_fin(link_wait, env);
        if self.is_done() {
            self.set_done();
        }
    }

    fn set_done(&mut self) {
        match &mut self.side {
            Side::Client(c) => c.set_done(),
            Side::Server(s) => s.set_done(),
        }
    }

    /// Server: the outcome of the same-host exchange the environment ran elsewhere
    /// ([`super::ServerSameHost::Later`]): `Some(our stack id)` when the offer is taken.
    /// Ignored by a client, and once the server no longer waits.
    pub fn handle_same_host<E: ClcEnv + ?Sized>(
        &mut self,
        now: Instant,
        taken: Option<u64>,
        env: &mut E,
    ) {
        if let Side::Server(s) = &mut self.side {
            s.handle_same_host(now, taken, env);
        }
    }

    /// The CONFIRM RKEY asked for with [`Output::ConfirmRkey`] finished.
    pub fn handle_rkey_confirmed<E: ClcEnv + ?Sized>(
        &mut self,
        now: Instant,
        result: Result<(), DeclineCode>,
        env: &mut E,
    ) {
        match &mut self.side {
            Side::Client(c) => c.handle_rkey_confirmed(now, result, env),
            Side::Server(s) => s.handle_rkey_confirmed(now, result, env),
        }
    }

    /// Progress of the first link (first contact only).
    pub fn handle_link_event<E: ClcEnv + ?Sized>(
        &mut self,
        now: Instant,
        ev: LinkEvent,
        env: &mut E,
    ) {
        match &mut self.side {
            Side::Client(c) => c.handle_link_event(now, ev, env),
            Side::Server(s) => s.handle_link_event(now, ev, env),
        }
    }

    /// The timer from [`Self::poll_timeout`] fired (or any later time).
    pub fn on_timeout<E: ClcEnv + ?Sized>(&mut self, now: Instant, env: &mut E) {
        match &mut self.side {
            Side::Client(c) => c.on_timeout(now, env),
            Side::Server(s) => s.on_timeout(now, env),
        }
    }
}
