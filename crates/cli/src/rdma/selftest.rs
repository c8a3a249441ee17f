//! `smc rdma selftest`: one exchange between two local softroce devices that makes the
//! transport send every packet kind it has, and checks every result. Its capture is what
//! `tests/system/roce-capture.sh` hands to tshark and to scapy's ICRC.
//!
//! Requester `a`, responder `b`, path MTU 1024 so that long messages are segmented:
//! SEND (First/Middle/Last), SEND with immediate (Only), RDMA WRITE (First/Middle/Last),
//! RDMA WRITE with immediate (First/Last with immediate), RDMA READ (request; response
//! First/Middle/Last), compare-and-swap and fetch-and-add (atomic ACKs), a SEND that meets no
//! posted receive (RNR NAK, then retried), and an RDMA WRITE with a wrong rkey (NAK remote
//! access error: the target memory must stay unchanged). ACKs come with all of them.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use smc_verbs::{
    AccessFlags, QpCap, QpState, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus,
};

use super::endpoint::{wait_any, wait_one, Endpoint, EndpointOpts};
use super::{mtu_from_bytes, pattern, RdmaError};

/// `smc rdma selftest` options.
#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// Address of the requesting device.
    #[arg(long, default_value = "127.0.0.1")]
    pub a: IpAddr,
    /// Address of the responding device.
    #[arg(long, default_value = "127.0.0.2")]
    pub b: IpAddr,
    /// Path MTU.
    #[arg(long, default_value_t = 1024)]
    pub mtu: usize,
    /// Run the whole opcode list (the only mode so far; kept explicit for scripts).
    #[arg(long = "all-opcodes", default_value_t = true)]
    pub all_opcodes: bool,
}

const LEN: usize = 64 * 1024;

struct Check<'a> {
    a: &'a Endpoint,
    b: &'a Endpoint,
    deadline: Instant,
}

impl Check<'_> {
    fn post(&self, wr_id: u64, op: SendOp, off: usize, len: usize) -> Result<(), RdmaError> {
        let sge = [self.a.mr.sge(off, len as u32)];
        self.a.qp.post_send(&SendWr {
            wr_id,
            op,
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
        })?;
        Ok(())
    }

    fn recv(&self, wr_id: u64, off: usize, len: usize) -> Result<(), RdmaError> {
        let sge = [self.b.mr.sge(off, len as u32)];
        self.b.qp.post_recv(&RecvWr {
            wr_id,
            sg_list: &sge,
        })?;
        Ok(())
    }

    fn sent(&self, what: &str, wr_id: u64, opcode: WcOpcode) -> Result<(), RdmaError> {
        let wc = wait_one(&self.a.send_cq, self.deadline, what)?;
        expect(what, wc.wr_id == wr_id && wc.opcode == opcode, || {
            format!("completion {wc:?}")
        })
    }

    fn received(
        &self,
        what: &str,
        wr_id: u64,
        opcode: WcOpcode,
        len: u32,
        imm: Option<u32>,
    ) -> Result<(), RdmaError> {
        let wc = wait_one(&self.b.recv_cq, self.deadline, what)?;
        let ok = wc.wr_id == wr_id
            && wc.opcode == opcode
            && wc.imm_data == imm
            && (opcode == WcOpcode::RecvRdmaWithImm || wc.byte_len == len);
        expect(what, ok, || format!("receive completion {wc:?}"))
    }
}

fn expect(what: &str, ok: bool, detail: impl FnOnce() -> String) -> Result<(), RdmaError> {
    if ok {
        Ok(())
    } else {
        Err(RdmaError::Protocol(format!(
            "{what}: unexpected {}",
            detail()
        )))
    }
}

fn same(
    what: &str,
    buf: &smc_verbs::RdmaBuffer,
    off: usize,
    seed: u64,
    len: usize,
) -> Result<(), RdmaError> {
    let mut got = vec![0u8; len];
    buf.read(off, &mut got);
    match pattern::first_mismatch(seed, 0, &got) {
        None => Ok(()),
        Some(at) => Err(RdmaError::DataMismatch(format!(
            "{what}: byte {at} differs"
        ))),
    }
}

