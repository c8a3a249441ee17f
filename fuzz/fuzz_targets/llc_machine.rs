//! The link-group machine (`smc_proto::llc::LinkGroup`) fed arbitrary LLC messages: a server
//! and a client machine run over the fake RoCE fabric of `smc_proto::llc::sim`, and the input
//! injects messages into either side on any link id (0..3 are real or recent links,
//! others unknown) — raw bytes, or a message one of them really sent XORed with input
//! bytes — interleaved with time, RMB additions and deletions, link failures, device
//! changes, deletions, idle and termination. v1 (RFC 7609 and Linux layouts) and v2
//! (little- and big-endian length fields).
//!
//! Asserts, besides "no panic" (the simulator also asserts that no timer stays due
//! after `on_timeout` and that runtime callbacks are accepted): every message a machine
//! sends encodes (a v1 message to exactly 44 bytes, a v2 one to 44..=8192) and parses
//! back to the same message in its link group's format; every link an output names is
//! one the machine created; and the time a machine asks to be woken is never in the past.
#![no_main]
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use smc_proto::llc::sim::{device, Sim, SimConfig, CLIENT, SERVER};
use smc_proto::llc::{LinkId, LlcConfig, LlcFormat, LlcOut, Role, Version};
use smc_wire::llc::{LlcMessage, LLC_LEN, MAX_V2_LEN};

struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn u8(&mut self) -> Option<u8> {
        let b = self.data.get(self.at).copied();
        self.at += 1;
        b
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let s = self.at.min(self.data.len());
        let e = (s + n).min(self.data.len());
        self.at = e;
        &self.data[s..e]
    }
}

