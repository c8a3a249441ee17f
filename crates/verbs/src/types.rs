//! Basic verbs types: GID, MAC, path MTU, access flags and 24-bit PSN/QPN
//! arithmetic.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

/// A 16-byte global identifier. On RoCEv2 this is the IPv6 address of the
/// port, or the IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) for IPv4.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID for an IP address (IPv4 addresses are mapped).
    pub fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for (IPv4 when it is IPv4-mapped).
    pub fn to_ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// The IPv4 address if this GID is IPv4-mapped.
    pub fn to_ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// True for the all-zero GID.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", Ipv6Addr::from(self.0))
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

/// A 48-bit Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Mac(pub [u8; 6]);

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mac({self})")
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// IBA path MTU. The discriminants are the IBA / ibverbs `enum ib_mtu`
/// values, which SMC-R also uses on the wire (RFC 7609 A.2.3 "QP MTU").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// All values, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// Payload bytes per packet.
    pub fn bytes(self) -> usize {
        128usize << (self as u8)
    }

    /// From the IBA enumeration value (1..=5).
    pub fn from_enum(v: u8) -> Option<Mtu> {
        Self::ALL.get((v as usize).wrapping_sub(1)).copied()
    }

    /// From a byte count that is exactly one of the IBA sizes.
    pub fn from_bytes(n: usize) -> Option<Mtu> {
        Self::ALL.iter().copied().find(|m| m.bytes() == n)
    }

    /// The largest IBA MTU whose payload fits in `n` bytes.
    pub fn largest_fitting(n: usize) -> Option<Mtu> {
        Self::ALL.iter().rev().copied().find(|m| m.bytes() <= n)
    }
}

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
