//! Sharing the RoCEv2 UDP port of one address between processes
//! (docs/port-sharing.md).
//!
//! Every RoCEv2 packet goes to UDP port 4791 (IBA Annex A17), so every
//! process running a software RNIC on an address needs that port. The
//! device socket of each process joins one SO_REUSEPORT group and the group
//! steers each datagram with an eBPF `SK_REUSEPORT` program: it reads the
//! destination QPN in the BTH (IBA §9.2, bytes 5..8 of the BTH, after the
//! 8-byte UDP header) and selects the socket stored at index `QPN >> 14` of a
//! `REUSEPORT_SOCKARRAY` map. Each process claims one index (its *slot*) and
//! gives its QPs numbers in `slot << 14 .. (slot + 1) << 14`, so the wire
//! stays plain RoCEv2 with 24-bit QPNs (nothing for a peer or rxe to know).
//!
//! Finding the group's map: processes find each other's map by its name (a
//! hash of network namespace, address and port), enumerating maps by id,
//! under an flock on `/run/smc-rs/softroce-port.lock` so that two processes
//! never both create one. Nothing is pinned: the map lives as long as a
//! process of the group holds it or the group's program refers to it, and a
//! process's slot is freed by the kernel when its socket closes (a SIGKILL
//! included), so nothing stale survives the processes.
//!
//! No libbpf: the program is twenty instructions assembled here and loaded
//! with the bpf(2) system call (the `smc` crate's layering rule keeps libbpf
//! out of everything but `smc-bpf`; this crate depends on `smc-verbs` only).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use socket2::Socket;

/// Bits of the QPN that name the process's slot (the top ones of 24).
pub(crate) const SLOT_BITS: u32 = 10;
/// The slot is `QPN >> SLOT_SHIFT`.
pub(crate) const SLOT_SHIFT: u32 = 24 - SLOT_BITS;
// A slot's QPN range holds every QP of a device (max_qp 4096, engine.rs).
const _: () = assert!((1 << SLOT_SHIFT) > 4096);
/// Processes that can share one address and port.
pub(crate) const SLOTS: u32 = 1 << SLOT_BITS;
/// Environment variable: `0` binds the port alone (no sharing; the behaviour
/// before sharing existed), anything else or unset shares it where possible.
pub const ENV_SHARE: &str = "SMC_RS_SOFTROCE_SHARE";
/// The lock that serialises finding or creating a group's map.
const LOCK_DIR: &str = "/run/smc-rs";
const LOCK_FILE: &str = "/run/smc-rs/softroce-port.lock";
/// Names of the maps start with this (version 1 of the slot layout).
const NAME_PREFIX: &str = "smcrs1";

/// Why the port could not be shared.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// Every slot of the group's map is taken.
    #[error("all {SLOTS} slots of the port's group are taken")]
    Full,
}

fn sys(what: &'static str) -> impl FnOnce(io::Error) -> ShareError {
    move |source| ShareError::Sys { what, source }
}

/// This process's membership in a shared port's group: its slot, and the
/// map and program, kept open while the device lives.
#[derive(Debug)]
pub(crate) struct SharedPort {
    pub(crate) slot: u32,
    _map: OwnedFd,
    _prog: OwnedFd,
}

/// Binds `sock` to `addr` in the SO_REUSEPORT group of that address and
/// claims a slot (module documentation). On error the socket may be bound
/// and must be dropped.
pub(crate) fn bind_shared(sock: &Socket, addr: SocketAddr) -> Result<SharedPort, ShareError> {
    // Privilege first (listing maps by id needs CAP_SYS_ADMIN), so that an
    // unprivileged process hears that, not that it cannot open the lock.
    let mut probe = GetId::default();
    if let Err(e) = bpf(BPF_MAP_GET_NEXT_ID, &mut probe) {
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(sys("listing BPF maps (needs CAP_SYS_ADMIN)")(e));
        }
    }
    let _lock = Flock::take()?;
    sock.set_reuse_port(true).map_err(sys("SO_REUSEPORT"))?;
    sock.bind(&addr.into()).map_err(sys(
        "bind (the port is held by a process that does not share it)",
    ))?;
    let name = map_name(netns_inode().map_err(sys("/proc/self/ns/net"))?, addr);
    let map = match find_map(&name)? {
        Some(m) => m,
        None => create_map(&name)?,
    };
    let prog = load_prog(map.as_raw_fd())?;
    attach(sock, &prog)?;
    let slot = claim_slot(&map, sock.as_raw_fd(), crate::mr::random_u32() % SLOTS)?;
    Ok(SharedPort {
        slot,
        _map: map,
        _prog: prog,
    })
}

