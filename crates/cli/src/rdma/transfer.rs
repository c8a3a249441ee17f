//! `smc rdma transfer`: a bulk transfer between two hosts (or network namespaces) that checks
//! every byte: first `--write-bytes` with RDMA WRITE WITH IMMEDIATE into a ring of slots in
//! the server's memory, then `--send-bytes` with SEND into the server's posted receives. Both
//! ends compute SHA-256 over each stream (the client over what it sent, the server over what
//! arrived) and the run passes only if they agree.
//!
//! Flow control: message `j` (of either phase) uses slot `j mod slots` — as the target of the
//! WRITE, or as the buffer of the `j`-th posted receive for a SEND, because receives are
//! reposted in message order. The server returns one credit (a SEND WITH IMMEDIATE carrying
//! `j`) after it has hashed message `j` and reposted its receive, so the client never has more
//! than `slots` messages outstanding and never overwrites a slot that is still being read.
//! The immediate of each WRITE is `j`, so lost, duplicated or reordered deliveries that
//! escaped the transport would show up as a sequence error, not only as a hash mismatch.
//!
//! Out of band (TCP): one text line each way to exchange queue-pair addresses and the ring,
//! and at the end the client's two hashes and the server's verdict.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use sha2::{Digest, Sha256};
use smc_verbs::{
    AccessFlags, Gid, QpCap, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WorkCompletion,
};

use super::endpoint::{random_psn, wait_one, Endpoint, EndpointOpts, RemoteQp};
use super::pingpong::accept;
use super::{mtu_from_bytes, oob, pattern, RdmaError};

/// `smc rdma transfer` options.
#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// Server: TCP address to listen on for the out-of-band exchange.
    #[arg(long, conflicts_with = "connect", required_unless_present = "connect")]
    pub listen: Option<SocketAddr>,
    /// Client: the server's TCP address.
    #[arg(long)]
    pub connect: Option<SocketAddr>,
    /// Client: local address to connect from (the RDMA device binds to it).
    #[arg(long)]
    pub local: Option<IpAddr>,
    /// Client: bytes to move with RDMA WRITE (suffixes K, M, G).
    #[arg(long = "write-bytes", default_value = "256M", value_parser = parse_size)]
    pub write_bytes: u64,
    /// Client: bytes to move with SEND.
    #[arg(long = "send-bytes", default_value = "64M", value_parser = parse_size)]
    pub send_bytes: u64,
    /// Client: bytes per RDMA WRITE.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub slot: u64,
    /// Client: bytes per SEND (at most `--slot`).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub msg: u64,
    /// Client: slots in the server's ring (messages outstanding).
    #[arg(long, default_value_t = 8)]
    pub slots: u32,
    /// Path MTU.
    #[arg(long, default_value_t = 1024)]
    pub mtu: usize,
    /// Local ACK timeout, IBA encoding (4.096 µs × 2^N; 14 ≈ 67 ms as ibv_rc_pingpong,
    /// 10 ≈ 4 ms suits a direct link).
    #[arg(long = "ack-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    pub ack_timeout: u8,
    /// Give up after this many seconds in total.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
}

/// Parses `123`, `64K`, `256M`, `1G` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("not a size: {s:?}"))
}

const WRITE_SEED: u64 = 0x5752_0000;
const SEND_SEED: u64 = 0x5345_0000;
const CREDIT_LEN: usize = 8;

/// The run's shape, sent by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    write_bytes: u64,
    send_bytes: u64,
    slot: u64,
    msg: u64,
    slots: u32,
}

impl Plan {
    fn n_write(&self) -> u64 {
        self.write_bytes.div_ceil(self.slot)
    }
    fn n_send(&self) -> u64 {
        self.send_bytes.div_ceil(self.msg)
    }
    /// Message `j`: (is a WRITE, stream offset, length).
    fn message(&self, j: u64) -> (bool, u64, u64) {
        if j < self.n_write() {
            let off = j * self.slot;
            (true, off, self.slot.min(self.write_bytes - off))
        } else {
            let off = (j - self.n_write()) * self.msg;
            (false, off, self.msg.min(self.send_bytes - off))
        }
    }
    fn validate(&self) -> Result<(), RdmaError> {
        if self.slots == 0
            || self.slot == 0
            || self.msg == 0
            || self.msg > self.slot
            || self.slot > u32::MAX as u64
            || self
                .slot
                .checked_mul(self.slots as u64)
                .is_none_or(|n| n > 1 << 32)
        {
            return Err(RdmaError::Usage(format!(
                "unusable transfer shape {self:?}"
            )));
        }
        Ok(())
    }
}

