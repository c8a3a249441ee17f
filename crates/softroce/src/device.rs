//! What a device's QPs and CQs share: its attributes, UDP socket and
//! ports, memory-region key table, counters, clock, and the doorbell of its
//! engine thread (timers to publish, CQ handlers to hand over). The engine
//! itself (QPN table, receive path, the thread) sits above, in
//! [`crate::engine`]; nothing here knows QPs, so the QPs can hold it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use smc_verbs::{DeviceAttr, EventFd};
use socket2::Socket;

use crate::config::Config;
use crate::cq::{CqShared, HandlerRunner};
use crate::mr::MrTable;
use crate::thread::on_engine_thread;

/// Device counters.
#[derive(Default, Debug)]
pub struct Stats {
    /// Packets sent (after fault injection).
    pub tx_packets: AtomicU64,
    /// Packets received and handed to their QP (from its peer).
    pub rx_packets: AtomicU64,
    /// Packets dropped because they did not parse.
    pub rx_malformed: AtomicU64,
    /// Packets dropped because their ICRC did not verify (CHECKLIST §C.2).
    pub rx_bad_icrc: AtomicU64,
    /// Packets whose ICRC verified only with a non-zero IPv4 ID recovered
    /// from the CRC (e.g. from Linux rxe).
    pub rx_icrc_id_recovered: AtomicU64,
    /// Packets for unknown QPs.
    pub rx_unknown_qp: AtomicU64,
    /// Packets for a QP from an address other than its connected peer's
    /// (or for a QP not connected yet): forged or stray, dropped unprocessed
    /// (a RoCEv2 source GID is the source address; the source port is free).
    pub rx_foreign: AtomicU64,
    /// Packets the fault injector dropped.
    pub fault_dropped: AtomicU64,
    /// sendmmsg failures (packets lost locally).
    pub tx_errors: AtomicU64,
    /// Packets received by application threads waiting in `Cq::wait`
    /// (the rest the engine thread received).
    pub rx_by_waiters: AtomicU64,
    /// Times the engine received with buffers of its own because the thread
    /// holding the receive path had not got on for a lease while packets
    /// waited (stuck in a completion handler or a page fault).
    pub rx_engine_takeovers: AtomicU64,
    /// QPs that could not get a socket (and UDP source port) of their own
    /// and send from the device's socket instead.
    pub qp_socket_errors: AtomicU64,
}

/// The device state QPs and CQs use (see the module documentation).
pub(crate) struct DevShared {
    pub(crate) attr: DeviceAttr,
    pub(crate) config: Config,
    pub(crate) local_port: u16,
    pub(crate) peer_port: u16,
    pub(crate) sock: Socket,
    pub(crate) mrs: MrTable,
    /// Send runs of equal-sized packets with UDP GSO (IPv4 only); turned
    /// off for good if the kernel refuses a GSO send ([`crate::tx`]).
    pub(crate) gso_tx: AtomicBool,
    /// The socket has UDP GRO on: a datagram may hold a train of packets.
    pub(crate) gro: bool,
    pub(crate) epoch: Instant,
    /// When the engine will next wake by itself (ns since epoch).
    pub(crate) engine_wake_ns: AtomicU64,
    pub(crate) wake_fd: EventFd,
    /// CQs whose handlers the engine must run (see [`HandlerRunner`]).
    pub(crate) deferred: Mutex<Vec<Arc<CqShared>>>,
    pub(crate) stats: Stats,
}

impl DevShared {
    pub(crate) fn ns_since_epoch(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Wakes the engine thread.
    pub(crate) fn wake(&self) {
        self.wake_fd.wake();
    }

    /// Wakes the engine if a new timer deadline (or work) needs it before
    /// its own planned wake-up. Called after every QP operation, so it must
    /// rarely cost a wake-up: a timer may fire up to its own duration late
    /// (IBA timers are minimums), which spares the engine one wake-up per
    /// posted message.
    pub(crate) fn wake_if_later(&self, deadline_ns: u64, work: bool) {
        if on_engine_thread() {
            return;
        }
        let planned = self.engine_wake_ns.load(Ordering::Acquire);
        if work {
            self.wake();
            return;
        }
        if deadline_ns == 0 || planned == 0 {
            return; // no timer, or the engine is awake and will look
        }
        let now = self.ns_since_epoch(Instant::now());
        let slack = deadline_ns.saturating_sub(now);
        if planned > deadline_ns.saturating_add(slack) {
            self.wake();
        }
    }
}

impl HandlerRunner for DevShared {
    /// Runs a CQ's handler on the engine thread.
    fn defer_fire(&self, cq: Arc<CqShared>) {
        self.deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cq);
        self.wake();
    }
}
