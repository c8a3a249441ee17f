//! Out-of-band (TCP) exchanges of queue-pair addresses, in the formats of rdma-core's
//! `ibv_rc_pingpong` and perftest (`ib_write_bw` ...), so that our tools can pair with theirs.
//!
//! `ibv_rc_pingpong` (rdma-core `libibverbs/examples/rc_pingpong.c`): the client connects to
//! TCP port 18515 and writes one message, the server answers with one, the client writes
//! `done` (with its NUL, 5 bytes). A message is `"%04x:%06x:%06x:%s"` of LID, QPN, PSN and the
//! GID as 32 hex digits in wire byte order, plus a NUL: 52 bytes. The server moves its QP to
//! RTR/RTS *before* it answers, so the client may send as soon as it has the answer.
//!
//! perftest (4.5, protocol version string "6.06"): fixed-size blocks, the client always writes
//! first and the server answers with a block of the same size (see [`PerftestKey`]).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use smc_verbs::Gid;

use super::endpoint::RemoteQp;
use super::RdmaError;

/// Length of an `ibv_rc_pingpong` address message, NUL included.
pub const PP_MSG_LEN: usize = 52;
/// `done` with its NUL, the client's last write.
pub const PP_DONE: &[u8; 5] = b"done\0";

/// One side's queue-pair address as `ibv_rc_pingpong` exchanges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PpDest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN the sender of this message will use (24 bits).
    pub psn: u32,
    /// Port GID (IPv4-mapped on RoCEv2 over IPv4).
    pub gid: Gid,
}

fn hex_gid(gid: &Gid) -> String {
    gid.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex_gid(s: &str) -> Option<Gid> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(Gid(g))
}

impl PpDest {
    /// The QP this message describes, to connect to.
    pub fn remote(&self) -> RemoteQp {
        RemoteQp {
            qpn: self.qpn,
            psn: self.psn,
            gid: self.gid,
        }
    }

    /// The 52-byte message.
    pub fn encode(&self) -> [u8; PP_MSG_LEN] {
        let s = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            hex_gid(&self.gid)
        );
        let mut out = [0u8; PP_MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses a message (text up to the first NUL, four `:`-separated hex fields).
    pub fn parse(msg: &[u8]) -> Result<PpDest, RdmaError> {
        let bad = |why: &str| RdmaError::Oob(format!("bad rc_pingpong address message: {why}"));
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).map_err(|_| bad("not ASCII"))?;
        let f: Vec<&str> = text.split(':').collect();
        if f.len() != 4 {
            return Err(bad(&format!("{} fields in {text:?}", f.len())));
        }
        let hex = |s: &str, what: &str| u32::from_str_radix(s, 16).map_err(|_| bad(what));
        let lid = hex(f[0], "LID")?;
        let qpn = hex(f[1], "QPN")?;
        let psn = hex(f[2], "PSN")?;
        if lid > 0xffff || qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(bad("field out of range"));
        }
        let gid = parse_hex_gid(f[3]).ok_or_else(|| bad("GID"))?;
        Ok(PpDest {
            lid: lid as u16,
            qpn,
            psn,
            gid,
        })
    }
}

/// perftest's 108-byte key block (`KEY_MSG_SIZE_GID`): LID, outstanding reads, QPN, PSN,
/// RKey, VAddr, the 16 GID bytes, SRQ number, as
/// `"%04x:%04x:%06x:%06x:%08x:%016x:" + 16 × "%02x:" + "%08x:"` plus a NUL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerftestKey {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA READs/atomics the sender accepts.
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN.
    pub psn: u32,
    /// Remote key of the sender's buffer.
    pub rkey: u32,
    /// Virtual address of the sender's buffer.
    pub vaddr: u64,
    /// Port GID.
    pub gid: Gid,
    /// SRQ number (0 without XRC).
    pub srqn: u32,
}

/// Length of a perftest key block.
pub const PERFTEST_KEY_LEN: usize = 108;

impl PerftestKey {
    /// The QP this key block describes, to connect to.
    pub fn remote(&self) -> RemoteQp {
        RemoteQp {
            qpn: self.qpn,
            psn: self.psn,
            gid: self.gid,
        }
    }

