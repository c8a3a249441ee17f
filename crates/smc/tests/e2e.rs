//! SMC-R end to end between two stacks in one process (two loopback addresses over the
//! software RNIC): first and subsequent contact, data both ways, close.

mod common;

use std::io::{Read, Write};
use std::thread;
use std::time::Duration;

use common::*;
use smc::{BufSizes, SmcStream};

#[test]
fn first_contact_data_both_ways_and_close() {
    let (srv, cli) = pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mode = s.mode();
        let (n, h) = recv_stream(&s, 4 << 20);
        let back = send_stream(&s, 2, 4 << 20, 65536);
        drop(s);
        (mode, n, h, back, srv)
    });
    let c = smc::SmcStream::connect_with(&cli, addr).unwrap();
    let mode = c.mode();
    assert!(mode.is_smc(), "client mode: {mode}");
    let sent = send_stream(&c, 1, 4 << 20, 65536);
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let (n, h) = recv_stream(&c, usize::MAX);
    let (smode, sn, sh, back, srv) = server.join().unwrap();
    assert!(smode.is_smc(), "server mode: {smode}");
    assert_eq!(sn, 4 << 20);
    assert_eq!(sh, sent);
    assert_eq!(n, 4 << 20);
    assert_eq!(h, back);
    match (&mode, &smode) {
        (
            smc::Mode::Smc {
                first_contact: a, ..
            },
            smc::Mode::Smc {
                first_contact: b, ..
            },
        ) => {
            assert!(*a && *b)
        }
        _ => unreachable!(),
    }
    assert_eq!(cli.link_groups().len(), 1);
    assert_eq!(srv.link_groups().len(), 1);
    drop(c);
    assert!(
        wait_until(Duration::from_secs(10), || cli.stats().smc_connections == 0
            && srv.stats().smc_connections == 0),
        "connections not released: {:?} {:?}",
        cli.stats(),
        srv.stats()
    );
    let _ = (&mut &[0u8][..]).read(&mut [0u8; 0]);
    let _ = std::io::sink().write(&[]);
}

/// A first contact's rendezvous goes on after the Accept (CONFIRM LINK over the new
/// link), which the connecting thread leaves to the event thread: the completion must
/// still reach the connecting thread at once, not at the next endpoint timer (an earlier
/// try at reading the Accept on the connecting thread took 4 s here). A liveness bound,
/// not a speed target: the connect takes tens of milliseconds.
#[test]
fn a_first_contact_is_not_held_after_the_hand_over() {
    let (srv, cli) = pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        (s.mode(), srv)
    });
    let t0 = std::time::Instant::now();
    let c = smc::SmcStream::connect_with(&cli, addr).unwrap();
    let took = t0.elapsed();
    let mode = c.mode();
    assert!(mode.is_smc(), "client mode: {mode}");
    assert!(
        matches!(
            mode,
            smc::Mode::Smc {
                first_contact: true,
                ..
            }
        ),
        "{mode}"
    );
    assert!(took < Duration::from_secs(3), "first contact took {took:?}");
    let (smode, _srv) = server.join().unwrap();
    assert!(smode.is_smc(), "server mode: {smode}");
}

#[test]
fn subsequent_contact_reuses_the_link_group() {
    let (srv, cli) = pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let m1 = echo_once(&cli, addr, 1, 100_000);
    let m2 = echo_once(&cli, addr, 2, 100_000);
    match (m1, m2) {
        (
            smc::Mode::Smc {
                link_group: a,
                first_contact: true,
                ..
            },
            smc::Mode::Smc {
                link_group: b,
                first_contact: false,
                ..
            },
        ) => assert_eq!(a, b),
        (a, b) => panic!("modes: {a} / {b}"),
    }
    let lg = cli.link_groups();
    assert_eq!(lg.len(), 1, "{lg:?}");
    // One device per side: the server's ADD LINK was rejected ("no alternate path"),
    // the link group runs on one link.
    assert_eq!(lg[0].links.len(), 1, "{lg:?}");
    assert_eq!(srv.link_groups()[0].links.len(), 1);
}

