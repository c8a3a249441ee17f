//! CLC as a TCP byte stream: arbitrary bytes, split into arbitrary chunks, fed to the CLC
//! stream reader and to a client or server rendezvous machine (with the fake runtime of
//! `smc_proto::clc::testing`), interleaved with llc events, CONFIRM RKEY results, TCP closes and
//! clock jumps.
//!
//! Input: `ctl[0..2] | seed[2..10] | stream`. `ctl` picks the role, the configuration and
//! the runtime's failures; the seed drives the chunk sizes and the interleaved events
//! (SplitMix64). In "template" mode the stream is XORed onto what a real peer machine
//! sends (all-zero input = a valid rendezvous), so mutations reach the deep states.
//!
//! Asserts: no panic; the reader never takes more than `wanted()` (never 0) and frames
//! exactly the bytes it was given; a machine takes every byte it asked for through
//! `bytes_wanted()` and none when it asked for none; every CLC message it sends encodes
//! and re-parses; nothing after `Done` and nothing after its own Decline; once the peer
//! goes silent the timers end it in a defined outcome within `max_rendezvous_time`;
//! a fallback or reset gives back every RMB and link group it took.
#![no_main]
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use smc_proto::clc::testing::{
    cfg, client_route, server_route, ClcReader, FakeEnv, Read, CLIENT_HOST, SERVER_HOST,
};
use smc_proto::clc::{
    AddLinkTimeout, ClcConfig, ConnRef, Eligibility, FirstLinkTimeout, LinkEvent, LinkFailure,
    Outcome, Output, ProposalLayout, Rendezvous, V2Route,
};
use smc_wire::clc::{self, ClcMessage, ClcType};
use smc_wire::common::Mac;
use smc_wire::decline::DeclineCode;

/// `FUZZ_SHOW=1`: print each input's outcome (replaying a corpus shows what it reaches).
fn show() -> bool {
    static SHOW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SHOW.get_or_init(|| std::env::var_os("FUZZ_SHOW").is_some())
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Either side: one machine type.
type M = Rendezvous;

/// What the machine under test did, for the invariants.
#[derive(Default)]
struct Watch {
    sent: Vec<ClcMessage>,
    done: bool,
    done_at: Option<Instant>,
}

impl Watch {
    fn drain(&mut self, m: &mut M, now: Instant) -> Vec<ClcMessage> {
        let mut msgs = Vec::new();
        while let Some(o) = m.poll_output() {
            assert!(!self.done, "output after Done: {o:?}");
            match o {
                Output::Send(msg) => {
                    let b = msg.to_vec().expect("a sent CLC message encodes");
                    assert_eq!(b.len(), clc::message_len(&b).expect("framed"));
                    assert_eq!(
                        ClcMessage::parse(&b).expect("a sent message re-parses"),
                        *msg
                    );
                    assert!(
                        !matches!(self.sent.last(), Some(ClcMessage::Decline(_))),
                        "a message after our own Decline"
                    );
                    self.sent.push((*msg).clone());
                    msgs.push(*msg);
                }
                Output::Done(_) => {
                    self.done = true;
                    self.done_at = Some(now);
                }
                Output::ConfirmRkey { .. }
                | Output::OutOfSync { .. }
                | Output::AbortConn { .. } => {}
            }
        }
        msgs
    }
}

fn config(bits: u8) -> ClcConfig {
    let mut c = cfg();
    c.v1 = bits & 0x01 == 0 || bits & 0x02 != 0;
    c.v2 = bits & 0x02 == 0 || bits & 0x01 != 0;
    c.proposal_layout = if bits & 0x04 != 0 {
        ProposalLayout::Rfc7609
    } else {
        ProposalLayout::Linux
    };
    c.first_link_timeout = if bits & 0x08 != 0 {
        FirstLinkTimeout::DeclineAfterGrace
    } else {
        FirstLinkTimeout::Reset
    };
    c.add_link_timeout_action = if bits & 0x10 != 0 {
        AddLinkTimeout::Reset
    } else {
        AddLinkTimeout::ContinueSingleLink
    };
    c.v2_config.max_links = [2, 1, 8, 2][usize::from(bits >> 5 & 3)];
    if bits & 0x80 != 0 {
        c.max_peer_rmbe_code = 5;
    }
    c
}

fn env(host: u8, bits: u8) -> FakeEnv {
    let mut e = FakeEnv::new(host);
    let fail = |b: u8| (bits & b != 0).then_some(DeclineCode::MEM);
    // Bits 0..3 fail one runtime call each, when bit 7 says the runtime is unreliable.
    if bits & 0x80 != 0 {
        e.fail_create = fail(0x01);
        e.fail_alloc = fail(0x02);
        e.fail_register = fail(0x04).map(|_| DeclineCode::ERR_RTOK);
        e.fail_start = fail(0x08).map(|_| DeclineCode::ERR_RDYLNK);
    }
    e.needs_rkey = bits & 0x10 != 0;
    e.conflict = (bits & 0x20 != 0).then_some(ConnRef(9));
    e.full = bits & 0x40 != 0 && bits & 0x80 == 0;
    if bits & 0x0c == 0x0c && bits & 0x80 == 0 {
        e.route = Some(V2Route {
            uses_gateway: true,
            nexthop_mac: Mac([1; 6]),
        });
    }
    e
}

/// Feeds `stream` to a standalone reader in `rng`-sized chunks and checks the framing.
fn check_reader(stream: &[u8], rng: &mut Rng) {
    let mut r = ClcReader::default();
    let mut at = 0;
    let mut msg_start = 0;
    while at < stream.len() {
        let want = r.wanted();
        assert!(want > 0, "the reader always wants something");
        let piece = (1 + rng.below(64) as usize).min(stream.len() - at);
        let (n, res) = r.push(&stream[at..at + piece]);
        assert!(
            n <= piece && n <= want,
            "took {n} of {piece}, wanted {want}"
        );
        assert!(n > 0, "a reader that wants bytes takes some");
        at += n;
        match res {
            Read::More => {}
            Read::Header(ty) => {
                assert_eq!(at - msg_start, 8, "the header is 8 bytes");
                let len = usize::from(u16::from_be_bytes([
                    stream[msg_start + 5],
                    stream[msg_start + 6],
                ]));
                let (min, max) = ty.length_range();
                assert!((min..=max).contains(&len));
            }
            Read::BadHeader(_) => {
                assert_eq!(at - msg_start, 8, "a header is judged when complete");
                return;
            }
            Read::Complete(m) => {
                assert_eq!(
                    &m[..],
                    &stream[msg_start..at],
                    "the message is the bytes given"
                );
                assert_eq!(clc::message_len(&m).ok(), Some(m.len()));
                assert!(ClcType::from_u8(m[4]).is_ok());
                msg_start = at;
            }
        }
    }
}

/// The peer's bytes: what a real peer machine sent, XORed with the fuzz stream (template
/// mode), or the fuzz stream alone.
struct Source<'a> {
    mask: &'a [u8],
    peer: Vec<u8>,
    at: usize,
}