fn parse_gid(s: &str) -> Result<Gid, RdmaError> {
    let ip: std::net::Ipv6Addr = s
        .parse()
        .map_err(|_| RdmaError::Oob(format!("bad GID {s:?}")))?;
    Ok(Gid(ip.octets()))
}

fn read_line(r: &mut BufReader<TcpStream>, what: &str) -> Result<Vec<String>, RdmaError> {
    let mut line = String::new();
    r.read_line(&mut line)
        .map_err(|e| RdmaError::Oob(format!("reading {what}: {e}")))?;
    if line.is_empty() {
        return Err(RdmaError::Oob(format!("connection closed before {what}")));
    }
    Ok(line.split_whitespace().map(str::to_string).collect())
}

fn num<T: std::str::FromStr>(f: &[String], i: usize, what: &str) -> Result<T, RdmaError> {
    f.get(i)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| RdmaError::Oob(format!("bad or missing {what}")))
}

fn hex(f: &[String], i: usize, what: &str) -> Result<u64, RdmaError> {
    f.get(i)
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .ok_or_else(|| RdmaError::Oob(format!("bad or missing {what}")))
}

fn local_ip(s: &TcpStream) -> Result<IpAddr, RdmaError> {
    let ip = s.local_addr()?.ip();
    Ok(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    })
}

