//! Basic verbs types: GID, MAC, path MTU, access flags and 24-bit PSN/QPN
//! arithmetic.

/// Mask of the 24 significant bits of a PSN (IBA §9.7.1: PSNs are 24 bits).
pub const PSN_MASK: u32 = 0x00ff_ffff;
/// Mask of the 24 significant bits of a QP number.
pub const QPN_MASK: u32 = 0x00ff_ffff;

/// `psn + n` modulo 2^24.
#[inline]
pub fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// Signed distance `a - b` in 24-bit serial-number arithmetic: positive when
/// `a` is after `b`, negative when before. The result is in
/// `-2^23 ..= 2^23 - 1`, which is how IBA compares PSNs inside the valid
/// window.
#[inline]
pub fn psn_diff(a: u32, b: u32) -> i32 {
    // Shift the 24-bit difference into the top of an i32 and back to sign-extend.
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

// The GID, MAC and path MTU are the ones SMC-R carries on the wire: defined once, in
// smc-wire (the bottom layer, no I/O), and used unchanged by every provider.
pub use smc_wire::common::{Gid, Mac, QpMtu as Mtu};

bitflags::bitflags! {
    /// Memory-region and QP access rights (ibverbs `IBV_ACCESS_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The local RNIC may write the memory (receive buffers, RDMA READ
        /// response targets, atomic results). Required by REMOTE_WRITE and
        /// REMOTE_ATOMIC, as in ibverbs.
        const LOCAL_WRITE = 1 << 0;
        /// Remote peers may RDMA WRITE into the memory.
        const REMOTE_WRITE = 1 << 1;
        /// Remote peers may RDMA READ the memory.
        const REMOTE_READ = 1 << 2;
        /// Remote peers may perform atomics on the memory.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn psn_arithmetic_wraps_at_24_bits() {
        assert_eq!(psn_add(PSN_MASK, 1), 0);
        assert_eq!(psn_add(0xfffffe, 5), 3);
        assert_eq!(psn_diff(3, 0xfffffe), 5);
        assert_eq!(psn_diff(0xfffffe, 3), -5);
        assert_eq!(psn_diff(7, 7), 0);
        assert_eq!(psn_diff(0x7fffff, 0), 0x7fffff);
        assert_eq!(psn_diff(0x800000, 0), -0x800000);
    }

    #[test]
    fn gid_maps_ipv4() {
        let ip: IpAddr = "10.99.0.3".parse().unwrap();
        let gid = Gid::from_ip(ip);
        assert_eq!(gid.to_string(), "::ffff:10.99.0.3");
        assert_eq!(gid.to_ip(), ip);
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(Gid::from_ip(v6).to_ip(), v6);
    }

    #[test]
    fn mtu_values() {
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::from_enum(3), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_enum(0), None);
        assert_eq!(Mtu::from_enum(6), None);
        assert_eq!(
            Mtu::largest_fitting(1500 - 20 - 8 - 12 - 16 - 4),
            Some(Mtu::Mtu1024)
        );
        assert_eq!(Mtu::from_bytes(4096), Some(Mtu::Mtu4096));
    }
}