impl Source<'_> {
    fn len(&self) -> usize {
        self.mask.len().max(self.peer.len())
    }
    fn byte(&self, i: usize) -> u8 {
        self.mask.get(i).copied().unwrap_or(0) ^ self.peer.get(i).copied().unwrap_or(0)
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 10 {
        return;
    }
    let ctl = [data[0], data[1]];
    let mut rng = Rng(u64::from_le_bytes(data[2..10].try_into().unwrap()));
    let stream = &data[10..];
    check_reader(stream, &mut rng);

    let client = ctl[0] & 0x01 != 0;
    let template = ctl[0] & 0x02 != 0;
    let mycfg = config(ctl[1]);
    let peercfg = config(ctl[1].rotate_left(3) & 0x7f);
    let mut env = env(
        if client { CLIENT_HOST } else { SERVER_HOST },
        ctl[0] >> 2 | ctl[0] << 6,
    );
    let lgrs_before = 0;
    let start = Instant::now();
    let mut now = start;
    let mut w = Watch::default();

    let mut m = if client {
        Rendezvous::client(now, &mycfg, client_route(), Eligibility::BothAnnounced)
    } else {
        Rendezvous::server(now, &mycfg, server_route(), Eligibility::BothAnnounced)
    };
    let first = w.drain(&mut m, now);

    // The real peer, for template mode: a server answering the client's Proposal, or a
    // client whose Proposal (and Confirm, once our Accept arrives) the server gets.
    let mut penv = FakeEnv::new(if client { SERVER_HOST } else { CLIENT_HOST });
    let mut peer: Option<M> = None;
    let mut src = Source {
        mask: stream,
        peer: Vec::new(),
        at: 0,
    };
    if template {
        let mut p = if client {
            Rendezvous::server(now, &peercfg, server_route(), Eligibility::BothAnnounced)
        } else {
            Rendezvous::client(now, &peercfg, client_route(), Eligibility::BothAnnounced)
        };
        for msg in &first {
            let b = msg.to_vec().unwrap();
            let mut k = 0;
            while k < b.len() && p.bytes_wanted() > 0 {
                let n = p.bytes_wanted().min(b.len() - k);
                k += p.handle_tcp_bytes(now, &b[k..k + n], &mut penv);
            }
        }
        while let Some(o) = p.poll_output() {
            match o {
                Output::Send(msg) => src.peer.extend(msg.to_vec().unwrap()),
                Output::ConfirmRkey { .. } => p.handle_rkey_confirmed(now, Ok(()), &mut penv),
                _ => {}
            }
        }
        peer = Some(p);
    }

    let mut script = 0usize;
    let mut steps = 0;
    while src.at < src.len() && steps < 10_000 {
        steps += 1;
        match rng.below(16) {
            // Mostly: bytes, in a chunk of random size.
            0..=9 => {
                let want = m.bytes_wanted();
                let avail = src.len() - src.at;
                // Sometimes offer more than asked for: the machine must still take
                // only CLC bytes.
                let piece = if rng.below(8) == 0 {
                    (1 + rng.below(avail as u64) as usize).min(avail)
                } else {
                    (1 + rng.below(want.max(1) as u64) as usize)
                        .min(avail)
                        .min(want.max(1))
                };
                let bytes: Vec<u8> = (src.at..src.at + piece).map(|i| src.byte(i)).collect();
                let n = m.handle_tcp_bytes(now, &bytes, &mut env);
                assert!(n <= piece, "took {n} of {piece}");
                if want == 0 {
                    assert_eq!(n, 0, "took bytes without asking for them");
                } else if piece <= want {
                    assert_eq!(n, piece, "asked for {want}, given {piece}, took {n}");
                }
                let msgs = w.drain(&mut m, now);
                if n == 0 {
                    // Not CLC any more (done, or waiting for the llc): the rest is the
                    // application's. Go to the end phase once the machine is done.
                    if m.outcome().is_some() {
                        break;
                    }
                } else {
                    src.at += n;
                }
                // Our messages go to the real peer, whose answers extend the template.
                if let Some(p) = peer.as_mut() {
                    for msg in msgs {
                        let b = msg.to_vec().unwrap();
                        let mut k = 0;
                        while k < b.len() && p.bytes_wanted() > 0 {
                            let t = p.bytes_wanted().min(b.len() - k);
                            k += p.handle_tcp_bytes(now, &b[k..k + t], &mut penv);
                        }
                    }
                    while let Some(o) = p.poll_output() {
                        match o {
                            Output::Send(msg) => src.peer.extend(msg.to_vec().unwrap()),
                            Output::ConfirmRkey { .. } => {
                                p.handle_rkey_confirmed(now, Ok(()), &mut penv)
                            }
                            _ => {}
                        }
                    }
                }
            }
            // The llc's events: the normal script in order, or any event.
            10 | 11 => {
                const SCRIPT: [LinkEvent; 4] = [
                    LinkEvent::ConfirmLinkSent,
                    LinkEvent::FirstLinkUp,
                    LinkEvent::PointOfNoReturn,
                    LinkEvent::SecondLinkSettled,
                ];
                let ev = if rng.below(4) != 0 {
                    script += 1;
                    SCRIPT[(script - 1) % 4]
                } else {
                    LinkEvent::Failed {
                        failure: [
                            LinkFailure::SendFailed,
                            LinkFailure::InvalidMessage,
                            LinkFailure::Timeout,
                            LinkFailure::Other,
                        ][rng.below(4) as usize],
                        code: DeclineCode(rng.next() as u32),
                    }
                };
                m.handle_link_event(now, ev, &mut env);
                w.drain(&mut m, now);
            }
            12 => {
                let r = if rng.below(4) == 0 {
                    Err(DeclineCode::ERR_REGBUF)
                } else {
                    Ok(())
                };
                m.handle_rkey_confirmed(now, r, &mut env);
                w.drain(&mut m, now);
            }
            13 if rng.below(8) == 0 => {
                m.handle_tcp_closed(now, &mut env);
                w.drain(&mut m, now);
            }
            _ => {
                // The clock moves like a correct runtime's: every due timer fires.
                let target = now + Duration::from_millis(rng.below(3000));
                let mut fired = 0;
                while let Some(d) = m.poll_timeout() {
                    if d > target {
                        break;
                    }
                    now = now.max(d);
                    m.on_timeout(now, &mut env);
                    w.drain(&mut m, now);
                    fired += 1;
                    assert!(fired < 20, "timer loop");
                }
                now = target;
            }
        }
    }

    // The peer goes silent (the TCP connection stays open): the timers must end it.
    let mut fired = 0;
    while m.outcome().is_none() {
        let d = m
            .poll_timeout()
            .unwrap_or_else(|| panic!("waits without a timer ({} bytes wanted)", m.bytes_wanted()));
        now = now.max(d);
        m.on_timeout(now, &mut env);
        w.drain(&mut m, now);
        fired += 1;
        assert!(fired < 20, "timer loop");
    }
    let bound = mycfg.max_rendezvous_time();
    let took = w.done_at.expect("Done was output") - start;
    assert!(took <= bound, "the rendezvous took {took:?} > {bound:?}");
    if show() {
        eprintln!("outcome: {:?}", m.outcome().unwrap());
    }
    match m.outcome().unwrap() {
        Outcome::Smc(e) => {
            assert!(env.lgrs.contains_key(&e.lgr), "SMC-R on a live link group");
            assert_eq!(env.live_rmbs.get(&e.local_rmb.rmb), Some(&e.lgr));
        }
        // This harness never offers or takes the same-host path: a peer that answers
        // with the same-host Accept anyway must be refused (a fallback or a reset).
        Outcome::SameHost(s) => panic!("same-host outcome without an offer: {s:?}"),
        Outcome::Fallback(_) | Outcome::Reset(_) => {
            assert!(env.live_rmbs.is_empty(), "RMBs leaked: {:?}", env.live_rmbs);
            assert_eq!(env.lgr_count(), lgrs_before, "link groups leaked");
        }
    }
});
