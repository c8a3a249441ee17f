//! What a device's QPs share: the local address their TCP connections use, the STag
//! table, counters and QP numbers. There is no device-wide thread: each connected QP runs
//! its own transmit and receive threads on its TCP socket (SMC-R link mode adds an accept
//! thread, [`crate::smclink`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use smc_verbs::DeviceAttr;

use crate::config::Config;
use crate::mr::MrTable;

/// Device counters.
#[derive(Default, Debug)]
pub struct Stats {
    /// FPDUs sent.
    pub tx_fpdus: AtomicU64,
    /// FPDUs received.
    pub rx_fpdus: AtomicU64,
    /// FPDUs whose CRC did not verify (the connection was terminated).
    pub rx_bad_crc: AtomicU64,
    /// Terminate messages sent.
    pub tx_terminates: AtomicU64,
    /// Terminate messages received.
    pub rx_terminates: AtomicU64,
    /// QPs currently open.
    pub qps_open: AtomicU64,
}

pub(crate) struct DevShared {
    pub(crate) attr: DeviceAttr,
    pub(crate) mrs: MrTable,
    pub(crate) config: Config,
    pub(crate) stats: Stats,
    pub(crate) next_qpn: AtomicU32,
    pub(crate) next_pd: AtomicU32,
    /// SMC-R link mode: the device's listening socket (shut down with the device).
    pub(crate) listener: Option<std::net::TcpListener>,
}

impl Drop for DevShared {
    fn drop(&mut self) {
        if let Some(l) = &self.listener {
            // Wakes the accept thread, which then finds the device gone and exits.
            let _ = socket2::SockRef::from(l).shutdown(std::net::Shutdown::Both);
        }
    }
}

impl DevShared {
    pub(crate) fn alloc_qpn(&self) -> u32 {
        // 24-bit QP numbers; 0 and 1 are special in IBA and kept out here too.
        loop {
            let n = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
            if n >= 2 {
                return n;
            }
        }
    }
}
