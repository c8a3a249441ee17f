//! The per-socket record shared with the sock_ops program, and what it means.
//!
//! The layout mirrors `struct smc_sk_state` in `bpf/smc_option.bpf.c`; the
//! bit values below must stay equal to the `SMC_REQ_*` / `SMC_ST_*` macros
//! there. Decoding is pure so that it can be tested without a kernel.

use crate::option::{NotAnnounced, Outcome};

/// Size of the map value in bytes (`struct smc_sk_state`).
pub const VALUE_SIZE: usize = 16;

/// `request` bit: announce SMC-R in this socket's SYN / SYN-ACK.
pub const REQ_ANNOUNCE: u32 = 1 << 0;

/// `status` bit: the program saw connect() of the marked socket.
pub const ST_ARMED_ACTIVE: u32 = 1 << 0;
/// `status` bit: the program saw listen() of the marked socket (inherited by
/// accepted sockets).
pub const ST_ARMED_LISTEN: u32 = 1 << 1;
/// `status` bit: our SYN (client) / SYN-ACK (server) carried the option.
pub const ST_SENT: u32 = 1 << 2;
/// `status` bit: the peer's SYN-ACK (client) / SYN (server) carried it.
pub const ST_PEER: u32 = 1 << 3;
/// `status` bit: no TCP option space was left for the option.
pub const ST_NOSPACE: u32 = 1 << 4;
/// `status` bit: accepted from a SYN cookie (the SYN-ACK echoed nothing).
pub const ST_COOKIE: u32 = 1 << 5;
/// `status` bit: the 3-way handshake completed; the other bits are final.
pub const ST_DONE: u32 = 1 << 6;
/// `status` bit: this is an accepted (passive) socket.
pub const ST_PASSIVE: u32 = 1 << 7;
/// `status` bit: a BPF helper failed; `error` holds its return value.
pub const ST_ERROR: u32 = 1 << 8;

/// The map value: `request` is written by userspace, the rest by the program.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkState {
    /// `REQ_*` bits.
    pub request: u32,
    /// `ST_*` bits.
    pub status: u32,
    /// First negative BPF helper return value (a negated errno), or 0.
    pub error: i32,
}

impl SkState {
    /// The value userspace stores to mark a socket.
    pub fn marked() -> Self {
        SkState {
            request: REQ_ANNOUNCE,
            status: 0,
            error: 0,
        }
    }

    /// Native-endian bytes, as the map stores them.
    pub fn to_bytes(self) -> [u8; VALUE_SIZE] {
        let mut b = [0u8; VALUE_SIZE];
        b[0..4].copy_from_slice(&self.request.to_ne_bytes());
        b[4..8].copy_from_slice(&self.status.to_ne_bytes());
        b[8..12].copy_from_slice(&self.error.to_ne_bytes());
        b
    }

