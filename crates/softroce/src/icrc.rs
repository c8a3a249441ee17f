//! The RoCEv2 invariant CRC (ICRC).
//!
//! verifiers.md fact 5 (checked against rxe and scapy): the ICRC is the
//! Ethernet CRC-32 (reflected, init and xorout 0xFFFFFFFF, i.e. `crc32fast`)
//! over `8 × 0xFF ‖ IP header ‖ UDP header ‖ BTH ‖ rest of the packet`, with
//! the variant fields set to all ones: IPv4 TOS, TTL and header checksum;
//! IPv6 traffic class, flow label and hop limit; the UDP checksum; BTH byte
//! 4 (FECN/BECN/resv8a). It is transmitted least significant byte first.
//!
//! A UDP socket does not show the IP header, so the header is rebuilt from
//! what the socket knows (addresses, ports, lengths) plus the two IPv4
//! fields the ICRC covers unmasked: flags/fragment offset and the
//! identification. verifiers.md fact 6: an unconnected UDP socket with
//! `IP_PMTUDISC_DO` sends with DF set and ID 0, so that is what we compute
//! with when sending. Receivers cannot see the ID of an incoming packet;
//! [`recover_ipv4_id`] recovers it from the ICRC itself (the CRC is linear,
//! so the 16 ID bits contribute an invertible 32-bit term), which lets us
//! accept packets from Linux rxe, whose IDs are not 0.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

/// What the ICRC needs to know about the IP/UDP headers around a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpInfo {
    /// IPv4.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// Identification field.
        id: u16,
        /// Flags and fragment offset (0x4000 = DF).
        flags_frag: u16,
    },
    /// IPv6.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

/// IPv4 flags word with DF set, as our sockets send (IP_PMTUDISC_DO).
pub const IPV4_DF: u16 = 0x4000;

/// Length of the masked pseudo headers we prepend (without the 8 × 0xFF).
fn pseudo_header(
    ip: &IpInfo,
    sport: u16,
    dport: u16,
    udp_payload_len: usize,
    out: &mut [u8; 48],
) -> usize {
    let udp_len = (udp_payload_len + 8) as u16;
    let n = match *ip {
        IpInfo::V4 {
            src,
            dst,
            id,
            flags_frag,
        } => {
            let total = udp_len.wrapping_add(20);
            out[0] = 0x45;
            out[1] = 0xff; // TOS masked
            out[2..4].copy_from_slice(&total.to_be_bytes());
            out[4..6].copy_from_slice(&id.to_be_bytes());
            out[6..8].copy_from_slice(&flags_frag.to_be_bytes());
            out[8] = 0xff; // TTL masked
            out[9] = 17;
            out[10] = 0xff; // header checksum masked
            out[11] = 0xff;
            out[12..16].copy_from_slice(&src.octets());
            out[16..20].copy_from_slice(&dst.octets());
            20
        }
        IpInfo::V6 { src, dst } => {
            // Version 6, traffic class and flow label all ones.
            out[0] = 0x6f;
            out[1] = 0xff;
            out[2] = 0xff;
            out[3] = 0xff;
            out[4..6].copy_from_slice(&udp_len.to_be_bytes());
            out[6] = 17;
            out[7] = 0xff; // hop limit masked
            out[8..24].copy_from_slice(&src.octets());
            out[24..40].copy_from_slice(&dst.octets());
            40
        }
    };
    out[n..n + 2].copy_from_slice(&sport.to_be_bytes());
    out[n + 2..n + 4].copy_from_slice(&dport.to_be_bytes());
    out[n + 4..n + 6].copy_from_slice(&udp_len.to_be_bytes());
    out[n + 6] = 0xff; // UDP checksum masked
    out[n + 7] = 0xff;
    n + 8
}

/// Computes the ICRC of a UDP payload `pkt` = `BTH ‖ … ‖ pad ‖ ICRC`; the
/// last 4 bytes (the ICRC slot) are not covered.
pub fn compute(ip: &IpInfo, sport: u16, dport: u16, pkt: &[u8]) -> u32 {
    let mut ph = [0u8; 48];
    let n = pseudo_header(ip, sport, dport, pkt.len(), &mut ph);
    let body = &pkt[..pkt.len().saturating_sub(4)];
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(&ph[..n]);
    if body.len() >= 12 {
        let mut bth = [0u8; 12];
        bth.copy_from_slice(&body[..12]);
        bth[4] = 0xff; // FECN/BECN/resv8a masked
        h.update(&bth);
        h.update(&body[12..]);
    } else {
        h.update(body);
    }
    h.finalize()
}

/// Writes the ICRC into the last 4 bytes of `pkt` (little-endian).
pub fn fill(ip: &IpInfo, sport: u16, dport: u16, pkt: &mut [u8]) {
    let c = compute(ip, sport, dport, pkt);
    let n = pkt.len();
    if n >= 4 {
        pkt[n - 4..].copy_from_slice(&c.to_le_bytes());
    }
}

