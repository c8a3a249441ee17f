//! Deterministic tests of the connection machine. Test functions carry the CHECKLIST
//! conformance IDs (§E.9 CDC/FLOW, §E.10 URG, §E.11 RMBE, §E.13 FO, §E.14 TERM/ABRT).

mod failover;
mod flow;
mod hostile;
mod place;
mod random;
mod scenarios;
mod term;
mod urg;

use super::sim::{HostConfig, Side, Sim, TraceItem};
use super::*;

/// The two RMBE layouts every golden trace runs on: RFC 7609's (eye catcher, the
/// figures' "receive buffer size 10,000": cursors 4..9999) and Linux's (no eye catcher,
/// same capacity 9,996: cursors 0..9995).
#[derive(Clone, Copy, Debug)]
pub(super) struct Variant {
    pub geom: RmbeGeometry,
    pub policy: UpdatePolicy,
}

impl Variant {
    pub fn all() -> [Variant; 4] {
        let rfc = RmbeGeometry::rfc(10_000).unwrap();
        let linux = RmbeGeometry::linux(9_996).unwrap();
        [
            Variant {
                geom: rfc,
                policy: UpdatePolicy::Rfc,
            },
            Variant {
                geom: linux,
                policy: UpdatePolicy::Rfc,
            },
            Variant {
                geom: rfc,
                policy: UpdatePolicy::linux(),
            },
            Variant {
                geom: linux,
                policy: UpdatePolicy::linux(),
            },
        ]
    }

    /// An offset as printed in the RFC figures (which start data at 4), in this layout.
    pub fn off(&self, rfc: u32) -> u32 {
        rfc - 4 + self.geom.data_off()
    }

    pub fn cursor(&self, wrap: u16, rfc: u32) -> Cursor {
        Cursor::new(wrap, self.off(rfc))
    }

    pub fn host(&self, sndbuf: u32) -> HostConfig {
        let mut h = HostConfig::new(self.geom, sndbuf);
        h.conn.update_policy = self.policy;
        h
    }

    /// Both data directions start at `(wrap, rfc)`.
    pub fn sim_at(&self, sndbuf: u32, wrap: u16, rfc: u32) -> Sim {
        let mut a = self.host(sndbuf);
        let mut b = self.host(sndbuf);
        a.rx_start = Some(self.cursor(wrap, rfc));
        b.rx_start = Some(self.cursor(wrap, rfc));
        Sim::new(a, b)
    }

    pub fn sim(&self, sndbuf: u32) -> Sim {
        self.sim_at(sndbuf, 0, 4)
    }
}

/// Expected content of one posted CDC.
pub(super) struct Expect {
    pub from: Side,
    /// (src_off, len, dst_off)
    pub writes: Vec<(u32, u32, u32)>,
    pub seq: u16,
    pub prod: Cursor,
    pub cons: Cursor,
    pub pf: ProducerFlags,
    pub cf: ConnStateFlags,
}

#[track_caller]
pub(super) fn check(item: &TraceItem, e: Expect) {
    let writes: Vec<(u32, u32, u32)> = item
        .writes
        .iter()
        .map(|w| (w.src_off, w.len, w.dst_off))
        .collect();
    assert_eq!(item.from, e.from, "sender of {item:?}");
    assert_eq!(writes, e.writes, "writes of {item:?}");
    assert_eq!(item.cdc.seqno, e.seq, "seq of {item:?}");
    assert_eq!(item.cdc.prod, e.prod, "producer cursor of {item:?}");
    assert_eq!(item.cdc.cons, e.cons, "consumer cursor of {item:?}");
    assert_eq!(item.cdc.prod_flags, e.pf, "producer flags of {item:?}");
    assert_eq!(item.cdc.conn_flags, e.cf, "connection flags of {item:?}");
}

/// Post, deliver and process one direction's pending CDCs (no completions, no reads).
pub(super) fn send_and_receive(sim: &mut Sim, from: Side) -> Vec<TraceItem> {
    sim.post(from);
    while sim.deliver(from) {}
    while sim.process(from.peer()).is_some() {}
    sim.take_trace()
}

/// Let both applications read everything and the link carry everything until idle.
pub(super) fn settle(sim: &mut Sim) {
    for _ in 0..100_000 {
        sim.flush();
        let n = sim.read_all(Side::A) + sim.read_all(Side::B);
        sim.flush();
        if n == 0 && sim.in_flight(Side::A) == 0 && sim.in_flight(Side::B) == 0 {
            return;
        }
    }
    panic!("simulation did not settle");
}

pub(super) fn pf_none() -> ProducerFlags {
    ProducerFlags::empty()
}

pub(super) fn cf_none() -> ConnStateFlags {
    ConnStateFlags::empty()
}