fn fill(buf: &smc_verbs::RdmaBuffer, off: usize, seed: u64, len: usize) {
    let mut v = vec![0u8; len];
    pattern::fill(seed, 0, &mut v);
    buf.write(off, &v);
}

fn word(buf: &smc_verbs::RdmaBuffer, off: usize) -> u64 {
    let mut w = [0u8; 8];
    buf.read(off, &mut w);
    u64::from_ne_bytes(w)
}

/// Runs the exchange.
pub fn run(args: &Args) -> Result<(), RdmaError> {
    let mtu = mtu_from_bytes(args.mtu)?;
    let cap = QpCap {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let a = Endpoint::open(&EndpointOpts {
        local: args.a,
        buf_len: LEN,
        access,
        cap,
    })?;
    let b = Endpoint::open(&EndpointOpts {
        local: args.b,
        buf_len: LEN,
        access,
        cap,
    })?;
    let (pa, pb) = (0xff_fff0, 0x00_0100); // a's PSNs wrap past 2^24 during the run
    Endpoint::connect_pair(&a, &b, pa, pb, mtu)?;
    println!(
        "selftest: {} {} QP {:#x} -> {} {} QP {:#x}, path MTU {}",
        a.device.name(),
        args.a,
        a.qp.qpn(),
        b.device.name(),
        args.b,
        b.qp.qpn(),
        args.mtu
    );
    let c = Check {
        a: &a,
        b: &b,
        deadline: Instant::now() + Duration::from_secs(30),
    };
    let (rkey, base) = (b.mr.rkey(), b.mr.addr());

    c.recv(11, 0, 4096)?;
    c.recv(12, 4096, 4096)?;
    c.recv(13, 8192, 4096)?;

    fill(&a.buf, 0, 1, 3000);
    c.post(1, SendOp::Send, 0, 3000)?;
    c.sent("SEND", 1, WcOpcode::Send)?;
    c.received("SEND", 11, WcOpcode::Recv, 3000, None)?;
    same("SEND", &b.buf, 0, 1, 3000)?;
    println!("ok  SEND 3000 B (First/Middle/Last)");

    fill(&a.buf, 4096, 2, 100);
    c.post(2, SendOp::SendWithImm { imm: 0x00c0_ffee }, 4096, 100)?;
    c.sent("SEND with immediate", 2, WcOpcode::Send)?;
    c.received(
        "SEND with immediate",
        12,
        WcOpcode::Recv,
        100,
        Some(0x00c0_ffee),
    )?;
    same("SEND with immediate", &b.buf, 4096, 2, 100)?;
    println!("ok  SEND with immediate 100 B (Only with immediate)");

    fill(&a.buf, 8192, 3, 10000);
    c.post(
        3,
        SendOp::RdmaWrite {
            remote_addr: base + 16384,
            rkey,
        },
        8192,
        10000,
    )?;
    c.sent("RDMA WRITE", 3, WcOpcode::RdmaWrite)?;
    same("RDMA WRITE", &b.buf, 16384, 3, 10000)?;
    println!("ok  RDMA WRITE 10000 B (First/Middle/Last)");

    fill(&a.buf, 20480, 4, 2000);
    c.post(
        4,
        SendOp::RdmaWriteWithImm {
            remote_addr: base + 28672,
            rkey,
            imm: 0xabcd,
        },
        20480,
        2000,
    )?;
    c.sent("RDMA WRITE with immediate", 4, WcOpcode::RdmaWrite)?;
    c.received(
        "RDMA WRITE with immediate",
        13,
        WcOpcode::RecvRdmaWithImm,
        2000,
        Some(0xabcd),
    )?;
    same("RDMA WRITE with immediate", &b.buf, 28672, 4, 2000)?;
    println!("ok  RDMA WRITE with immediate 2000 B (First/Last with immediate)");

    fill(&b.buf, 32768, 5, 5000);
    c.post(
        5,
        SendOp::RdmaRead {
            remote_addr: base + 32768,
            rkey,
        },
        24576,
        5000,
    )?;
    c.sent("RDMA READ", 5, WcOpcode::RdmaRead)?;
    same("RDMA READ", &a.buf, 24576, 5, 5000)?;
    println!("ok  RDMA READ 5000 B (request; response First/Middle/Last)");

    b.buf.write(40960, &0x1111u64.to_ne_bytes());
    c.post(
        6,
        SendOp::AtomicCmpSwap {
            remote_addr: base + 40960,
            rkey,
            compare: 0x1111,
            swap: 0x2222,
        },
        32768,
        8,
    )?;
    c.sent("compare-and-swap", 6, WcOpcode::CompSwap)?;
    expect(
        "compare-and-swap",
        word(&a.buf, 32768) == 0x1111 && word(&b.buf, 40960) == 0x2222,
        || {
            format!(
                "values {:#x} / {:#x}",
                word(&a.buf, 32768),
                word(&b.buf, 40960)
            )
        },
    )?;
    println!("ok  ATOMIC compare-and-swap (atomic ACK)");

    c.post(
        7,
        SendOp::AtomicFetchAdd {
            remote_addr: base + 40960,
            rkey,
            add: 5,
        },
        32776,
        8,
    )?;
    c.sent("fetch-and-add", 7, WcOpcode::FetchAdd)?;
    expect(
        "fetch-and-add",
        word(&a.buf, 32776) == 0x2222 && word(&b.buf, 40960) == 0x2227,
        || {
            format!(
                "values {:#x} / {:#x}",
                word(&a.buf, 32776),
                word(&b.buf, 40960)
            )
        },
    )?;
    println!("ok  ATOMIC fetch-and-add (atomic ACK)");

    // No receive is posted at b: b answers RNR NAK until one is (RNR retry 7 = forever).
    fill(&a.buf, 33024, 6, 64);
    c.post(8, SendOp::Send, 33024, 64)?;
    std::thread::sleep(Duration::from_millis(30));
    c.recv(14, 12288, 4096)?;
    c.sent("SEND after RNR NAK", 8, WcOpcode::Send)?;
    c.received("SEND after RNR NAK", 14, WcOpcode::Recv, 64, None)?;
    same("SEND after RNR NAK", &b.buf, 12288, 6, 64)?;
    println!("ok  SEND into an empty receive queue (RNR NAK, retried)");

    // A key b never issued: NAK remote access error, target untouched, a's QP in ERR.
    b.buf.fill(49152, 4096, 0xee);
    fill(&a.buf, 36864, 7, 4096);
    c.post(
        9,
        SendOp::RdmaWrite {
            remote_addr: base + 49152,
            rkey: rkey ^ 0x00ff_ff00,
        },
        36864,
        4096,
    )?;
    let wc = wait_any(&a.send_cq, c.deadline, "RDMA WRITE with a bad rkey")?;
    expect(
        "RDMA WRITE with a bad rkey",
        wc.status == WcStatus::RemAccessErr,
        || format!("completion {wc:?}"),
    )?;
    let mut region = vec![0u8; 4096];
    b.buf.read(49152, &mut region);
    expect(
        "RDMA WRITE with a bad rkey",
        region.iter().all(|&x| x == 0xee),
        || "change of the target memory".into(),
    )?;
    expect(
        "RDMA WRITE with a bad rkey",
        a.qp.state() == QpState::Err,
        || format!("QP state {:?}", a.qp.state()),
    )?;
    println!("ok  RDMA WRITE with a bad rkey (NAK remote access error, memory unchanged)");
    println!("selftest: all opcodes passed");
    Ok(())
}