#[test]
fn bulk_64_mib_each_way() {
    let (srv, cli) = pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    const N: usize = 64 << 20;
    let server = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let s2 = s.try_clone().unwrap();
        let tx = thread::spawn(move || send_stream(&s2, 11, N, 64 * 1024));
        let rx = recv_stream(&s, N);
        (tx.join().unwrap(), rx, srv)
    });
    let c = smc::SmcStream::connect_with(&cli, addr).unwrap();
    assert!(c.mode().is_smc(), "{}", c.mode());
    let c2 = c.try_clone().unwrap();
    let tx = thread::spawn(move || send_stream(&c2, 12, N, 64 * 1024));
    let (n, h) = recv_stream(&c, N);
    let sent = tx.join().unwrap();
    let (srv_sent, (sn, sh), _srv) = server.join().unwrap();
    assert_eq!((n, sn), (N, N));
    assert_eq!(h, srv_sent);
    assert_eq!(sh, sent);
}

#[test]
fn hundred_concurrent_connections_share_one_link_group() {
    let (srv, cli) = pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let cli = std::sync::Arc::new(cli);
    let threads: Vec<_> = (0..100)
        .map(|i| {
            let cli = cli.clone();
            thread::spawn(move || echo_once(&cli, addr, 100 + i, 64 * 1024))
        })
        .collect();
    let modes: Vec<smc::Mode> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let mut lgrs = std::collections::BTreeSet::new();
    for m in &modes {
        match m {
            smc::Mode::Smc { link_group, .. } => {
                lgrs.insert(*link_group);
            }
            other => panic!("not SMC-R: {other}"),
        }
    }
    assert_eq!(lgrs.len(), 1, "link groups used: {lgrs:?}");
    assert_eq!(cli.link_groups().len(), 1);
    assert_eq!(srv.link_groups().len(), 1);
    assert!(wait_until(Duration::from_secs(20), || cli
        .stats()
        .smc_connections
        == 0
        && srv.stats().smc_connections == 0));
    let s = srv.stats();
    assert_eq!(s.rmb_elements_in_use, 0, "{s:?}");
}

#[test]
fn rmbs_beyond_the_cache_are_deleted_with_delete_rkey() {
    let small = |c: &mut smc::StackConfig| c.rmb_cache = 2;
    let (srv, cli) = pair_with(small, small);
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    // Ten connections open at once: nine of them get a new RMB announced with CONFIRM
    // RKEY on subsequent contact.
    let streams: Vec<smc::SmcStream> = (0..10)
        .map(|_| smc::SmcStream::connect_with(&cli, addr).unwrap())
        .collect();
    for (i, s) in streams.iter().enumerate() {
        assert!(s.mode().is_smc(), "{}", s.mode());
        let d = pattern(i as u64, 5000);
        (&*s).write_all(&d).unwrap();
        let mut back = vec![0u8; 5000];
        (&*s).read_exact(&mut back).unwrap();
        assert!(back == d);
    }
    assert_eq!(cli.link_groups().len(), 1);
    assert!(cli.stats().rmbs >= 10, "{:?}", cli.stats());
    drop(streams);
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (c, s) = (cli.stats(), srv.stats());
            c.smc_connections == 0 && s.smc_connections == 0 && c.rmbs <= 2 && s.rmbs <= 2
        }),
        "{:?} / {:?}",
        cli.stats(),
        srv.stats()
    );
    assert!(cli.stats().rmbs_deleted >= 8, "{:?}", cli.stats());
    assert!(srv.stats().rmbs_deleted >= 8, "{:?}", srv.stats());
    // The link group carries on.
    assert!(echo_once(&cli, addr, 99, 1000).is_smc());
}