/// The device socket of `local:port`: shared with the other processes on
/// that address where possible; else bound alone, as before sharing existed,
/// with a warning that says why (a second process on the address then gets
/// no device, and its connections stay TCP). Port 0 (tests) is never shared.
pub(crate) fn bind_device(local: IpAddr, port: u16) -> io::Result<(Socket, Option<SharedPort>)> {
    let addr = SocketAddr::new(local, port);
    let why = if port == 0 {
        None
    } else if !wanted() {
        Some(format!("{ENV_SHARE}=0"))
    } else {
        let sock = crate::net::udp_socket(local)?;
        match bind_shared(&sock, addr) {
            Ok(shared) => {
                tracing::info!(%addr, slot = shared.slot, "RoCEv2 port shared with the other smc-rs processes of this address");
                return Ok((sock, Some(shared)));
            }
            Err(e) => Some(e.to_string()),
        }
    };
    let sock = crate::net::udp_socket(local)?;
    match sock.bind(&addr.into()) {
        Ok(()) => {
            if let Some(why) = &why {
                tracing::warn!(%addr, reason = %why, "RoCEv2 port not shared: bound by this process alone; another smc-rs process on this address will have no RDMA device (its connections stay TCP)");
            }
            Ok((sock, None))
        }
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(io::Error::new(
            e.kind(),
            format!(
                "UDP {addr} is taken by another process and cannot be shared ({})",
                why.as_deref().unwrap_or("sharing not tried")
            ),
        )),
        Err(e) => Err(e),
    }
}

/// Whether sharing is wanted ([`ENV_SHARE`]).
pub(crate) fn wanted() -> bool {
    smc_verbs::process::config_var(ENV_SHARE).is_none_or(|v| v.trim() != "0")
}

/// The name that identifies the group of (network namespace, address,
/// port) among the host's maps: 15 characters, the most a map name holds.
fn map_name(netns: u64, addr: SocketAddr) -> [u8; 16] {
    // FNV-1a 64: stable across builds and processes (std's hasher is not
    // specified to be). 36 of its bits tell groups apart.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= u64::from(x);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(&netns.to_le_bytes());
    match addr.ip() {
        IpAddr::V4(a) => eat(&a.octets()),
        IpAddr::V6(a) => eat(&a.octets()),
    }
    eat(&addr.port().to_le_bytes());
    let text = format!("{NAME_PREFIX}{:09x}", h & 0xf_ffff_ffff);
    let mut name = [0u8; 16];
    name[..15].copy_from_slice(&text.as_bytes()[..15]);
    name
}

fn netns_inode() -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/self/ns/net")?.ino())
}

/// An exclusive flock on [`LOCK_FILE`], released on drop (or by the kernel
/// when the process dies).
struct Flock(std::fs::File);

impl Flock {
    fn take() -> Result<Flock, ShareError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let _ = std::fs::DirBuilder::new().mode(0o755).create(LOCK_DIR);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(LOCK_FILE)
            .map_err(sys("opening /run/smc-rs/softroce-port.lock"))?;
        // SAFETY: flock on a descriptor the File owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(sys("flock")(io::Error::last_os_error()));
        }
        Ok(Flock(f))
    }
}