/// The ICRC carried in the packet.
pub fn carried(pkt: &[u8]) -> Option<u32> {
    let n = pkt.len();
    (n >= 4).then(|| u32::from_le_bytes([pkt[n - 4], pkt[n - 3], pkt[n - 2], pkt[n - 1]]))
}

/// True if the packet's ICRC matches `ip` exactly.
pub fn verify(ip: &IpInfo, sport: u16, dport: u16, pkt: &[u8]) -> bool {
    carried(pkt) == Some(compute(ip, sport, dport, pkt))
}

/// For an IPv4 packet whose identification field we could not see: finds
/// the ID for which the ICRC verifies (the candidate `ip` is used for every
/// other field). Returns `None` if no ID makes it verify, i.e. the packet is
/// corrupt (or its DF flag differs).
///
/// CRC-32 is affine over GF(2): for messages of equal length,
/// `crc(m ⊕ e) = crc(m) ⊕ L(e)` with `L` linear. The ID sits at a fixed
/// offset, so `carried ⊕ crc(m with ID 0)` must equal `L(id)`, a linear map
/// from 16 bits to 32 bits that is injective (CRC-32 detects all bursts of
/// ≤ 32 bits). We build the 16 basis images `L(1 << i)` for this packet
/// length and solve by Gaussian elimination.
pub fn recover_ipv4_id(ip: &IpInfo, sport: u16, dport: u16, pkt: &[u8]) -> Option<u16> {
    let IpInfo::V4 {
        src,
        dst,
        flags_frag,
        ..
    } = *ip
    else {
        return None;
    };
    let zero = IpInfo::V4 {
        src,
        dst,
        id: 0,
        flags_frag,
    };
    let syndrome = carried(pkt)? ^ compute(&zero, sport, dport, pkt);
    if syndrome == 0 {
        return Some(0);
    }
    pkt.len().checked_sub(4)?;
    with_map(pkt.len(), |m| m.solve(syndrome))
}

/// How the ICRC of an IPv4 packet of `pkt_len` bytes (UDP payload, ICRC
/// included) changes when its identification changes from 0 to `id`. Used
/// to give each segment of a UDP GSO send the ICRC for the ID the kernel
/// assigns it.
pub fn ipv4_id_delta(pkt_len: usize, id: u16) -> u32 {
    if pkt_len < 4 {
        return 0;
    }
    with_map(pkt_len, |m| m.delta(id))
}

/// The linear map `L` from an IPv4 identification to its ICRC change, for one
/// packet length, with a left inverse: solving for an ID costs two passes over
/// 16-32 bits instead of an elimination per packet (which was 12 % of a
/// receiving process's CPU in bulk over a 1500-byte MTU, one per 1 KiB packet).
struct IdMap {
    /// `L(1 << i)`.
    basis: [u32; 16],
    /// For each syndrome bit, what it contributes to the ID: a left inverse of
    /// `L` (zero for the 16 bits that are not pivots).
    inverse: [u16; 32],
}

impl IdMap {
    fn new(basis: [u32; 16]) -> IdMap {
        // Reduced row echelon form of the basis vectors, each row carrying the
        // combination of basis vectors it is: a vector of the image is the XOR
        // of the rows whose pivot bits it has set.
        let mut rows: [(u32, u16); 16] = [(0, 0); 16];
        for (i, r) in rows.iter_mut().enumerate() {
            *r = (basis[i], 1 << i);
        }
        let mut inverse = [0u16; 32];
        let mut rank = 0;
        for bit in (0..32).rev() {
            let mask = 1u32 << bit;
            let Some(p) = (rank..16).find(|&r| rows[r].0 & mask != 0) else {
                continue;
            };
            rows.swap(rank, p);
            let pivot = rows[rank];
            for (r, row) in rows.iter_mut().enumerate() {
                if r != rank && row.0 & mask != 0 {
                    row.0 ^= pivot.0;
                    row.1 ^= pivot.1;
                }
            }
            rank += 1;
            if rank == 16 {
                break;
            }
        }
        // Pivot bits are read off the reduced rows: the highest set bit of each.
        for &(v, combo) in &rows[..rank] {
            inverse[31 - v.leading_zeros() as usize] = combo;
        }
        IdMap { basis, inverse }
    }

    /// `L(id)`.
    fn delta(&self, id: u16) -> u32 {
        xor_selected(&self.basis, id.into())
    }

    /// The `id` with `L(id) == syndrome`, if there is one.
    fn solve(&self, syndrome: u32) -> Option<u16> {
        let id = xor_selected(&self.inverse, syndrome);
        // A syndrome outside the image (a corrupt packet) maps to some ID too.
        (self.delta(id) == syndrome).then_some(id)
    }
}

/// The XOR of the entries of `table` whose index is a set bit of `bits` (a
/// GF(2) matrix applied to a vector, the matrix by columns).
fn xor_selected<T>(table: &[T], bits: u32) -> T
where
    T: Copy + Default + std::ops::BitXorAssign,
{
    let mut r = T::default();
    let mut v = bits;
    let mut i = 0;
    while v != 0 {
        if v & 1 != 0 {
            r ^= table[i];
        }
        v >>= 1;
        i += 1;
    }
    r
}