#[test]
fn one_stack_talks_to_itself() {
    // Listener and client in one stack on one address: two link groups (server and
    // client role) on the same device, like `SmcListener::bind` + `SmcStream::connect`
    // with Stack::global() in one program.
    init_tracing();
    let st = smc::Stack::new(config(&ip(5), &ip(5))).unwrap();
    let l = smc::SmcListener::bind_with(&st, (ip(5).as_str(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let m = echo_once(&st, addr, 5, 200_000);
    assert!(m.is_smc(), "{m}");
    let m = echo_once(&st, addr, 6, 200_000);
    assert!(
        matches!(
            m,
            smc::Mode::Smc {
                first_contact: false,
                ..
            }
        ),
        "{m}"
    );
    assert_eq!(st.link_groups().len(), 2);
}

#[test]
fn ipv6_loopback() {
    // SMC-Rv1 over IPv6 (the CLC Proposal carries the interface's IPv6 prefixes).
    init_tracing();
    let mut cfg = config("::1", "[::1]");
    cfg.local_addr = Some("::1".parse().unwrap());
    let st = smc::Stack::new(cfg).unwrap();
    let l = match smc::SmcListener::bind_with(&st, ("::1", 0)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skipped: no IPv6 loopback ({e})");
            return;
        }
    };
    let addr = l.local_addr().unwrap();
    if let Err(e) = smc_verbs::Provider::device_for(&*st.config().provider, "::1".parse().unwrap())
    {
        eprintln!("skipped: no software RNIC on ::1 ({e})");
        return;
    }
    echo_server(l);
    let m = echo_once(&st, addr, 9, 100_000);
    assert!(matches!(m, smc::Mode::Smc { version: 1, .. }), "{m}");
}

#[test]
fn listings_and_stats_describe_the_link_group_and_connections() {
    let (srv, cli) = pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || l.accept().unwrap().0);
    let c = smc::SmcStream::connect_with(&cli, addr).unwrap();
    let s = t.join().unwrap();
    (&c).write_all(&[1u8; 1000]).unwrap();
    let mut b = [0u8; 1000];
    (&s).read_exact(&mut b).unwrap();
    let lg = &cli.link_groups()[0];
    assert_eq!((lg.role, lg.version, lg.conns), ("client", 1, 1), "{lg:?}");
    assert_eq!(lg.links.len(), 1);
    assert_eq!(lg.links[0].state, "Active");
    let slg = &srv.link_groups()[0];
    assert_eq!(slg.role, "server");
    // Each side's QP is the other's peer QP.
    assert_eq!(lg.links[0].peer_qpn, Some(slg.links[0].qpn));
    assert_eq!(slg.links[0].peer_qpn, Some(lg.links[0].qpn));
    let conns = cli.connections();
    assert_eq!(conns.len(), 1);
    assert_eq!(conns[0].state, "ACTIVE");
    assert_eq!(conns[0].peer, addr);
    assert_eq!(conns[0].bytes_sent, 1000);
    assert_eq!(srv.connections()[0].bytes_received, 1000);
    let st = cli.stats();
    assert_eq!(
        (st.link_groups, st.qps_open, st.smc_connections),
        (1, 1, 1),
        "{st:?}"
    );
    assert_eq!(st.rmb_elements_in_use, 1);
    assert_eq!(st.alert_tokens, 1);
    assert_eq!(c.state(), "ACTIVE");
    assert!(
        c.mode().to_string().starts_with("SMC-Rv1 on lgr"),
        "{}",
        c.mode()
    );
}

/// Sockets the caller connected and listened on itself (what an interposed
/// `connect()`/`listen()` hands over): SMC-R on both, and `into_fallback` gives a
/// fallback's TCP stream back while an SMC-R stream stays whole.
#[test]
fn adopted_sockets_reach_smc_r() {
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::os::fd::AsFd;

    let (srv, cli) = pair();
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let bind: SocketAddr = format!("{}:0", server_ip()).parse().unwrap();
    sock.bind(&bind.into()).unwrap();
    srv.mark_tcp_option(sock.as_fd()).unwrap();
    sock.listen(16).unwrap();
    let l = smc::SmcListener::from_listening_with(&srv, TcpListener::from(sock)).unwrap();
    let addr = l.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut b = [0u8; 5];
        (&s).read_exact(&mut b).unwrap();
        (&s).write_all(&b).unwrap();
        let back = s.into_fallback().expect_err("an SMC-R stream stays one");
        assert!(back.mode().is_smc());
        drop(back);
        srv
    });
    let csock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let local: SocketAddr = format!("{}:0", client_ip()).parse().unwrap();
    csock.bind(&local.into()).unwrap();
    cli.mark_tcp_option(csock.as_fd()).unwrap();
    csock.connect(&addr.into()).unwrap();
    let c = smc::SmcStream::from_connected_with(&cli, TcpStream::from(csock)).unwrap();
    assert!(c.mode().is_smc(), "{}", c.mode());
    (&c).write_all(b"hello").unwrap();
    let mut b = [0u8; 5];
    (&c).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
    let _srv = server.join().unwrap();

    // A plain TCP listener: the client falls back (the peer answers no CLC) and
    // `into_fallback` hands the TCP stream back, still connected.
    let plain = TcpListener::bind(format!("{}:0", server_ip())).unwrap();
    let paddr = plain.local_addr().unwrap();
    let t = thread::spawn(move || {
        let (mut s, _) = plain.accept().unwrap();
        s.write_all(b"tcp!").unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
    });
    let (plain_cli, _) = pair_with(|_| {}, |c| c.skip_tcp_option = "".parse().unwrap());
    let tcp = TcpStream::connect(paddr).unwrap();
    let f = smc::SmcStream::from_connected_with(&plain_cli, tcp).unwrap();
    let (mut tcp, reason) = f.into_fallback().expect("a fallback");
    assert!(!reason.to_string().is_empty());
    let mut b = [0u8; 4];
    tcp.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"tcp!");
    drop(tcp);
    t.join().unwrap();
}