    /// The 108-byte block.
    pub fn encode(&self) -> [u8; PERFTEST_KEY_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid.0 {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; PERFTEST_KEY_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses a block.
    pub fn parse(msg: &[u8]) -> Result<PerftestKey, RdmaError> {
        let bad = |why: &str| RdmaError::Oob(format!("bad perftest key block: {why}"));
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end]).map_err(|_| bad("not ASCII"))?;
        let f: Vec<&str> = text.split(':').collect();
        // 6 fixed fields, 16 GID bytes, SRQN, and the empty string after the last ':'.
        if f.len() < 23 {
            return Err(bad(&format!("{} fields", f.len())));
        }
        let h64 = |s: &str, what: &str| u64::from_str_radix(s, 16).map_err(|_| bad(what));
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(f[6 + i], 16).map_err(|_| bad("GID byte"))?;
        }
        let lid = h64(f[0], "LID")?;
        let out_reads = h64(f[1], "out_reads")?;
        let qpn = h64(f[2], "QPN")?;
        let psn = h64(f[3], "PSN")?;
        let rkey = h64(f[4], "RKey")?;
        if lid > 0xffff || out_reads > 0xffff || qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(bad("field out of range"));
        }
        Ok(PerftestKey {
            lid: lid as u16,
            out_reads: out_reads as u16,
            qpn: qpn as u32,
            psn: psn as u32,
            rkey: u32::try_from(rkey).map_err(|_| bad("RKey"))?,
            vaddr: h64(f[5], "VAddr")?,
            gid: Gid(gid),
            srqn: u32::try_from(h64(f[22], "SRQN")?).map_err(|_| bad("SRQN"))?,
        })
    }
}

/// Connects to `addr` from `local` (any address if `None`; the RDMA device binds to the
/// connection's local address), retrying refused connections until `timeout` (the peer's
/// tool may not listen yet).
pub fn connect_retry(
    addr: SocketAddr,
    local: Option<IpAddr>,
    timeout: Duration,
) -> Result<TcpStream, RdmaError> {
    let deadline = Instant::now() + timeout;
    let connect = || -> std::io::Result<TcpStream> {
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        if let Some(ip) = local {
            sock.bind(&SocketAddr::new(ip, 0).into())?;
        }
        sock.connect_timeout(&addr.into(), Duration::from_secs(5))?;
        Ok(sock.into())
    };
    loop {
        match connect() {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(%addr, error = %e, "out-of-band connect failed, retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(RdmaError::Oob(format!("cannot connect to {addr}: {e}")));
            }
        }
    }
}

/// Reads exactly `n` bytes.
pub fn read_exact(s: &mut TcpStream, n: usize, what: &str) -> Result<Vec<u8>, RdmaError> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf)
        .map_err(|e| RdmaError::Oob(format!("reading {what} ({n} bytes): {e}")))?;
    Ok(buf)
}

/// Writes all of `data`.
pub fn write_all(s: &mut TcpStream, data: &[u8], what: &str) -> Result<(), RdmaError> {
    s.write_all(data)
        .map_err(|e| RdmaError::Oob(format!("writing {what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_pingpong_message_round_trips_and_matches_the_reference() {
        // A message as ibv_rc_pingpong (rdma-core 44) in the kernel-peer VM wrote it.
        let wire = b"0000:000012:cc8c60:00000000000000000000ffff0a2c0001\0";
        assert_eq!(wire.len(), PP_MSG_LEN);
        let d = PpDest::parse(wire).unwrap();
        assert_eq!(d.qpn, 0x12);
        assert_eq!(d.psn, 0xcc8c60);
        assert_eq!(d.gid.to_string(), "::ffff:10.44.0.1");
        assert_eq!(&d.encode()[..], &wire[..]);
    }

    #[test]
    fn rc_pingpong_message_rejects_garbage() {
        assert!(PpDest::parse(b"").is_err());
        assert!(PpDest::parse(b"0000:000012:cc8c60\0").is_err());
        assert!(PpDest::parse(b"0000:1000000:cc8c60:00000000000000000000ffff0a2c0001\0").is_err());
        assert!(PpDest::parse(b"0000:000012:cc8c60:00000000000000000000ffff0a2c00\0").is_err());
        assert!(PpDest::parse(b"0000:000012:zz8c60:00000000000000000000ffff0a2c0001\0").is_err());
    }

    #[test]
    fn perftest_key_round_trips_and_matches_the_reference() {
        // The key block ib_write_bw (perftest 4.5-0.17) sent in the kernel-peer VM.
        let text = "0000:0001:000011:7321bc:000002d6:000055a342b14000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2c:00:02:00000000:";
        let mut wire = [0u8; PERFTEST_KEY_LEN];
        wire[..text.len()].copy_from_slice(text.as_bytes());
        let k = PerftestKey::parse(&wire).unwrap();
        assert_eq!(k.qpn, 0x11);
        assert_eq!(k.psn, 0x7321bc);
        assert_eq!(k.rkey, 0x2d6);
        assert_eq!(k.vaddr, 0x55a3_42b1_4000);
        assert_eq!(k.out_reads, 1);
        assert_eq!(k.gid.to_string(), "::ffff:10.44.0.2");
        assert_eq!(k.encode(), wire);
        assert!(PerftestKey::parse(b"0000:0001\0").is_err());
    }
}