fn config(sel: u8) -> SimConfig {
    let mut server = match sel % 5 {
        0 => LlcConfig::linux(Role::Server, Version::V1),
        1 => LlcConfig::linux(Role::Server, Version::V2),
        2 => {
            let mut c = LlcConfig::linux(Role::Server, Version::V2);
            c.format = LlcFormat::LINUX_BE;
            c
        }
        3 => LlcConfig::rfc(Role::Server),
        _ => {
            let mut c = LlcConfig::linux(Role::Server, Version::V1);
            c.linux_compat = false;
            c.max_links = 4;
            c
        }
    };
    server.timers.test_link_interval = Some(Duration::from_secs(5));
    server.timers.add_link_retry = Some(Duration::from_secs(20));
    if sel & 0x80 != 0 {
        server.timers.linger = None;
    }
    let mut cfg = SimConfig::pair(server);
    cfg.server_devices = 1 + u32::from(sel >> 3 & 1);
    cfg.client_devices = 1 + u32::from(sel >> 4 & 1);
    cfg
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let cfg = config(data[0]);
    let formats = [cfg.server.format, cfg.client.format];
    let versions = [cfg.server.version, cfg.client.version];
    let mut sim = Sim::new(cfg, u64::from(data[1]));
    let mut inp = Input { data, at: 2 };
    let mut checked = 0usize;
    let mut budget = Duration::from_secs(600);

    loop {
        check(&mut sim, &mut checked, formats, versions);
        let Some(op) = inp.u8() else { break };
        let host = usize::from(op & 1);
        let link = LinkId(u32::from(op >> 1 & 3));
        match op >> 3 {
            // Raw bytes on a link.
            0..=5 => {
                let len = match inp.u8().unwrap_or(0) {
                    n @ 0..=200 => usize::from(n),
                    n => LLC_LEN * usize::from(n - 199),
                };
                let link = if op >> 3 == 5 {
                    LinkId(u32::from(inp.u8().unwrap_or(0)))
                } else {
                    link
                };
                let b = inp.take(len).to_vec();
                sim.inject_bytes(host, link, &b);
            }
            // A message that was really sent, with input bytes XORed in.
            6..=13 if !sim.trace.is_empty() => {
                let i = usize::from(inp.u8().unwrap_or(0)) % sim.trace.len();
                let mut b = sim.trace[i].bytes.clone();
                let n = usize::from(inp.u8().unwrap_or(0) % 8);
                for _ in 0..n {
                    let at = usize::from(inp.u8().unwrap_or(0)) % b.len();
                    b[at] ^= inp.u8().unwrap_or(0xff);
                }
                // Mostly to the receiver of the original, sometimes back to its sender.
                let to = if op & 0x40 != 0 {
                    sim.trace[i].from
                } else {
                    1 - sim.trace[i].from
                };
                sim.inject_bytes(to, link, &b);
            }
            14 | 15 => {
                let ms = u64::from(inp.u8().unwrap_or(0)).pow(2);
                let d = Duration::from_millis(ms).min(budget);
                budget -= d;
                sim.run_for(d);
            }
            // At most 255 RMBs per link group (RFC 7609 §2.1): the machine refuses more
            // (ApiError::TooManyRmbs) and the runtime opens another link group, which
            // the simulator does not model.
            16 if sim.hosts[host].lg.local_rmbs().count() < 255 => {
                sim.add_rmb(host);
            }
            17 => {
                let rmbs = sim.hosts[host].rmb_ids();
                if !rmbs.is_empty() {
                    let r = rmbs[usize::from(inp.u8().unwrap_or(0)) % rmbs.len()];
                    sim.delete_rmb(host, r);
                }
            }
            18 => sim.break_link(host, link),
            19 => sim.with(host, |h, now| h.lg.on_link_error(now, link)),
            20 => {
                let orderly = op & 0x40 != 0;
                sim.with(host, |h, now| {
                    let _ = h.lg.delete_link(now, link, orderly);
                });
            }
            21 => {
                let n = 1 + u32::from(inp.u8().unwrap_or(0) % 3);
                let add = op & 0x40 != 0;
                sim.with(host, |h, now| {
                    let d = device(host, n);
                    if add {
                        h.devices.push(d);
                        h.lg.add_device(now, d);
                    } else {
                        h.devices.retain(|x| x.id != d.id);
                        h.lg.remove_device(now, d.id);
                    }
                });
            }
            22 => {
                let idle = op & 0x40 != 0;
                sim.with(host, |h, now| h.lg.set_idle(now, idle));
            }
            23 => sim.with(host, |h, now| h.lg.terminate(now)),
            _ => {
                let d = Duration::from_millis(200).min(budget);
                budget -= d;
                sim.settle(d);
            }
        }
    }
    // Whatever was injected, the machines keep running to a quiet state or terminate.
    sim.run_for(budget.min(Duration::from_secs(30)));
    check(&mut sim, &mut checked, formats, versions);
});

/// The messages sent since the last check are well-formed, and a machine whose timer is
/// due (a deadline in the past means "now") has none due after `on_timeout`.
fn check(sim: &mut Sim, checked: &mut usize, formats: [LlcFormat; 2], versions: [Version; 2]) {
    for h in [SERVER, CLIENT] {
        if sim.hosts[h].lg.poll_timeout().is_some_and(|t| t <= sim.now) {
            sim.with(h, |host, now| host.lg.on_timeout(now));
            if let Some(t) = sim.hosts[h].lg.poll_timeout() {
                assert!(
                    t > sim.now,
                    "host {h}: a timer is still due after on_timeout"
                );
            }
        }
    }
    for w in &sim.trace[*checked..] {
        let fmt = formats[w.from];
        if versions[w.from] == Version::V2 {
            assert!(
                (LLC_LEN..=MAX_V2_LEN).contains(&w.bytes.len()),
                "v2 length {}",
                w.bytes.len()
            );
        } else {
            assert_eq!(w.bytes.len(), LLC_LEN, "v1 messages are 44 bytes");
        }
        let back = LlcMessage::parse(&w.bytes, fmt)
            .unwrap_or_else(|e| panic!("{} does not parse back: {e}", w.label()));
        assert_eq!(
            LlcOut::new(&back),
            w.msg,
            "{} re-parses differently",
            w.label()
        );
    }
    *checked = sim.trace.len();
}