    /// Parses a map value; `None` when it is not [`VALUE_SIZE`] bytes long.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() != VALUE_SIZE {
            return None;
        }
        let word = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        Some(SkState {
            request: u32::from_ne_bytes(word(0)),
            status: u32::from_ne_bytes(word(4)),
            error: i32::from_ne_bytes(word(8)),
        })
    }

    fn has(self, bit: u32) -> bool {
        self.status & bit != 0
    }

    /// What this record says about the connection, per RFC 7609 §3.5.1.1:
    /// SMC-R may be used only when both SYN and SYN-ACK carried the option.
    pub fn outcome(self) -> Outcome {
        let local = |why| Outcome::LocalNotAnnounced { why };
        if self.request & REQ_ANNOUNCE == 0 {
            return local(NotAnnounced::NotMarked);
        }
        let armed = self.has(ST_ARMED_ACTIVE) || self.has(ST_ARMED_LISTEN);
        if !armed {
            return local(NotAnnounced::NotArmed);
        }
        if !self.has(ST_DONE) {
            return local(NotAnnounced::HandshakeNotSeen);
        }
        let helper_error = || local(NotAnnounced::HelperError(self.error));
        if self.has(ST_PASSIVE) {
            // Server: the SYN told us whether the client announced; we
            // echoed exactly when it did, unless a cookie or a full header
            // prevented it.
            if self.has(ST_COOKIE) {
                return local(NotAnnounced::SynCookie);
            }
            if !self.has(ST_PEER) {
                return if self.has(ST_ERROR) {
                    helper_error()
                } else {
                    Outcome::PeerDidNotAnnounce
                };
            }
            if self.has(ST_NOSPACE) {
                return local(NotAnnounced::NoOptionSpace);
            }
            if self.has(ST_SENT) {
                return Outcome::BothAnnounced;
            }
            return helper_error();
        }
        // Client: our SYN first, then the peer's SYN-ACK.
        if !self.has(ST_SENT) {
            return if self.has(ST_NOSPACE) {
                local(NotAnnounced::NoOptionSpace)
            } else if self.has(ST_ERROR) {
                helper_error()
            } else {
                local(NotAnnounced::NotWritten)
            };
        }
        if self.has(ST_PEER) {
            Outcome::BothAnnounced
        } else {
            Outcome::PeerDidNotAnnounce
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn st(status: u32) -> SkState {
        SkState {
            request: REQ_ANNOUNCE,
            status,
            error: 0,
        }
    }

    #[test]
    fn bytes_round_trip() {
        let s = SkState {
            request: 1,
            status: 0x1ff,
            error: -28,
        };
        assert_eq!(SkState::from_bytes(&s.to_bytes()), Some(s));
        assert_eq!(SkState::from_bytes(&[0; 15]), None);
    }

    #[test]
    fn client_outcomes() {
        let base = ST_ARMED_ACTIVE | ST_DONE;
        assert_eq!(
            st(base | ST_SENT | ST_PEER).outcome(),
            Outcome::BothAnnounced
        );
        assert_eq!(st(base | ST_SENT).outcome(), Outcome::PeerDidNotAnnounce);
        assert_eq!(
            st(base | ST_NOSPACE | ST_PEER).outcome(),
            Outcome::LocalNotAnnounced {
                why: NotAnnounced::NoOptionSpace
            }
        );
        assert_eq!(
            st(base).outcome(),
            Outcome::LocalNotAnnounced {
                why: NotAnnounced::NotWritten
            }
        );
        assert_eq!(
            st(ST_ARMED_ACTIVE | ST_SENT).outcome(),
            Outcome::LocalNotAnnounced {
                why: NotAnnounced::HandshakeNotSeen
            }
        );
    }

    #[test]
    fn server_outcomes() {
        let base = ST_ARMED_LISTEN | ST_DONE | ST_PASSIVE;
        assert_eq!(
            st(base | ST_SENT | ST_PEER).outcome(),
            Outcome::BothAnnounced
        );
        assert_eq!(st(base).outcome(), Outcome::PeerDidNotAnnounce);
        assert_eq!(
            st(base | ST_COOKIE).outcome(),
            Outcome::LocalNotAnnounced {
                why: NotAnnounced::SynCookie
            }
        );
        assert_eq!(
            st(base | ST_PEER | ST_NOSPACE).outcome(),
            Outcome::LocalNotAnnounced {
                why: NotAnnounced::NoOptionSpace
            }
        );
        // Marked after listen(): the program never armed the listener.
        assert_eq!(
            st(ST_DONE | ST_PASSIVE).outcome(),
            Outcome::LocalNotAnnounced {
                why: NotAnnounced::NotArmed
            }
        );
    }

    #[test]
    fn unmarked_is_never_announced() {
        let s = SkState {
            request: 0,
            status: ST_ARMED_ACTIVE | ST_DONE | ST_SENT | ST_PEER,
            error: 0,
        };
        assert_eq!(
            s.outcome(),
            Outcome::LocalNotAnnounced {
                why: NotAnnounced::NotMarked
            }
        );
    }

    proptest! {
        /// RFC 7609 §3.5.1.1: BothAnnounced only when the record shows that
        /// both our option went out and the peer's came in, after the
        /// handshake, without a cookie or a lack of space.
        #[test]
        fn both_only_with_both_bits(request in any::<u32>(), status in any::<u32>(), error in any::<i32>()) {
            let s = SkState { request, status, error };
            if s.outcome() == Outcome::BothAnnounced {
                prop_assert!(request & REQ_ANNOUNCE != 0);
                prop_assert!(status & ST_SENT != 0 && status & ST_PEER != 0 && status & ST_DONE != 0);
                prop_assert!(status & (ST_ARMED_ACTIVE | ST_ARMED_LISTEN) != 0);
                if status & ST_PASSIVE != 0 {
                    prop_assert!(status & (ST_COOKIE | ST_NOSPACE) == 0);
                }
            }
        }

        #[test]
        fn from_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Some(s) = SkState::from_bytes(&b) {
                let _ = s.outcome().to_string();
            }
        }
    }
}
