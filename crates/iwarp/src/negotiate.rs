//! RFC 6581 §9 as pure functions: what a responder answers to an MPA Request's enhanced data,
//! and what an initiator makes of the Reply. No I/O; the connection manager ([`crate::cm`])
//! applies the outcome. Section numbers and the CHECKLIST rule IDs (IO-*, PP-*, AMB-M*) are
//! cited where each rule is applied.

use crate::wire::ddp::term;
use crate::wire::mpa::{EnhancedData, RtrSet, IRD_ORD_NO_LIMIT};

/// A side's RDMA Read resources and connection-model wishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadParams {
    /// IRD this side offers (inbound RDMA Read Requests it can have in progress), or
    /// [`IRD_ORD_NO_LIMIT`] to leave negotiation to the ULP.
    pub ird: u16,
    /// ORD this side wants (outbound RDMA Reads in flight), or [`IRD_ORD_NO_LIMIT`].
    pub ord: u16,
    /// The largest IRD this side can be pushed to (device limit).
    pub max_ird: u16,
    /// Responder only: the ORD the ULP needs at least; a Request whose initiator IRD is
    /// smaller is rejected with this value in the Reply's ORD (RFC 6581 §9.1, IO-8).
    pub required_ord: u16,
}

impl Default for ReadParams {
    fn default() -> Self {
        ReadParams {
            ird: 16,
            ord: 16,
            max_ird: 128,
            required_ord: 0,
        }
    }
}

/// The responder's answer to an enhanced Request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponderDecision {
    /// Accept: send `reply` (R = 0) and use `ird`/`ord` locally. With `p2p`, wait for one
    /// of `reply.rtr` before transmitting anything (MPA fencing, RFC 6581 §3, RT-3).
    Accept {
        /// Enhanced data of the Reply.
        reply: EnhancedData,
        /// Local IRD.
        ird: u16,
        /// Local ORD.
        ord: u16,
        /// Peer-to-peer: an RTR is due from the initiator.
        p2p: bool,
    },
    /// Reject (R = 1) with `reply`, whose ORD is the ULP's required ORD (IO-8, AMB-M1),
    /// then close.
    Reject {
        /// Enhanced data of the Reply.
        reply: EnhancedData,
    },
}

/// Responder side of §9.1/§9.2. `local.ird`/`local.ord` are the responder's values when the
/// peer asks for "no limit"; `supported` are the RTR options this side accepts (at least
/// one, PP-3).
pub fn responder(req: &EnhancedData, local: &ReadParams, supported: RtrSet) -> ResponderDecision {
    // IO-11: an initiator IRD of 0x3FFF leaves the responder's ORD unchanged and is echoed
    // as ORD 0x3FFF; an initiator ORD of 0x3FFF leaves its IRD unchanged, echoed as IRD.
    let (ord, reply_ord) = if req.ird == IRD_ORD_NO_LIMIT {
        (local.ord, IRD_ORD_NO_LIMIT)
    } else {
        // IO-8: the ULP needs more outbound reads than the initiator can take: reject,
        // telling it the ORD that would be needed.
        if local.required_ord > req.ird && local.required_ord != IRD_ORD_NO_LIMIT {
            return ResponderDecision::Reject {
                reply: EnhancedData {
                    p2p: req.p2p,
                    rtr: if req.p2p { supported } else { RtrSet::NONE },
                    ird: local.ird.min(IRD_ORD_NO_LIMIT - 1),
                    ord: local.required_ord,
                },
            };
        }
        // IO-6: "The responder MUST set its ORD at most to the initiator IRD."
        let o = local.ord.min(req.ird);
        (o, o)
    };
    // PP-4/PP-5: echo A; choose the RTR options.
    let (p2p, rtr) = if req.p2p {
        let common = req.rtr.intersect(&supported);
        // AMB-M7: always at least one option; if none of the initiator's is supported,
        // offer what we support (the initiator then fails with TERM 7, PP-6).
        (true, if common.is_empty() { supported } else { common })
    } else {
        // PP-7: A = 0 -> B, C, D are 0 (and were ignored on receipt).
        (false, RtrSet::NONE)
    };
    let (ird, reply_ird) = if req.ord == IRD_ORD_NO_LIMIT {
        (local.ird, IRD_ORD_NO_LIMIT)
    } else {
        // IO-3: responder IRD >= initiator ORD when it can (up to the device limit; less
        // means the initiator lowers its ORD, IO-9).
        let mut i = req.ord.min(local.max_ird);
        // IO-7: a Read RTR needs one inbound read at the responder.
        if p2p && rtr.read && !rtr.write && !rtr.send && i == 0 {
            i = 1;
        }
        (i, i)
    };
    ResponderDecision::Accept {
        reply: EnhancedData {
            p2p,
            rtr,
            ird: reply_ird,
            ord: reply_ord,
        },
        ird,
        ord,
        p2p,
    }
}