impl Drop for Flock {
    fn drop(&mut self) {
        // SAFETY: flock on a descriptor the File owns (closing it would
        // unlock too; this releases the lock before the File is dropped).
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

// ---- bpf(2) ------------------------------------------------------------
// The attribute layouts of include/uapi/linux/bpf.h, only the fields used;
// the kernel accepts a shorter attribute and zero-fills the rest.

#[cfg(test)]
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_GET_NEXT_ID: libc::c_long = 12;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_MAP_TYPE_REUSEPORT_SOCKARRAY: u32 = 20;
const BPF_PROG_TYPE_SK_REUSEPORT: u32 = 21;
const BPF_NOEXIST: u64 = 1;
/// `SO_ATTACH_REUSEPORT_EBPF` (asm-generic/socket.h).
const SO_ATTACH_REUSEPORT_EBPF: libc::c_int = 52;

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct GetId {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of `struct bpf_map_info`.
#[repr(C)]
#[derive(Default)]
struct MapInfo {
    map_type: u32,
    id: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    name: [u8; 16],
}

/// bpf(2) with `attr`; the result (an fd or 0) or the error.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialised #[repr(C)] attribute of the
    // layout `cmd` expects, valid for size_of::<T>() bytes; pointers inside
    // it (if any) point at buffers the caller keeps alive across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn bpf_fd<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)? as RawFd;
    // SAFETY: bpf(2) returned a new file descriptor that nothing else owns.
    Ok(smc_verbs::process::lift(unsafe {
        OwnedFd::from_raw_fd(fd)
    }))
}

/// The map called `name` of the host, if one exists (enumerated by id; needs
/// CAP_SYS_ADMIN, which loading the program needs anyway).
fn find_map(name: &[u8; 16]) -> Result<Option<OwnedFd>, ShareError> {
    let mut id = 0u32;
    loop {
        let mut a = GetId {
            id,
            ..Default::default()
        };
        match bpf(BPF_MAP_GET_NEXT_ID, &mut a) {
            Ok(_) => id = a.next_id,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(sys("listing BPF maps (needs CAP_SYS_ADMIN)")(e)),
        }
        let mut g = GetId {
            id,
            ..Default::default()
        };
        // A map may vanish between the two calls.
        let Ok(fd) = bpf_fd(BPF_MAP_GET_FD_BY_ID, &mut g) else {
            continue;
        };
        let mut info = MapInfo::default();
        let mut q = InfoByFd {
            bpf_fd: fd.as_raw_fd() as u32,
            info_len: std::mem::size_of::<MapInfo>() as u32,
            info: &mut info as *mut MapInfo as u64,
        };
        if bpf(BPF_OBJ_GET_INFO_BY_FD, &mut q).is_ok()
            && info.map_type == BPF_MAP_TYPE_REUSEPORT_SOCKARRAY
            && info.max_entries == SLOTS
            && info.name == *name
        {
            return Ok(Some(fd));
        }
    }
}

fn create_map(name: &[u8; 16]) -> Result<OwnedFd, ShareError> {
    let mut a = MapCreate {
        map_type: BPF_MAP_TYPE_REUSEPORT_SOCKARRAY,
        key_size: 4,
        value_size: 8,
        max_entries: SLOTS,
        map_name: *name,
        ..Default::default()
    };
    bpf_fd(BPF_MAP_CREATE, &mut a).map_err(sys("creating the REUSEPORT_SOCKARRAY map"))
}

/// The slot of a socket cookie in the map, for tests: the cookie of the
/// socket at `slot`.
#[cfg(test)]
fn lookup_cookie(map: &OwnedFd, slot: u32) -> Option<u64> {
    let mut cookie = 0u64;
    let mut a = MapElem {
        map_fd: map.as_raw_fd() as u32,
        key: &slot as *const u32 as u64,
        value: &mut cookie as *mut u64 as u64,
        ..Default::default()
    };
    bpf(BPF_MAP_LOOKUP_ELEM, &mut a).ok().map(|_| cookie)
}

/// Puts `sock` at the first free index from `start` on (wrapping):
/// BPF_NOEXIST makes the claim atomic between processes.
fn claim_slot(map: &OwnedFd, sock: RawFd, start: u32) -> Result<u32, ShareError> {
    let value = sock as u64;
    for i in 0..SLOTS {
        let slot = (start + i) % SLOTS;
        let mut a = MapElem {
            map_fd: map.as_raw_fd() as u32,
            key: &slot as *const u32 as u64,
            value: &value as *const u64 as u64,
            flags: BPF_NOEXIST,
            ..Default::default()
        };
        match bpf(BPF_MAP_UPDATE_ELEM, &mut a) {
            Ok(_) => return Ok(slot),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => return Err(sys("claiming a slot in the port's map")(e)),
        }
    }
    Err(ShareError::Full)
}

fn attach(sock: &Socket, prog: &OwnedFd) -> Result<(), ShareError> {
    let fd: libc::c_int = prog.as_raw_fd();
    // SAFETY: setsockopt with a valid socket and a pointer to an int that
    // lives across the call, its size given.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_EBPF,
            &fd as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(sys("SO_ATTACH_REUSEPORT_EBPF")(io::Error::last_os_error()));
    }
    Ok(())
}

// ---- the program ---------------------------------------------------------

/// One eBPF instruction (include/uapi/linux/bpf.h `struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Insn {
    code: u8,
    /// dst_reg in the low nibble, src_reg in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

// Opcodes (BPF_CLASS | BPF_OP/BPF_SIZE | BPF_SRC / BPF_MODE).
const MOV64_X: u8 = 0x07 | 0xb0 | 0x08;
const MOV64_K: u8 = 0x07 | 0xb0;
const ADD64_K: u8 = 0x07;
const AND64_K: u8 = 0x07 | 0x50;
const RSH64_K: u8 = 0x07 | 0x70;
const END_TO_BE: u8 = 0x04 | 0xd0 | 0x08;
const LDX_W: u8 = 0x01 | 0x60;
const STX_W: u8 = 0x03 | 0x60;
const LD_IMM64: u8 = 0x18;
const CALL: u8 = 0x05 | 0x80;
const EXIT: u8 = 0x05 | 0x90;
const JNE_K: u8 = 0x05 | 0x50;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const FN_SKB_LOAD_BYTES: i32 = 26;
const FN_SK_SELECT_REUSEPORT: i32 = 82;
const SK_PASS: i32 = 1;
/// Offset of the BTH's byte 4 (reserved, then the 24-bit destination QPN)
/// from the start of the UDP header, where `sk_reuseport_md` data begins.
const BTH_QPN_WORD: i32 = 8 + 4;

/// The steering program for the map `map_fd`: slot = destination QPN >>
/// SLOT_SHIFT; the socket at that slot gets the datagram. Every datagram
/// passes: one too short to hold a BTH, or whose slot nobody holds (a process
/// gone), goes where the kernel's hash puts it (the program selected none),
/// and that device counts it as malformed or for an unknown QP — as a single
/// process would, so the counters still see forged and stale packets.
fn program(map_fd: RawFd) -> Vec<Insn> {
    let (r0, r1, r2, r3, r4, r6, r10) = (0, 1, 2, 3, 4, 6, 10);
    vec![
        insn(MOV64_X, r6, r1, 0, 0),
        // bpf_skb_load_bytes(ctx, 12, fp - 4, 4): BTH bytes 4..8.
        insn(MOV64_K, r2, 0, 0, BTH_QPN_WORD),
        insn(MOV64_X, r3, r10, 0, 0),
        insn(ADD64_K, r3, 0, 0, -4),
        insn(MOV64_K, r4, 0, 0, 4),
        insn(CALL, 0, 0, 0, FN_SKB_LOAD_BYTES),
        insn(JNE_K, r0, 0, 12, 0), // too short → pass
        // Network order to host order, keep the 24-bit QPN, take its slot.
        insn(LDX_W, r1, r10, -4, 0),
        insn(END_TO_BE, r1, 0, 0, 32),
        insn(AND64_K, r1, 0, 0, 0x00ff_ffff),
        insn(RSH64_K, r1, 0, 0, SLOT_SHIFT as i32),
        insn(STX_W, r10, r1, -8, 0),
        // bpf_sk_select_reuseport(ctx, map, fp - 8, 0); an empty slot
        // selects nothing.
        insn(MOV64_X, r1, r6, 0, 0),
        insn(LD_IMM64, r2, BPF_PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_X, r3, r10, 0, 0),
        insn(ADD64_K, r3, 0, 0, -8),
        insn(MOV64_K, r4, 0, 0, 0),
        insn(CALL, 0, 0, 0, FN_SK_SELECT_REUSEPORT),
        // pass:
        insn(MOV64_K, r0, 0, 0, SK_PASS),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

fn load_prog(map_fd: RawFd) -> Result<OwnedFd, ShareError> {
    let insns = program(map_fd);
    let license = c"Dual MIT/Apache-2.0";
    let mut log = vec![0u8; 4096];
    let mut name = [0u8; 16];
    name[..11].copy_from_slice(b"smcrs_steer");
    let mut a = ProgLoad {
        prog_type: BPF_PROG_TYPE_SK_REUSEPORT,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: name,
        ..Default::default()
    };
    bpf_fd(BPF_PROG_LOAD, &mut a).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        if !text.trim().is_empty() {
            tracing::debug!(verifier = %text, "SK_REUSEPORT program refused");
        }
        sys("loading the SK_REUSEPORT program (needs CAP_BPF)")(e)
    })
}

/// The QPN range of `slot`, for tests and listings.
#[cfg(test)]
fn qpn_range(slot: u32) -> std::ops::Range<u32> {
    (slot << SLOT_SHIFT)..((slot + 1) << SLOT_SHIFT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::time::Duration;

    #[test]
    fn map_names_are_15_chars_and_tell_groups_apart() {
        let a: SocketAddr = "10.1.2.3:4791".parse().unwrap();
        let b: SocketAddr = "10.1.2.4:4791".parse().unwrap();
        let c: SocketAddr = "[fd00::1]:4791".parse().unwrap();
        let n = map_name(1, a);
        assert_eq!(n[15], 0);
        assert!(n[..15]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_'));
        assert_eq!(n, map_name(1, a));
        assert_ne!(n, map_name(2, a), "network namespace");
        assert_ne!(n, map_name(1, b), "address");
        assert_ne!(n, map_name(1, SocketAddr::new(a.ip(), 4792)), "port");
        assert_ne!(map_name(1, c), map_name(1, a));
    }

    #[test]
    fn slots_cover_the_24_bit_qpn_space() {
        assert_eq!(qpn_range(0).start, 0);
        assert_eq!(qpn_range(SLOTS - 1).end, 1 << 24);
        assert_eq!(qpn_range(5).len(), 1 << SLOT_SHIFT);
    }

    /// A RoCEv2-looking datagram for `qpn` (only the BTH's QPN matters to
    /// the program).
    fn packet(qpn: u32, tag: u8) -> Vec<u8> {
        let mut p = vec![0u8; 28];
        p[0] = 0x0a; // SEND Only, for the look of it
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p[12] = tag;
        p
    }

    /// Three sockets on one address and port, each claiming a slot: every
    /// datagram reaches the socket of its QPN's slot, one for a slot nobody
    /// holds reaches none, and a closed socket's slot is freed by the
    /// kernel. Needs root (CAP_BPF, CAP_SYS_ADMIN); skipped otherwise.
    #[test]
    fn datagrams_reach_the_socket_of_their_qpns_slot() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        // A free port: bind one, note it, close it.
        let port = UdpSocket::bind((ip, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::new(ip, port);
        let mut members = Vec::new();
        for _ in 0..3 {
            let s = crate::net::udp_socket(ip).unwrap();
            match bind_shared(&s, addr) {
                Ok(m) => members.push((s, m)),
                Err(e) => {
                    eprintln!("skipped: cannot share a port here: {e}");
                    return;
                }
            }
        }
        let slots: Vec<u32> = members.iter().map(|(_, m)| m.slot).collect();
        assert!(
            slots[0] != slots[1] && slots[1] != slots[2] && slots[0] != slots[2],
            "{slots:?}"
        );
        let tx = UdpSocket::bind((ip, 0)).unwrap();
        for (i, (_, m)) in members.iter().enumerate() {
            let qpn = (m.slot << SLOT_SHIFT) | 0x123;
            tx.send_to(&packet(qpn, i as u8), addr).unwrap();
        }
        for (i, (s, _)) in members.iter().enumerate() {
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 64];
            let n = s.recv(&mut buf).expect("datagram for this slot");
            // SAFETY: recv initialised the first n bytes.
            let got: Vec<u8> = buf[..n]
                .iter()
                .map(|b| unsafe { b.assume_init() })
                .collect();
            assert_eq!(got[12], i as u8, "member {i} got another's datagram");
        }
        // The same map is found again, with the three sockets in it.
        let name = map_name(netns_inode().unwrap(), addr);
        let map = find_map(&name).unwrap().expect("the group's map");
        for &slot in &slots {
            assert!(lookup_cookie(&map, slot).is_some());
        }
        // A slot nobody holds: one member gets it (by the kernel's hash), to
        // count it as for an unknown QP.
        let free = (0..SLOTS).find(|s| !slots.contains(s)).unwrap();
        tx.send_to(&packet(free << SLOT_SHIFT | 0x77, 9), addr)
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut got = 0;
        for (s, _) in &members {
            s.set_nonblocking(true).unwrap();
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 64];
            if s.recv(&mut buf).is_ok() {
                got += 1;
            }
        }
        assert_eq!(
            got, 1,
            "an unclaimed slot's datagram reaches exactly one member"
        );
        // Closing a member frees its slot (what SIGKILL does too).
        let (s0, m0) = members.remove(0);
        drop(s0);
        assert_eq!(lookup_cookie(&map, m0.slot), None);
        drop(m0);
    }
}