/// Per-connection buffer sizes (what SO_RCVBUF / SO_SNDBUF ask for): a client's own RMB
/// and send buffer, a listener's for the connections it accepts, rounded up to 16 KiB ×
/// 2^n; a freed RMB is reused only for a connection of its size.
#[test]
fn per_connection_buffer_sizes() {
    let (srv, cli) = pair();
    let tcp_l = std::net::TcpListener::bind((server_ip().as_str(), 0)).unwrap();
    let addr = tcp_l.local_addr().unwrap();
    let sized = BufSizes {
        rmb: Some(32 * 1024),
        sndbuf: None,
    };
    let l = smc::SmcListener::from_listening_sized(&srv, tcp_l, sized).unwrap();
    let connect = |bufs: BufSizes| {
        // From the client stack's address (the server's CLC policy names it).
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let from: std::net::SocketAddr = format!("{}:0", client_ip()).parse().unwrap();
        sock.bind(&from.into()).unwrap();
        sock.connect(&addr.into()).unwrap();
        let tcp: std::net::TcpStream = sock.into();
        let c = SmcStream::from_connected_sized(&cli, tcp, bufs).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    };
    let want = BufSizes {
        rmb: Some(50_000),
        sndbuf: Some(20_000),
    };
    let (c, s) = connect(want);
    assert!(c.mode().is_smc(), "{}", c.mode());
    assert_eq!(c.buffer_sizes(), Some((64 * 1024, 32 * 1024)), "rounded up");
    let stack_sndbuf = srv.config().sndbuf_size;
    assert_eq!(
        s.buffer_sizes(),
        Some((32 * 1024, stack_sndbuf)),
        "the listener's"
    );
    // Data crosses the small buffers intact.
    let data = pattern(7, 1 << 20);
    let send = std::thread::spawn({
        let d = data.clone();
        move || {
            let mut c = c;
            c.write_all(&d).unwrap();
            c
        }
    });
    let mut got = vec![0u8; data.len()];
    let mut sr = &s;
    sr.read_exact(&mut got).unwrap();
    assert!(got == data);
    let c = send.join().unwrap();
    drop((c, s));
    // The freed 64 KiB RMB is not handed to a default-sized connection.
    let (c2, s2) = connect(BufSizes::default());
    assert_eq!(c2.buffer_sizes().map(|b| b.0), Some(cli.config().rmb_size));
    let (c3, s3) = connect(want);
    assert_eq!(c3.buffer_sizes(), Some((64 * 1024, 32 * 1024)));
    drop((c2, s2, c3, s3));
}

/// TCP_CORK (`SmcStream::set_cork`, tcp(7)): small writes wait until the cork is removed,
/// then go out; `cork()` gives the setting back.
#[test]
fn tcp_cork_holds_writes_until_removed() {
    let (srv, cli) = pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    let c = SmcStream::connect_with(&cli, addr).unwrap();
    let (s, _) = l.accept().unwrap();
    assert!(c.mode().is_smc(), "{}", c.mode());
    c.set_cork(true).unwrap();
    assert!(c.cork().unwrap());
    let t = std::time::Instant::now();
    (&c).write_all(b"co").unwrap();
    (&c).write_all(b"rk").unwrap();
    thread::sleep(Duration::from_millis(40));
    s.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4];
    match (&s).read(&mut b) {
        Ok(n) => got.extend_from_slice(&b[..n]),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
    }
    // Only conclusive if this thread was not held up past the cork's ceiling.
    if t.elapsed() < Duration::from_millis(150) {
        assert!(got.is_empty(), "held by TCP_CORK, yet {got:?} arrived");
    }
    c.set_cork(false).unwrap();
    assert!(!c.cork().unwrap());
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    while got.len() < 4 {
        let n = (&s).read(&mut b).unwrap();
        assert!(n > 0, "end of file before the corked data");
        got.extend_from_slice(&b[..n]);
    }
    assert_eq!(got, b"cork");
}