/// The RTR message an initiator sends (RFC 6581 §9.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rtr {
    /// Zero-length Send (consumed by the responding provider, AMB-M5).
    Send,
    /// Zero-length RDMA Write (STag 0, TO 0: not validated, AMB-M4).
    Write,
    /// Zero-length RDMA Read.
    Read,
}

impl std::fmt::Display for Rtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Rtr::Send => "send",
            Rtr::Write => "write",
            Rtr::Read => "read",
        })
    }
}

/// What the initiator does with an accepting enhanced Reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitiatorDecision {
    /// Use `ird`/`ord`; with `rtr`, send that RTR as the first FPDU.
    Proceed {
        /// Local IRD (≥ responder ORD).
        ird: u16,
        /// Local ORD (≤ responder IRD).
        ord: u16,
        /// The RTR to send (peer-to-peer).
        rtr: Option<Rtr>,
    },
    /// Send TERM (Layer 2, Type 0, `code`) and close: 6 = insufficient IRD (IO-9),
    /// 7 = no matching RTR (PP-6).
    Terminate {
        /// MPA error code.
        code: u8,
    },
}

/// Initiator side of §9.1/§9.2 for an accepting Reply. `sent` is what the Request carried,
/// `local.max_ird` the IRD this side can grow to; `can` the RTRs this side can generate.
pub fn initiator(
    sent: &EnhancedData,
    reply: &EnhancedData,
    local: &ReadParams,
    can: RtrSet,
) -> InitiatorDecision {
    // IO-9 / IO-11: IRD at least the responder ORD (unless 0x3FFF: unchanged).
    let ird = if reply.ord == IRD_ORD_NO_LIMIT {
        local.ird
    } else if reply.ord > local.max_ird {
        return InitiatorDecision::Terminate {
            code: term::MPA_INSUFFICIENT_IRD,
        };
    } else {
        local.ird.max(reply.ord)
    };
    // ORD at most the responder IRD (unless 0x3FFF: unchanged).
    let ord = if reply.ird == IRD_ORD_NO_LIMIT {
        local.ord
    } else {
        local.ord.min(reply.ird)
    };
    let rtr = if sent.p2p {
        // PP-4: the responder must echo A = 1.
        if !reply.p2p {
            return InitiatorDecision::Terminate {
                code: term::MPA_NO_MATCHING_RTR,
            };
        }
        // PP-6/PP-8: one of the options both allow, initiator's choice. Write first (no
        // receive consumed, no read resources), as siw prefers; then Read, then Send.
        let both = reply.rtr.intersect(&can).intersect(&sent.rtr);
        if both.write {
            Some(Rtr::Write)
        } else if both.read {
            Some(Rtr::Read)
        } else if both.send {
            Some(Rtr::Send)
        } else {
            return InitiatorDecision::Terminate {
                code: term::MPA_NO_MATCHING_RTR,
            };
        }
    } else {
        None
    };
    InitiatorDecision::Proceed { ird, ord, rtr }
}

#[cfg(test)]
mod tests {
    //! The RFC 6581 §9 MUST/SHOULD rules, named after CHECKLIST E (TC-MPA-*).
    use super::*;

