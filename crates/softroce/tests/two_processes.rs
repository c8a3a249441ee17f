//! Two processes on one host, each with its own device (127.86.95.1 and
//! .2): the parent RDMA-WRITEs 1 MiB and SENDs a message with immediate data
//! to a QP in a child process; the child reports a hash of what landed.
//! Connection parameters travel over the child's stdin/stdout.

mod common;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::*;
use sha2::{Digest, Sha256};
use smc_softroce::Config;
use smc_verbs::*;

const NET: u8 = 95;
const LEN: usize = 1 << 20;

fn rtr(qp: &Qp, dest_qpn: u32, rq_psn: u32, peer_host: u8) {
    qp.modify_to_rtr(&RtrAttr {
        path_mtu: Mtu::Mtu4096,
        dest_qpn,
        rq_psn,
        ah: AddressHandle::to_gid(Gid::from_ip(addr(NET, peer_host))),
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
    })
    .unwrap();
}

fn fields(line: &str) -> Vec<u64> {
    line.split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect()
}

/// The child side; does nothing unless started by the parent test.
#[test]
#[ignore]
fn child_responder() {
    if std::env::var_os("SOFTROCE_CHILD").is_none() {
        return;
    }
    let dev = device(NET, 2, &Config::default());
    let o = Opts::default();
    let s = side(&dev, &o, 777);
    let mem = buf(LEN + 4096);
    let mr =
        s.pd.reg_mr(&mem, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    s.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[mr.sge(LEN, 4096)],
    })
    .unwrap();
    // Runs with --nocapture, so this reaches the parent's pipe.
    let mut so = std::io::stdout();
    writeln!(
        so,
        "PARAMS {} {} {} {}",
        s.qp.qpn(),
        s.psn,
        mr.addr(),
        mr.rkey()
    )
    .unwrap();
    so.flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let p = fields(&line);
    rtr(&s.qp, p[0] as u32, p[1] as u32, 1);
    s.qp.modify_to_rts(&RtsAttr {
        sq_psn: s.psn,
        ..o.rts
    })
    .unwrap();
    let wc = wait_wc(&s.rcq, T);
    assert_eq!(wc.status, WcStatus::Success);
    let digest = Sha256::digest(contents(&mem, 0, LEN));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(
        so,
        "RESULT {} {} {hex}",
        wc.byte_len,
        wc.imm_data.unwrap_or(0)
    )
    .unwrap();
    so.flush().unwrap();
    // Stay until the parent saw the result (its ACKs need our QP).
    line.clear();
    let _ = std::io::stdin().read_line(&mut line);
}

#[test]
fn two_processes_on_one_host() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_responder",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SOFTROCE_CHILD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut read_tagged = |tag: &str| -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "child exited before {tag}"
            );
            // The harness may have printed "test child_responder ... "
            // on the same line.
            if let Some(i) = line.find(tag) {
                return line[i + tag.len()..].trim().to_string();
            }
        }
    };
    let p: Vec<u64> = read_tagged("PARAMS")
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let (qpn, psn, raddr, rkey) = (p[0] as u32, p[1] as u32, p[2], p[3] as u32);
    let dev = device(NET, 1, &Config::default());
    let o = Opts::default();
    let s = side(&dev, &o, 4242);
    rtr(&s.qp, qpn, psn, 2);
    s.qp.modify_to_rts(&RtsAttr {
        sq_psn: s.psn,
        ..o.rts
    })
    .unwrap();
    writeln!(stdin, "PARAMS {} {}", s.qp.qpn(), s.psn).unwrap();
    stdin.flush().unwrap();
    let src = buf(LEN);
    fill_pattern(&src, 95);
    let smr = s.pd.reg_mr(&src, AccessFlags::LOCAL_WRITE).unwrap();
    s.qp.post_send_batch(&[
        SendWr {
            wr_id: 1,
            op: SendOp::RdmaWrite {
                remote_addr: raddr,
                rkey,
            },
            sg_list: &[smr.sge(0, LEN as u32)],
            flags: SendFlags::empty(),
        },
        SendWr {
            wr_id: 2,
            op: SendOp::SendWithImm { imm: 0x5eed },
            sg_list: &[smr.sge(0, 100)],
            flags: SendFlags::SIGNALED,
        },
    ])
    .unwrap();
    assert_eq!(wait_wc(&s.scq, T).status, WcStatus::Success);
    let r = read_tagged("RESULT");
    let want: String = Sha256::digest(contents(&src, 0, LEN))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(r, format!("100 {} {want}", 0x5eed));
    writeln!(stdin, "DONE").unwrap();
    drop(stdin);
    assert!(child.wait().unwrap().success());
}
