//! TCP fallback and resets (RFC 7609 §3.5.1.1, Appendix C): plain TCP peers on either
//! side, and scripted peers that decline, send garbage or stay silent.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use smc::{Mode, SmcStream};
use smc_wire::clc::{ClcMessage, DeclineRepr, Eyecatcher};
use smc_wire::common::PeerId;
use smc_wire::decline::DeclineCode;

/// A plain TCP echo server (what `nc -l` / a non-SMC server is).
fn plain_echo_server(ip: &str) -> SocketAddr {
    let l = TcpListener::bind((ip, 0)).unwrap();
    let a = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            thread::spawn(move || {
                let mut b = [0u8; 4096];
                while let Ok(n) = s.read(&mut b) {
                    if n == 0 || s.write_all(&b[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    a
}

fn echo_check(mut s: &SmcStream) {
    let msg = b"plain old TCP still works";
    s.write_all(msg).unwrap();
    let mut got = [0u8; 25];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, msg);
}

/// One CLC message from a raw socket.
fn read_clc(s: &mut TcpStream) -> Vec<u8> {
    let mut h = [0u8; 8];
    s.read_exact(&mut h).unwrap();
    let len = usize::from(u16::from_be_bytes([h[5], h[6]]));
    let mut m = h.to_vec();
    m.resize(len.max(8), 0);
    s.read_exact(&mut m[8..]).unwrap();
    m
}

/// A scripted server on the server address running `f` on each accepted raw socket.
fn scripted_server(f: impl Fn(TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let l = TcpListener::bind((server_ip().as_str(), 0)).unwrap();
    let a = l.local_addr().unwrap();
    thread::spawn(move || {
        if let Some(Ok(s)) = l.incoming().next() {
            f(s);
        }
    });
    a
}

fn client_only(f: impl FnOnce(&mut smc::StackConfig)) -> smc::Stack {
    init_tracing();
    let mut c = config(&client_ip(), &server_ip());
    f(&mut c);
    smc::Stack::new(c).unwrap()
}

#[test]
fn fallback_to_a_plain_tcp_server() {
    let cli = client_only(|_| {});
    // ip(3) is not in the client's override list and no TCP option is seen.
    let addr = plain_echo_server(&ip(3));
    let s = SmcStream::connect_with(&cli, addr).unwrap();
    let Mode::Fallback { reason } = s.mode() else {
        panic!("expected fallback, got {}", s.mode())
    };
    let text = reason.to_string();
    assert!(text.contains("SMC-R not negotiated"), "{text}");
    echo_check(&s);
    assert_eq!(cli.stats().fallbacks, 1);
}

#[test]
fn fallback_from_a_plain_tcp_client() {
    let (srv, _cli) = pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let m = s.mode();
        let mut b = [0u8; 25];
        (&s).read_exact(&mut b).unwrap();
        (&s).write_all(&b).unwrap();
        (m, s)
    });
    // A plain client from 127.0.0.3, which the server's list does not name.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&"127.0.0.3:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut c: TcpStream = sock.into();
    c.write_all(b"plain old TCP still works").unwrap();
    let mut got = [0u8; 25];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"plain old TCP still works");
    let (m, _s) = t.join().unwrap();
    assert!(!m.is_smc(), "{m}");
}

/// A server's Decline: no RDMA device (then plain TCP).
fn no_device_decline() -> Vec<u8> {
    ClcMessage::Decline(DeclineRepr {
        eyecatcher: Eyecatcher::Smcr,
        version: 1,
        out_of_sync: false,
        peer_id: PeerId::default(),
        diagnosis: DeclineCode::NOSMCRDEV,
        os_type: 0,
        diagnosis_v2: None,
    })
    .to_vec()
    .unwrap()
}

#[test]
fn peer_decline_falls_back_with_the_reason() {
    let cli = client_only(|_| {});
    let addr = scripted_server(|mut s| {
        let p = read_clc(&mut s);
        assert!(matches!(ClcMessage::parse(&p), Ok(ClcMessage::Proposal(_))));
        s.write_all(&no_device_decline()).unwrap();
        // Then it is a plain TCP echo.
        let mut b = [0u8; 25];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
        let _ = s.read(&mut b);
    });
    let s = SmcStream::connect_with(&cli, addr).unwrap();
    let Mode::Fallback { reason } = s.mode() else {
        panic!("expected fallback, got {}", s.mode())
    };
    assert_eq!(reason.peer, Some(DeclineCode::NOSMCRDEV));
    let text = s.mode().to_string();
    assert!(text.contains("peer declined"), "{text}");
    assert!(text.contains("0x03030002"), "{text}");
    echo_check(&s);
}

/// The connecting thread reads the server's reply itself for a while
/// (`drive_client_rendezvous`), then hands the rendezvous to the event thread: a reply
/// that comes after that is still taken, once.
#[test]
fn a_late_reply_is_taken_after_the_hand_over() {
    let cli = client_only(|_| {});
    let addr = scripted_server(|mut s| {
        let _ = read_clc(&mut s);
        std::thread::sleep(Duration::from_millis(400));
        s.write_all(&no_device_decline()).unwrap();
        let mut b = [0u8; 25];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
        let _ = s.read(&mut b);
    });
    let t0 = Instant::now();
    let s = SmcStream::connect_with(&cli, addr).unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(400));
    let Mode::Fallback { reason } = s.mode() else {
        panic!("expected fallback, got {}", s.mode())
    };
    assert_eq!(reason.peer, Some(DeclineCode::NOSMCRDEV));
    echo_check(&s);
}

#[test]
fn garbage_clc_resets_the_connection() {
    let cli = client_only(|_| {});
    let addr = scripted_server(|mut s| {
        let _ = read_clc(&mut s);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        let mut b = [0u8; 64];
        let _ = s.read(&mut b);
    });
    let e = SmcStream::connect_with(&cli, addr).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert!(e.to_string().contains("CLC protocol error"), "{e}");
    assert_eq!(cli.stats().resets, 1);
}

#[test]
fn silent_server_times_out_and_resets() {
    let cli = client_only(|c| c.clc_timeout = Duration::from_millis(300));
    let addr = scripted_server(|mut s| {
        let _ = read_clc(&mut s);
        let mut b = [0u8; 64];
        let _ = s.read(&mut b); // until the client resets
    });
    let t0 = Instant::now();
    let e = SmcStream::connect_with(&cli, addr).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(
        e.to_string()
            .contains("timed out waiting for the CLC Accept"),
        "{e}"
    );
}

#[test]
fn server_resets_a_client_that_sends_garbage_or_nothing() {
    let (srv, _cli) = pair_with(|s| s.clc_timeout = Duration::from_millis(300), |_| {});
    let l = listen(&srv);
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let raw = || {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(
            &format!("{}:0", client_ip())
                .parse::<SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        sock.connect(&addr.into()).unwrap();
        let s: TcpStream = sock.into();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    };
    // Garbage where the Proposal belongs: a CLC protocol error, reset (C.6).
    let mut g = raw();
    g.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut b = [0u8; 16];
    let r = g.read(&mut b);
    assert!(
        matches!(&r, Ok(0)) || matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "{r:?}"
    );
    // Silence: the CLC timer resets it (C.5).
    let t0 = Instant::now();
    let mut s = raw();
    let r = s.read(&mut b);
    assert!(
        matches!(&r, Ok(0)) || matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "{r:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert!(
        wait_until(Duration::from_secs(2), || srv.stats().resets == 2),
        "{:?}",
        srv.stats()
    );
    assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
}

/// A stack on `local` whose software RNIC drops or disturbs its outgoing packets.
fn lossy_stack(local: &str, peer: &str, loss: f64, reorder: f64) -> smc::Stack {
    let rnic = smc_softroce::SoftRoce::new(smc_softroce::Config {
        faults: Some(smc_softroce::FaultConfig {
            seed: 7,
            loss,
            reorder,
            duplicate: reorder,
        }),
        ..smc_softroce::Config::default()
    });
    let mut c = config(local, peer);
    c.provider = rnic;
    smc::Stack::new(c).unwrap()
}

#[test]
fn first_link_failure_declines_to_tcp() {
    init_tracing();
    // Nothing the server sends over RoCE arrives: its CONFIRM LINK fails (retries
    // exhausted), it declines (RFC 7609 C.2: still allowed before its CONFIRM LINK went
    // out) and both carry on over TCP.
    let srv = lossy_stack(&ip(7), &ip(8), 1.0, 0.0);
    let mut cc = config(&ip(8), &ip(7));
    cc.clc.client_confirm_link_timeout = Duration::from_secs(20);
    let cli = smc::Stack::new(cc).unwrap();
    let l = smc::SmcListener::bind_with(&srv, (ip(7).as_str(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut b = [0u8; 25];
        (&s).read_exact(&mut b).unwrap();
        (&s).write_all(&b).unwrap();
        (s.mode(), s)
    });
    let c = SmcStream::connect_with(&cli, addr).unwrap();
    let Mode::Fallback { reason } = c.mode() else {
        panic!("expected fallback, got {}", c.mode())
    };
    assert!(reason.peer.is_some(), "{reason}");
    echo_check(&c);
    let (m, _s) = t.join().unwrap();
    assert!(!m.is_smc(), "{m}");
    assert!(
        wait_until(Duration::from_secs(5), || srv.stats().qps_open == 0
            && cli.stats().qps_open == 0),
        "{:?} / {:?}",
        srv.stats(),
        cli.stats()
    );
}

#[test]
fn data_survives_packet_loss_and_reordering() {
    init_tracing();
    let srv = lossy_stack(&ip(9), &ip(10), 0.02, 0.02);
    let cli = lossy_stack(&ip(10), &ip(9), 0.02, 0.02);
    let l = smc::SmcListener::bind_with(&srv, (ip(9).as_str(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    const N: usize = 4 << 20;
    let t = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let s2 = s.try_clone().unwrap();
        let tx = thread::spawn(move || send_stream(&s2, 21, N, 32 * 1024));
        let rx = recv_stream(&s, N);
        (tx.join().unwrap(), rx)
    });
    let c = SmcStream::connect_with(&cli, addr).unwrap();
    assert!(c.mode().is_smc(), "{}", c.mode());
    let c2 = c.try_clone().unwrap();
    let tx = thread::spawn(move || send_stream(&c2, 22, N, 32 * 1024));
    let (n, h) = recv_stream(&c, N);
    let sent = tx.join().unwrap();
    let (srv_sent, (sn, sh)) = t.join().unwrap();
    assert_eq!((n, sn), (N, N));
    assert_eq!(h, srv_sent);
    assert_eq!(sh, sent);
    drop(srv);
}

#[test]
fn no_common_version_falls_back() {
    // The server only does SMC-Rv2 (with a UEID), the client only SMC-Rv1: Decline.
    let (srv, cli) = pair_with(
        |s| {
            s.v1 = false;
            s.ueids
                .add(smc::clc::Ueid::new("SMC-RS-TEST").unwrap())
                .unwrap();
        },
        |c| c.v2 = false,
    );
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let c = SmcStream::connect_with(&cli, addr).unwrap();
    let Mode::Fallback { reason } = c.mode() else {
        panic!("expected fallback, got {}", c.mode())
    };
    assert!(reason.peer.is_some(), "{reason}");
    echo_check(&c);
}

#[test]
fn connect_timeout_bounds_the_rendezvous() {
    let cli = client_only(|_| {});
    let addr = scripted_server(|mut s| {
        let _ = read_clc(&mut s);
        let mut b = [0u8; 64];
        let _ = s.read(&mut b); // silent until the client gives up
    });
    let t0 = Instant::now();
    let e = SmcStream::connect_timeout_with(&cli, &addr, Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

/// A stack whose program installed no provider (`smc::defaults`) still connects: over
/// TCP, after declining with "no SMC-R device" (the peer expected a Proposal), and the
/// server's side says the same; both keep working.
#[test]
fn a_stack_without_a_provider_falls_back_with_the_reason() {
    init_tracing();
    let (srv, _) = pair();
    let mut c = config(&client_ip(), &server_ip());
    c.provider = std::sync::Arc::new(smc::defaults::NoProvider);
    let cli = smc::Stack::new(c).unwrap();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || echo_server(l));
    let s = SmcStream::connect_with(&cli, addr).unwrap();
    let Mode::Fallback { reason } = s.mode() else {
        panic!("expected fallback, got {}", s.mode())
    };
    assert_eq!(reason.local, DeclineCode::NOSMCDEV, "{reason}");
    echo_check(&s);
    assert_eq!(cli.stats().fallbacks, 1);
    assert!(wait_until(Duration::from_secs(5), || srv.stats().fallbacks == 1));
}