fn cap(slots: u32) -> QpCap {
    QpCap {
        max_send_wr: slots * 2 + 8,
        max_recv_wr: slots + 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Drains the send CQ without waiting; every completion must be a success.
fn drain_sends(ep: &Endpoint) -> Result<u64, RdmaError> {
    let mut wcs = [WorkCompletion::default(); 32];
    let mut n = 0;
    loop {
        let k = ep.send_cq.poll(&mut wcs);
        for wc in &wcs[..k] {
            if !wc.status.is_ok() {
                return Err(RdmaError::Completion {
                    what: "send work request".into(),
                    status: wc.status,
                    wr_id: wc.wr_id,
                });
            }
        }
        n += k as u64;
        if k < wcs.len() {
            return Ok(n);
        }
    }
}

/// Runs either role.
pub fn run(args: &Args) -> Result<(), RdmaError> {
    let timeout = Duration::from_secs(args.timeout);
    match (args.listen, args.connect) {
        (Some(l), None) => server(args, l, timeout),
        (None, Some(c)) => client(args, c, timeout),
        _ => Err(RdmaError::Usage(
            "give exactly one of --listen and --connect".into(),
        )),
    }
}

fn report(what: &str, bytes: u64, hash: &[u8], secs: f64) {
    println!(
        "{what:<5} {bytes} bytes sha256 {} ({:.1} MB/s)",
        hash.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        bytes as f64 / secs / 1e6
    );
}

fn client(args: &Args, addr: SocketAddr, timeout: Duration) -> Result<(), RdmaError> {
    let plan = Plan {
        write_bytes: args.write_bytes,
        send_bytes: args.send_bytes,
        slot: args.slot,
        msg: args.msg,
        slots: args.slots,
    };
    plan.validate()?;
    let mtu = mtu_from_bytes(args.mtu)?;
    let start = Instant::now();
    let deadline = start + timeout;
    let stream = oob::connect_retry(addr, args.local, timeout)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut w = stream;
    let ring = plan.slot as usize * plan.slots as usize;
    let credit_area = plan.slots as usize * CREDIT_LEN;
    let ep = Endpoint::open(&EndpointOpts {
        local: local_ip(&w)?,
        buf_len: ring + credit_area,
        access: AccessFlags::LOCAL_WRITE,
        cap: cap(plan.slots),
    })?;
    let post_credit_recv = |i: u64| -> Result<(), RdmaError> {
        let off = ring + (i % plan.slots as u64) as usize * CREDIT_LEN;
        let sge = [ep.mr.sge(off, CREDIT_LEN as u32)];
        ep.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: &sge,
        })?;
        Ok(())
    };
    for i in 0..plan.slots as u64 {
        post_credit_recv(i)?;
    }
    let psn = random_psn();
    writeln!(
        w,
        "XFER1 {:x} {:x} {} {} {} {} {} {}",
        ep.qp.qpn(),
        psn,
        ep.gid(),
        plan.write_bytes,
        plan.send_bytes,
        plan.slot,
        plan.msg,
        plan.slots
    )?;
    let f = read_line(&mut reader, "the server's address")?;
    if f.first().map(String::as_str) != Some("XFER1") {
        return Err(RdmaError::Oob(format!("unexpected reply {f:?}")));
    }
    let remote = RemoteQp {
        qpn: hex(&f, 1, "QPN")? as u32,
        psn: hex(&f, 2, "PSN")? as u32,
        gid: parse_gid(f.get(3).map(String::as_str).unwrap_or(""))?,
    };
    let rkey = hex(&f, 4, "rkey")? as u32;
    let raddr = hex(&f, 5, "address")?;
    ep.connect_full(&remote, psn, mtu, 1, args.ack_timeout)?;
    println!(
        "transfer: {} -> {}: {} bytes by RDMA WRITE ({} per WRITE), {} bytes by SEND ({} per SEND), {} slots",
        ep.gid(),
        remote.gid,
        plan.write_bytes,
        plan.slot,
        plan.send_bytes,
        plan.msg,
        plan.slots
    );

    let total = plan.n_write() + plan.n_send();
    let (mut hw, mut hs) = (Sha256::new(), Sha256::new());
    let mut credits = plan.slots as u64;
    let mut credited = 0u64; // next credit expected
    let mut chunk = vec![0u8; plan.slot as usize];
    let t0 = Instant::now();
    let mut t_write = None;
    for j in 0..total {
        while credits == 0 {
            let wc = wait_one(&ep.recv_cq, deadline, "a credit from the server")?;
            if wc.imm_data != Some(credited as u32) {
                return Err(RdmaError::Protocol(format!(
                    "credit {:?} out of sequence, expected {credited}",
                    wc.imm_data
                )));
            }
            post_credit_recv(credited + plan.slots as u64)?;
            credited += 1;
            credits += 1;
            drain_sends(&ep)?;
        }
        let (is_write, off, len) = plan.message(j);
        if !is_write && t_write.is_none() {
            t_write = Some(t0.elapsed());
        }
        let buf = &mut chunk[..len as usize];
        let slot_off = (j % plan.slots as u64) as usize * plan.slot as usize;
        if is_write {
            pattern::fill(WRITE_SEED, off, buf);
            hw.update(&*buf);
        } else {
            pattern::fill(SEND_SEED, off, buf);
            hs.update(&*buf);
        }
        ep.buf.write(slot_off, buf);
        let sge = [ep.mr.sge(slot_off, len as u32)];
        let op = if is_write {
            SendOp::RdmaWriteWithImm {
                remote_addr: raddr + slot_off as u64,
                rkey,
                imm: j as u32,
            }
        } else {
            SendOp::Send
        };
        ep.qp.post_send(&SendWr {
            wr_id: j,
            op,
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
        })?;
        credits -= 1;
    }
    while credited < total {
        let wc = wait_one(&ep.recv_cq, deadline, "the last credits")?;
        if wc.imm_data != Some(credited as u32) {
            return Err(RdmaError::Protocol(format!(
                "credit {:?} out of sequence, expected {credited}",
                wc.imm_data
            )));
        }
        credited += 1;
        drain_sends(&ep)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let tw = t_write.map_or(secs, |d| d.as_secs_f64());
    let (dw, ds) = (hw.finalize(), hs.finalize());
    let hexs = |h: &[u8]| h.iter().map(|b| format!("{b:02x}")).collect::<String>();
    report("WRITE", plan.write_bytes, &dw, tw);
    report("SEND", plan.send_bytes, &ds, (secs - tw).max(1e-9));
    writeln!(w, "DONE {} {}", hexs(&dw), hexs(&ds))?;
    let f = read_line(&mut reader, "the server's verdict")?;
    match f.first().map(String::as_str) {
        Some("OK") => {
            println!("transfer: server hashes agree; {total} messages in {secs:.1} s");
            Ok(())
        }
        _ => Err(RdmaError::DataMismatch(format!(
            "server says {}",
            f.join(" ")
        ))),
    }
}

fn server(args: &Args, listen: SocketAddr, timeout: Duration) -> Result<(), RdmaError> {
    let start = Instant::now();
    let deadline = start + timeout;
    let listener = TcpListener::bind(listen)?;
    println!("transfer: waiting on {}", listener.local_addr()?);
    let stream = accept(&listener, timeout)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut w = stream;
    let f = read_line(&mut reader, "the client's address")?;
    if f.first().map(String::as_str) != Some("XFER1") {
        return Err(RdmaError::Oob(format!("unexpected hello {f:?}")));
    }
    let remote = RemoteQp {
        qpn: hex(&f, 1, "QPN")? as u32,
        psn: hex(&f, 2, "PSN")? as u32,
        gid: parse_gid(f.get(3).map(String::as_str).unwrap_or(""))?,
    };
    let plan = Plan {
        write_bytes: num(&f, 4, "write bytes")?,
        send_bytes: num(&f, 5, "send bytes")?,
        slot: num(&f, 6, "slot size")?,
        msg: num(&f, 7, "message size")?,
        slots: num(&f, 8, "slots")?,
    };
    plan.validate()?;
    let mtu = mtu_from_bytes(args.mtu)?;
    let ring = plan.slot as usize * plan.slots as usize;
    let ep = Endpoint::open(&EndpointOpts {
        local: local_ip(&w)?,
        buf_len: ring + CREDIT_LEN * plan.slots as usize,
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        cap: cap(plan.slots),
    })?;
    // Receive `j` always lands in slot `j mod slots` (module documentation).
    let post_recv = |j: u64| -> Result<(), RdmaError> {
        let off = (j % plan.slots as u64) as usize * plan.slot as usize;
        let sge = [ep.mr.sge(off, plan.slot as u32)];
        ep.qp.post_recv(&RecvWr {
            wr_id: j,
            sg_list: &sge,
        })?;
        Ok(())
    };
    for j in 0..plan.slots as u64 {
        post_recv(j)?;
    }
    let psn = random_psn();
    ep.connect_full(&remote, psn, mtu, 1, args.ack_timeout)?;
    writeln!(
        w,
        "XFER1 {:x} {:x} {} {:x} {:x}",
        ep.qp.qpn(),
        psn,
        ep.gid(),
        ep.mr.rkey(),
        ep.mr.addr()
    )?;
    let total = plan.n_write() + plan.n_send();
    let (mut hw, mut hs) = (Sha256::new(), Sha256::new());
    let mut chunk = vec![0u8; plan.slot as usize];
    let t0 = Instant::now();
    let mut t_write = None;
    for j in 0..total {
        let wc = wait_one(&ep.recv_cq, deadline, "the next message")?;
        let (is_write, _off, len) = plan.message(j);
        if wc.wr_id != j {
            return Err(RdmaError::Protocol(format!(
                "message {j} completed receive {}",
                wc.wr_id
            )));
        }
        let slot_off = (j % plan.slots as u64) as usize * plan.slot as usize;
        let buf = &mut chunk[..len as usize];
        if is_write {
            if wc.opcode != WcOpcode::RecvRdmaWithImm || wc.imm_data != Some(j as u32) {
                return Err(RdmaError::Protocol(format!(
                    "message {j}: expected RDMA WRITE with immediate {j}, got {:?} imm {:?}",
                    wc.opcode, wc.imm_data
                )));
            }
            ep.buf.read(slot_off, buf);
            hw.update(&*buf);
        } else {
            if t_write.is_none() {
                t_write = Some(t0.elapsed());
            }
            if wc.opcode != WcOpcode::Recv || wc.byte_len as u64 != len {
                return Err(RdmaError::Protocol(format!(
                    "message {j}: expected a SEND of {len} bytes, got {:?} of {}",
                    wc.opcode, wc.byte_len
                )));
            }
            ep.buf.read(slot_off, buf);
            hs.update(&*buf);
        }
        post_recv(j + plan.slots as u64)?;
        let credit_off = ring + (j % plan.slots as u64) as usize * CREDIT_LEN;
        ep.buf.write(credit_off, &j.to_le_bytes());
        let sge = [ep.mr.sge(credit_off, CREDIT_LEN as u32)];
        ep.qp.post_send(&SendWr {
            wr_id: j,
            op: SendOp::SendWithImm { imm: j as u32 },
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
        })?;
        drain_sends(&ep)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let tw = t_write.map_or(secs, |d| d.as_secs_f64());
    let (dw, ds) = (hw.finalize(), hs.finalize());
    report("WRITE", plan.write_bytes, &dw, tw);
    report("SEND", plan.send_bytes, &ds, (secs - tw).max(1e-9));
    let hexs = |h: &[u8]| h.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let f = read_line(&mut reader, "the client's hashes")?;
    let ok = f.len() == 3 && f[0] == "DONE" && f[1] == hexs(&dw) && f[2] == hexs(&ds);
    if ok {
        writeln!(w, "OK")?;
        println!("transfer: client hashes agree; {total} messages in {secs:.1} s");
        Ok(())
    } else {
        writeln!(w, "MISMATCH")?;
        Err(RdmaError::DataMismatch(format!(
            "client reports {}, we computed write {} send {}",
            f.join(" "),
            hexs(&dw),
            hexs(&ds)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn plan_splits_both_phases() {
        let p = Plan {
            write_bytes: 2500,
            send_bytes: 1000,
            slot: 1000,
            msg: 400,
            slots: 2,
        };
        p.validate().unwrap();
        assert_eq!(p.n_write(), 3);
        assert_eq!(p.n_send(), 3);
        assert_eq!(p.message(2), (true, 2000, 500));
        assert_eq!(p.message(3), (false, 0, 400));
        assert_eq!(p.message(5), (false, 800, 200));
        assert!(Plan { msg: 2000, ..p }.validate().is_err());
        assert!(Plan { slots: 0, ..p }.validate().is_err());
    }
}