/// Runs `f` on the ID map for a packet length, from a small per-thread cache (a
/// stream of packets has few distinct lengths).
fn with_map<R>(pkt_len: usize, f: impl FnOnce(&IdMap) -> R) -> R {
    /// (packet length, map) entries and the next slot to replace.
    type Cache = ([(usize, IdMap); 8], usize);
    const EMPTY: (usize, IdMap) = (
        usize::MAX,
        IdMap {
            basis: [0; 16],
            inverse: [0; 32],
        },
    );
    thread_local! {
        static CACHE: std::cell::RefCell<Cache> =
            const { std::cell::RefCell::new(([EMPTY; 8], 0)) };
    }
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if let Some((_, m)) = c.0.iter().find(|(l, _)| *l == pkt_len) {
            return f(m);
        }
        // Bytes covered after the ID field: rest of the IPv4 header (14) +
        // UDP (8) + packet without its ICRC.
        let slot = c.1;
        c.0[slot] = (pkt_len, IdMap::new(id_basis(14 + 8 + pkt_len - 4)));
        c.1 = (slot + 1) % 8;
        f(&c.0[slot].1)
    })
}

/// `L(1 << i)` for i in 0..16: the raw CRC (no init, no xorout) of the
/// 2-byte ID pattern followed by `trailing` zero bytes.
fn id_basis(trailing: usize) -> [u32; 16] {
    let mut out = [0u32; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let id = 1u16 << i;
        let mut c = raw_crc_update(0, &id.to_be_bytes());
        c = shift_zeros(c, trailing);
        *o = c;
    }
    out
}

const POLY: u32 = 0xedb8_8320; // reflected 0x04C11DB7

fn raw_crc_update(mut c: u32, data: &[u8]) -> u32 {
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
        }
    }
    c
}

/// Matrices advancing a raw CRC state over 2^k zero bytes, k = 0..32.
fn zero_ops() -> &'static [[u32; 32]; 32] {
    static OPS: OnceLock<[[u32; 32]; 32]> = OnceLock::new();
    OPS.get_or_init(|| {
        let mut ops = [[0u32; 32]; 32];
        // One zero byte: column j is the state after feeding a zero byte to
        // the state with only bit j set.
        for (j, col) in ops[0].iter_mut().enumerate() {
            *col = raw_crc_update(1 << j, &[0]);
        }
        for k in 1..32 {
            let prev = ops[k - 1];
            for j in 0..32 {
                ops[k][j] = xor_selected(&prev, prev[j]);
            }
        }
        ops
    })
}

fn shift_zeros(mut c: u32, n: usize) -> u32 {
    let ops = zero_ops();
    let mut k = 0;
    let mut n = n;
    while n != 0 {
        if n & 1 != 0 {
            c = xor_selected(&ops[k], c);
        }
        n >>= 1;
        k += 1;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: every 16-bit ID tried, `L` summed from the basis by hand.
    fn solve_by_search(basis: &[u32; 16], target: u32) -> Option<u16> {
        (0..=u16::MAX).find(|&x| {
            (0..16)
                .filter(|i| x & (1 << i) != 0)
                .fold(0, |acc, i| acc ^ basis[i])
                == target
        })
    }

    proptest! {
        /// The precomputed inverse answers as a search of all IDs does: every ID
        /// back from its delta, and no ID for a syndrome outside the image, for
        /// any packet length.
        #[test]
        fn the_id_map_solves_as_a_search_does(len in 4usize..9000, id: u16, noise: u32) {
            let basis = id_basis(14 + 8 + len - 4);
            let map = IdMap::new(basis);
            let d = map.delta(id);
            prop_assert_eq!(map.solve(d), Some(id));
            prop_assert_eq!(solve_by_search(&basis, d), Some(id));
            prop_assert_eq!(map.solve(noise), solve_by_search(&basis, noise));
        }
    }

    #[test]
    fn recovers_any_id() {
        let mut pkt = vec![0u8; 64];
        for (i, b) in pkt.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(7);
        }
        pkt[0] = 0x04;
        for id in [0u16, 1, 0x8000, 0x1234, 0xffff, 0x363a] {
            let ip = IpInfo::V4 {
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 2),
                id,
                flags_frag: IPV4_DF,
            };
            fill(&ip, 1234, 4791, &mut pkt);
            assert!(verify(&ip, 1234, 4791, &pkt));
            assert_eq!(recover_ipv4_id(&ip, 1234, 4791, &pkt), Some(id));
            let zero = IpInfo::V4 {
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 2),
                id: 0,
                flags_frag: IPV4_DF,
            };
            assert_eq!(
                compute(&zero, 1234, 4791, &pkt) ^ ipv4_id_delta(pkt.len(), id),
                compute(&ip, 1234, 4791, &pkt)
            );
            // Any single corrupted bit in the body is detected.
            pkt[20] ^= 0x10;
            assert_eq!(recover_ipv4_id(&ip, 1234, 4791, &pkt), None);
            pkt[20] ^= 0x10;
        }
    }
}