    fn req(p2p: bool, rtr: RtrSet, ird: u16, ord: u16) -> EnhancedData {
        EnhancedData { p2p, rtr, ird, ord }
    }
    const W: RtrSet = RtrSet {
        send: false,
        write: true,
        read: false,
    };
    const R: RtrSet = RtrSet {
        send: false,
        write: false,
        read: true,
    };
    const S: RtrSet = RtrSet {
        send: true,
        write: false,
        read: false,
    };

    fn accept(d: ResponderDecision) -> (EnhancedData, u16, u16, bool) {
        match d {
            ResponderDecision::Accept {
                reply,
                ird,
                ord,
                p2p,
            } => (reply, ird, ord, p2p),
            other => panic!("expected accept, got {other:?}"),
        }
    }

    #[test]
    fn tc_mpa_02_responder_ird_ord_relations() {
        let local = ReadParams {
            ird: 4,
            ord: 8,
            max_ird: 32,
            required_ord: 0,
        };
        for (i_ird, i_ord) in [(0, 0), (1, 1), (3, 20), (16, 2), (100, 100)] {
            let (reply, ird, ord, _) = accept(responder(
                &req(false, RtrSet::NONE, i_ird, i_ord),
                &local,
                RtrSet::ALL,
            ));
            // responder ORD <= initiator IRD (MUST, IO-6)
            assert!(reply.ord <= i_ird && ord == reply.ord);
            // responder IRD >= initiator ORD unless capped by the device limit
            assert!(reply.ird >= i_ord.min(local.max_ird) && ird == reply.ird);
        }
    }

