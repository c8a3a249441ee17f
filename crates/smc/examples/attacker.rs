//! A malicious SMC-R peer for system tests (`tests/system/smc-malicious.sh`), built from
//! the malicious-peer suite's harness (`crates/smc/tests/attack`). Not part of the `smc`
//! command; it attacks only the addresses it is given.
//!
//! ```text
//! attacker decline-dos     --from IP --to ADDR:PORT --peer-id 0xHEX [--count N]
//! attacker test-link-flood --from IP --to ADDR:PORT [--secs S]
//! ```
//!
//! `decline-dos`: N TCP connections from IP (default 3), each carrying only a CLC Decline
//! with the out-of-sync (S) flag and the given Peer ID, where the listener expects a
//! Proposal. `test-link-flood`: a full SMC-R rendezvous from IP (the attacker's own
//! software RNIC on IP:4791), then TEST LINK requests without reading the answers: first
//! step by step until the victim's send queue is full (a no-op CDC of its connection at
//! each step, so the victim drives that connection), then as fast as the link takes them
//! for S seconds (default 3). Each
//! prints one result line.

#[path = "../tests/attack/mod.rs"]
mod attack;

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use smc_wire::common::{Mac, PeerId};
use smc_wire::decline::DeclineCode;
use smc_wire::llc::{LlcMessage, TestLink};

fn usage() -> ExitCode {
    eprintln!(
        "usage: attacker decline-dos --from IP --to ADDR:PORT --peer-id 0xHEX [--count N]\n       \
         attacker test-link-flood --from IP --to ADDR:PORT [--secs S]"
    );
    ExitCode::from(2)
}

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn peer_id(s: &str) -> Option<PeerId> {
    let v = u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()?;
    let b = v.to_be_bytes();
    Some(PeerId {
        instance: u16::from_be_bytes([b[0], b[1]]),
        mac: Mac([b[2], b[3], b[4], b[5], b[6], b[7]]),
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        return usage();
    };
    let (Some(from), Some(to)) = (
        arg(&args, "--from").and_then(|s| s.parse::<IpAddr>().ok()),
        arg(&args, "--to").and_then(|s| s.parse::<SocketAddr>().ok()),
    ) else {
        return usage();
    };
    match cmd.as_str() {
        "decline-dos" => {
            let Some(pid) = arg(&args, "--peer-id").and_then(peer_id) else {
                return usage();
            };
            let n: usize = arg(&args, "--count")
                .and_then(|s| s.parse().ok())
                .unwrap_or(3);
            let mut sent = 0;
            for _ in 0..n {
                let Ok(mut t) = attack::clc::tcp_from(from, to) else {
                    continue;
                };
                let d = attack::clc::decline(pid, true, DeclineCode::SYNCERR);
                if attack::clc::send_all(&mut t, &d) {
                    sent += 1;
                }
                let _ = attack::clc::wait_end(&mut t, Duration::from_millis(300));
            }
            println!("decline-dos: {sent} Declines with S naming {pid} sent to {to}");
            if sent == n {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        "test-link-flood" => {
            let secs: u64 = arg(&args, "--secs")
                .and_then(|s| s.parse().ok())
                .unwrap_or(3);
            let a = attack::peer::Attacker::new(from);
            let s = match a.connect(to) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("test-link-flood: rendezvous with {to} failed: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // Answers are not read: the receive queue fills, the victim's answers pile up;
            // its send queue is filled step by step first (see `Session::clog`).
            s.link.hold_receives(true);
            let m = LlcMessage::TestLink(TestLink {
                v2: false,
                response: false,
                user_data: [0x5a; 16],
            });
            let mut msg = vec![0u8; m.buffer_len()];
            m.emit(&mut msg, attack::link::FMT)
                .expect("TEST LINK encodes");
            let n = s.clog(&msg, 650, 300) + s.flood(&msg, Duration::from_secs(secs), u64::MAX, 1);
            println!(
                "test-link-flood: {n} TEST LINK requests to {to} in {secs} s (link {})",
                if s.link.failed.load(std::sync::atomic::Ordering::SeqCst) {
                    "broken by the victim"
                } else {
                    "up"
                }
            );
            ExitCode::SUCCESS
        }
        _ => usage(),
    }
}
