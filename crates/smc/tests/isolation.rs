//! A peer can only ever affect its own connections (issue 10): strangers and other
//! peers of the same stack reach nothing of an honest peer's link group, while that
//! peer's verified transfer runs.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

use common::*;
use smc::SmcStream;
use smc_wire::clc::{ClcMessage, DeclineRepr, Eyecatcher};
use smc_wire::common::{Mac, PeerId};
use smc_wire::decline::DeclineCode;

/// The server accepts CLC from the whole test subnet (a stranger with the TCP option
/// set, as anyone can with eBPF, is eligible).
fn server_policy() -> String {
    let c = client_ip();
    let net = c.rsplit_once('.').unwrap().0;
    format!("{net}.0/24:*")
}

/// Echoes `len` bytes over an established stream and checks them.
fn echo_check(c: &SmcStream, seed: u64, len: usize) {
    let w = c.try_clone().unwrap();
    let writer = thread::spawn(move || send_stream(&w, seed, len, 64 * 1024));
    let (got, h) = recv_stream(c, len);
    assert_eq!(got, len, "echo short");
    assert_eq!(h, writer.join().unwrap(), "echo hash");
}

fn decline_bytes(peer_id: PeerId, out_of_sync: bool) -> Vec<u8> {
    ClcMessage::Decline(DeclineRepr {
        eyecatcher: Eyecatcher::Smcr,
        version: 1,
        out_of_sync,
        peer_id,
        diagnosis: DeclineCode::SYNCERR,
        os_type: 0,
        diagnosis_v2: None,
    })
    .to_vec()
    .unwrap()
}

fn parse_peer_id(s: &str) -> PeerId {
    let v = u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let b = v.to_be_bytes();
    PeerId {
        instance: u16::from_be_bytes([b[0], b[1]]),
        mac: Mac([b[2], b[3], b[4], b[5], b[6], b[7]]),
    }
}

/// Issue 10 item 5: a stranger's Declines with the S bit, carrying an honest client's
/// Peer ID (or Peer ID 0, what Linux's v2-only Proposals carry), end only the stranger's
/// own rendezvous, never the link group the honest client's connection runs on.
#[test]
fn declines_with_the_sync_bit_from_a_stranger_touch_no_link_group() {
    let (srv, cli) = pair_with(
        |s| s.skip_tcp_option = server_policy().parse().unwrap(),
        |_| {},
    );
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    // The honest connection is established and carries data before, while and after
    // the stranger acts.
    let c = SmcStream::connect_with(&cli, addr).unwrap();
    assert!(c.mode().is_smc(), "{}", c.mode());
    echo_check(&c, 1, 1 << 20);
    let c2 = c.try_clone().unwrap();
    let during = thread::spawn(move || echo_check(&c2, 2, 64 << 20));
    let groups = srv.link_groups();
    assert_eq!(groups.len(), 1, "{groups:?}");
    let victim = parse_peer_id(&groups[0].peer);
    let stranger: std::net::IpAddr = ip(3).parse().unwrap();
    for peer_id in [victim, victim, victim, PeerId::default()] {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&SocketAddr::new(stranger, 0).into()).unwrap();
        sock.connect(&addr.into()).unwrap();
        let mut s: TcpStream = sock.into();
        s.write_all(&decline_bytes(peer_id, true)).unwrap();
        // The server falls back to TCP on this connection (an echo of our bytes).
        s.write_all(b"ping").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
    }
    during.join().expect("the honest transfer is intact");
    echo_check(&c, 3, 1 << 20);
    let after = srv.link_groups();
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].id, groups[0].id, "the honest link group survived");
    assert_eq!(srv.stats().lgrs_ended, 0);
}