    #[test]
    fn tc_mpa_03_initiator_adjusts() {
        let local = ReadParams {
            ird: 2,
            ord: 8,
            max_ird: 16,
            required_ord: 0,
        };
        let sent = req(false, RtrSet::NONE, 2, 8);
        match initiator(&sent, &req(false, RtrSet::NONE, 4, 6), &local, RtrSet::ALL) {
            InitiatorDecision::Proceed { ird, ord, rtr } => {
                assert!(ird >= 6, "IRD at least the responder ORD");
                assert!(ord <= 4, "ORD at most the responder IRD");
                assert_eq!(rtr, None);
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn tc_mpa_04_initiator_insufficient_ird_term6() {
        let local = ReadParams {
            ird: 2,
            ord: 2,
            max_ird: 4,
            required_ord: 0,
        };
        let sent = req(false, RtrSet::NONE, 2, 2);
        assert_eq!(
            initiator(&sent, &req(false, RtrSet::NONE, 2, 9), &local, RtrSet::ALL),
            InitiatorDecision::Terminate { code: 6 }
        );
    }

    #[test]
    fn tc_mpa_05_ird_ord_3fff() {
        let local = ReadParams {
            ird: 5,
            ord: 7,
            max_ird: 32,
            required_ord: 0,
        };
        let n = IRD_ORD_NO_LIMIT;
        // initiator ORD 0x3FFF: responder IRD unchanged, replied as 0x3FFF
        let (reply, ird, ord, _) = accept(responder(
            &req(false, RtrSet::NONE, 3, n),
            &local,
            RtrSet::ALL,
        ));
        assert_eq!((reply.ird, ird), (n, 5));
        assert_eq!((reply.ord, ord), (3, 3));
        // initiator IRD 0x3FFF: responder ORD unchanged, replied as 0x3FFF (AMB-M8:
        // each field on its own)
        let (reply, ird, ord, _) = accept(responder(
            &req(false, RtrSet::NONE, n, 2),
            &local,
            RtrSet::ALL,
        ));
        assert_eq!((reply.ord, ord), (n, 7));
        assert_eq!((reply.ird, ird), (2, 2));
        // initiator: responder IRD/ORD 0x3FFF leave local ORD/IRD unchanged
        let sent = req(false, RtrSet::NONE, 5, 7);
        assert_eq!(
            initiator(&sent, &req(false, RtrSet::NONE, n, n), &local, RtrSet::ALL),
            InitiatorDecision::Proceed {
                ird: 5,
                ord: 7,
                rtr: None
            }
        );
    }

    #[test]
    fn tc_mpa_06_07_09_p2p_rtr_choice() {
        let local = ReadParams::default();
        // B only -> Send RTR
        let sent = req(true, S, 1, 1);
        let (reply, ..) = accept(responder(&sent, &local, RtrSet::ALL));
        assert_eq!(reply.rtr, S);
        assert!(matches!(
            initiator(&sent, &reply, &local, RtrSet::ALL),
            InitiatorDecision::Proceed {
                rtr: Some(Rtr::Send),
                ..
            }
        ));
        // C only -> Write RTR
        let sent = req(true, W, 1, 1);
        let (reply, ..) = accept(responder(&sent, &local, RtrSet::ALL));
        assert_eq!(reply.rtr, W);
        assert!(matches!(
            initiator(&sent, &reply, &local, RtrSet::ALL),
            InitiatorDecision::Proceed {
                rtr: Some(Rtr::Write),
                ..
            }
        ));
        // B+C+D offered and supported: the responder lists what it supports of them, the
        // initiator picks one (PP-8)
        let sent = req(true, RtrSet::ALL, 1, 1);
        let (reply, ..) = accept(responder(&sent, &local, RtrSet::ALL));
        assert_eq!(reply.rtr, RtrSet::ALL);
        assert!(matches!(
            initiator(&sent, &reply, &local, RtrSet::ALL),
            InitiatorDecision::Proceed { rtr: Some(_), .. }
        ));
    }

    #[test]
    fn tc_mpa_08_p2p_read_rtr_ird_bump() {
        let local = ReadParams::default();
        let (reply, ird, ..) = accept(responder(&req(true, R, 1, 0), &local, RtrSet::ALL));
        assert_eq!(reply.rtr, R);
        assert_eq!((reply.ird, ird), (1, 1), "IO-7: responder IRD raised to 1");
    }

    #[test]
    fn tc_mpa_10_no_matching_rtr_term7() {
        // The responder supports only Read; the initiator can only do Write.
        let local = ReadParams::default();
        let sent = req(true, W, 1, 1);
        let (reply, ..) = accept(responder(&sent, &local, R));
        assert_eq!(reply.rtr, R, "AMB-M7: at least one supported option");
        assert_eq!(
            initiator(&sent, &reply, &local, W),
            InitiatorDecision::Terminate { code: 7 }
        );
        // A = 1 requested but the reply drops A (PP-4 violated) -> TERM 7 too
        assert_eq!(
            initiator(&sent, &req(false, RtrSet::NONE, 1, 1), &local, W),
            InitiatorDecision::Terminate { code: 7 }
        );
    }

    #[test]
    fn tc_mpa_11_a0_flags_ignored_and_zero() {
        let local = ReadParams::default();
        let (reply, _, _, p2p) = accept(responder(
            &req(false, RtrSet::ALL, 1, 1),
            &local,
            RtrSet::ALL,
        ));
        assert!(!p2p && !reply.p2p && reply.rtr.is_empty());
        assert!(req(false, RtrSet::ALL, 1, 1).effective_rtr().is_empty());
        // and on the wire B/C/D are 0 with A = 0
        let mut b = [0u8; 4];
        req(false, RtrSet::ALL, 1, 1).emit(&mut b).unwrap();
        assert_eq!(b, [0, 1, 0, 1]);
    }

    #[test]
    fn tc_mpa_12_responder_echoes_a1() {
        let (reply, _, _, p2p) = accept(responder(
            &req(true, W, 1, 1),
            &ReadParams::default(),
            RtrSet::ALL,
        ));
        assert!(reply.p2p && p2p);
    }

    #[test]
    fn tc_mpa_23_reject_carries_required_ord() {
        let local = ReadParams {
            required_ord: 8,
            ..ReadParams::default()
        };
        match responder(&req(false, RtrSet::NONE, 2, 1), &local, RtrSet::ALL) {
            ResponderDecision::Reject { reply } => assert_eq!(reply.ord, 8),
            d => panic!("{d:?}"),
        }
    }
}
