//! The library under LD_PRELOAD: this test binary runs itself again with
//! libsmc_preload.so preloaded (the `child` test, ignored in normal runs) and the child
//! drives the socket API through std and libc as any program would — blocking and
//! non-blocking connect/accept, poll, level- and edge-triggered epoll, MSG_PEEK, shutdown, dup, socket
//! options, getsockname/getpeername, FIONREAD, a forked child writing on an inherited
//! descriptor, a forked child accepting on an inherited listener, a daemonizing server
//! (listen, fork, exit: the child takes over), a forked child's own connection and urgent
//! data (MSG_OOB, SIOCATMARK, POLLPRI) both ways — over SMC-R between a listener and clients in the one process (one stack
//! talks to itself, SMC_RS_SKIP_TCP_OPTION, no eBPF). The parent checks the child's exit
//! status and the SMC_RS_STATS lines: every connection SMC-R on both ends.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Loopback addresses private to this test process (each address's UDP 4791 is taken
/// by the software RNIC of the process that uses it).
fn ip(host: u8) -> String {
    let pid = std::process::id();
    format!("127.{}.{}.{host}", 100 + pid % 100, (pid / 100) % 250)
}

/// libsmc_preload.so of this build. Integration tests do not depend on a cdylib, so
/// `cargo test` has not built it: build it now, into the same target directory and
/// profile (cargo does nothing when it is up to date).
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/ld_preload-HASH → target/<profile>/libsmc_preload.so
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
    let target_dir = profile_dir.parent().unwrap();
    let mut build = Command::new(env!("CARGO"));
    build
        .args(["build", "--offline", "-q", "-p", "smc-preload", "--lib"])
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let st = build.status().expect("cargo build -p smc-preload");
    assert!(st.success(), "cargo build -p smc-preload: {st}");
    let p = profile_dir.join("libsmc_preload.so");
    assert!(p.is_file(), "{} not built", p.display());
    p
}

/// Runs the `child` test under LD_PRELOAD with the same-host path off (SMC-R over the
/// software RNIC) or on (the default between smc-rs stacks of one host, docs/samehost.md);
/// returns the stats lines.
fn run_child(same_host: bool) -> String {
    let log = run_under_preload("child", same_host);
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    // Twelve connections (blocking; non-blocking with poll and epoll; dup; two around a
    // fork; one accepted by a forked child; urgent data; buffer sizes; SO_LINGER 0;
    // TCP_CORK; one accepted by a daemonized grandchild after its parent exited, one it
    // opened), each seen by the connecting and the accepting side, each pump finished by
    // the exit.
    assert_eq!(count(" connect "), 12, "{log}");
    assert_eq!(count(" accept "), 12, "{log}");
    assert_eq!(count("mode=SMC-R info="), 24, "{log}");
    assert_eq!(count(" close "), 24, "{log}");
    assert_eq!(count("info=\"taken over\""), 1, "{log}");
    assert!(!log.contains("mode=TCP"), "{log}");
    log
}

/// Runs the ignored test `name` of this file under LD_PRELOAD (see [`run_child`]) and
/// returns the stats lines; panics with its output if it fails.
fn run_under_preload(name: &str, same_host: bool) -> String {
    let tag = if same_host { "samehost" } else { "rdma" };
    let pid = std::process::id();
    let stats = std::env::temp_dir().join(format!("smc-preload-test-{pid}-{name}-{tag}.log"));
    let dir = std::env::temp_dir().join(format!("smc-preload-test-{pid}-{name}-sockets"));
    let _ = std::fs::remove_file(&stats);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            name,
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LD_PRELOAD", library())
        .env("SMC_RS_SKIP_TCP_OPTION", "127.0.0.0/8:*")
        .env("SMC_RS_LOCAL_ADDR", ip(1))
        .env("SMC_RS_STATS", &stats)
        .env("SMC_PRELOAD_TEST_SERVER", ip(2))
        .env("SMC_RS_SAME_HOST", if same_host { "1" } else { "0" })
        .env("SMC_RS_SAME_HOST_DIR", &dir)
        .output()
        .unwrap();
    let log = std::fs::read_to_string(&stats).unwrap_or_default();
    let _ = std::fs::remove_file(&stats);
    // The same-host sockets' directory (its stacks are gone with the child).
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{name} ({tag}) failed: {}\n--- stdout\n{}\n--- stderr\n{}\n--- stats\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    log
}

#[test]
fn socket_api_under_ld_preload() {
    let log = run_child(false);
    assert!(!log.contains("same-host"), "{log}");
    // The sized connection: the client's SO_RCVBUF / SO_SNDBUF, the listener's SO_RCVBUF.
    assert_eq!(
        log.lines()
            .filter(|l| l.contains(" connect ") && l.ends_with(" rmb=65536 sndbuf=131072"))
            .count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.lines()
            .filter(|l| l.contains(" accept ") && l.contains(" rmb=32768 sndbuf="))
            .count(),
        1,
        "{log}"
    );
    // The same program on the same-host path: every connection takes it (buffers are
    // the stack's there).
    let log = run_child(true);
    let lines = log
        .lines()
        .filter(|l| l.contains(" connect ") || l.contains(" accept "));
    assert!(
        lines.clone().count() == 24 && lines.clone().all(|l| l.contains("same-host")),
        "{log}"
    );
}

fn poll1(fd: i32, events: i16, ms: i32) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    p.revents
}

fn echo_once(s: &mut TcpStream) {
    let mut b = [0u8; 5];
    s.read_exact(&mut b).unwrap();
    s.write_all(&b).unwrap();
}

#[test]
#[ignore = "run by socket_api_under_ld_preload, under LD_PRELOAD"]
fn child() {
    let server = std::env::var("SMC_PRELOAD_TEST_SERVER").expect("run by the parent test");
    let l = TcpListener::bind(format!("{server}:0")).unwrap();
    let addr = l.local_addr().unwrap();
    assert_eq!(addr.ip().to_string(), server, "getsockname of the listener");

    // 1. Blocking connect and accept; addresses; data both ways; half-close.
    let mut c = TcpStream::connect(addr).unwrap();
    let (mut s, peer) = l.accept().unwrap();
    assert_eq!(c.local_addr().unwrap(), peer, "getsockname = accept's peer");
    assert_eq!(c.peer_addr().unwrap(), addr);
    assert_eq!(s.peer_addr().unwrap(), peer);
    assert_eq!(s.local_addr().unwrap(), addr);
    c.write_all(b"hello").unwrap();
    echo_once(&mut s);
    let mut b = [0u8; 5];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
    c.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "EOF after the peer's shutdown(SHUT_WR)");
    s.write_all(b"after").unwrap();
    drop(s);
    let mut tail = Vec::new();
    c.read_to_end(&mut tail).unwrap();
    assert_eq!(tail, b"after", "data after our half-close, then EOF");

    // 2. Non-blocking: accept with nothing queued, poll on the listener, a
    // non-blocking connect (waits for the handshake, returns 0), reads that would block.
    l.set_nonblocking(true).unwrap();
    assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    assert_eq!(
        poll1(l.as_raw_fd(), libc::POLLIN, 0),
        0,
        "no connection yet"
    );
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_nonblocking(true).unwrap();
    match sock.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
            assert_ne!(
                poll1(sock.as_raw_fd(), libc::POLLOUT, 10_000) & libc::POLLOUT,
                0
            );
            assert!(sock.take_error().unwrap().is_none());
        }
        Err(e) => panic!("non-blocking connect: {e}"),
    }
    let c2 = TcpStream::from(sock);
    assert_ne!(
        poll1(l.as_raw_fd(), libc::POLLIN, 10_000) & libc::POLLIN,
        0,
        "listener readable"
    );
    let (s2, _) = l.accept().unwrap();
    // accept() does not inherit O_NONBLOCK: std's accept gives a blocking stream.
    s2.set_nonblocking(true).unwrap();
    let mut one = [0u8; 1];
    assert_eq!(
        (&s2).read(&mut one).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    assert_eq!(
        (&c2).read(&mut one).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    (&c2).write_all(b"x").unwrap();
    assert_ne!(
        poll1(s2.as_raw_fd(), libc::POLLIN, 10_000) & libc::POLLIN,
        0
    );
    assert_eq!((&s2).read(&mut one).unwrap(), 1);

    // 3. Level-triggered epoll: readable until drained; FIONREAD counts what is there.
    // SAFETY: plain flags.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0);
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 7,
    };
    // SAFETY: valid epoll fd, stream fd and event.
    assert_eq!(
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s2.as_raw_fd(), &mut ev) },
        0
    );
    let wait = |ms| {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: `evs` has room for 4 events.
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 4, ms) };
        assert!(n >= 0);
        n
    };
    assert_eq!(wait(0), 0, "nothing to read");
    (&c2).write_all(b"abcd").unwrap();
    assert_eq!(wait(10_000), 1);
    let mut avail: libc::c_int = 0;
    for _ in 0..1000 {
        // SAFETY: FIONREAD writes one int.
        assert_eq!(
            unsafe { libc::ioctl(s2.as_raw_fd(), libc::FIONREAD, &mut avail) },
            0
        );
        if avail == 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(avail, 4, "FIONREAD");
    let mut two = [0u8; 2];
    (&s2).read_exact(&mut two).unwrap();
    assert_eq!(wait(0), 1, "level-triggered: still readable");
    (&s2).read_exact(&mut two).unwrap();
    assert_eq!(&two, b"cd");
    assert_eq!(wait(0), 0, "drained");
    // Edge-triggered: one event per arrival, none while the data just sits there;
    // MSG_PEEK leaves it for the next read.
    ev.events = (libc::EPOLLIN | libc::EPOLLET) as u32;
    // SAFETY: as for EPOLL_CTL_ADD.
    assert_eq!(
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_MOD, s2.as_raw_fd(), &mut ev) },
        0
    );
    (&c2).write_all(b"ef").unwrap();
    assert_eq!(wait(10_000), 1);
    assert_eq!(
        wait(0),
        0,
        "edge-triggered: no second event for the same data"
    );
    let mut peek = [0u8; 2];
    for _ in 0..1000 {
        // SAFETY: receives into `peek` without consuming.
        let n = unsafe { libc::recv(s2.as_raw_fd(), peek.as_mut_ptr().cast(), 2, libc::MSG_PEEK) };
        if n == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(&peek, b"ef", "MSG_PEEK");
    (&s2).read_exact(&mut two).unwrap();
    assert_eq!(&two, b"ef", "the peeked bytes are still there");
    // SAFETY: our epoll fd.
    unsafe { libc::close(ep) };
    drop(c2);
    drop(s2);
    l.set_nonblocking(false).unwrap();

    // 4. Socket options and dup: TCP_NODELAY given back, SO_DOMAIN says IPv4; a dup
    // is the same connection after the original is closed.
    let c3 = TcpStream::connect(addr).unwrap();
    let (mut s3, _) = l.accept().unwrap();
    c3.set_nodelay(true).unwrap();
    assert!(c3.nodelay().unwrap());
    let dom = socket2::SockRef::from(&c3).domain().unwrap();
    assert_eq!(dom, socket2::Domain::IPV4);
    // TCP-level options, SO_KEEPALIVE and TCP_INFO are the connection's TCP socket's
    // (as Linux SMC answers from its CLC socket), on both ends.
    for sock in [socket2::SockRef::from(&c3), socket2::SockRef::from(&s3)] {
        sock.set_keepalive(true).unwrap();
        assert!(sock.keepalive().unwrap());
        sock.set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(Duration::from_secs(77)))
            .unwrap();
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(77));
        // SAFETY: an all-zero tcp_info is valid (plain integers).
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: getsockopt into a tcp_info of the given length.
        let r = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
        assert_eq!(info.tcpi_state, 1, "TCP_ESTABLISHED");
    }
    // SAFETY: dup of an open descriptor.
    let d = unsafe { libc::dup(c3.as_raw_fd()) };
    assert!(d >= 0);
    drop(c3);
    // SAFETY: `d` is ours.
    let mut c3 = unsafe { TcpStream::from_raw_fd(d) };
    assert_eq!(c3.peer_addr().unwrap(), addr, "getpeername on the dup");
    c3.write_all(b"dup!!").unwrap();
    echo_once(&mut s3);
    c3.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"dup!!");
    drop(c3);
    let mut rest = Vec::new();
    s3.read_to_end(&mut rest).unwrap();

    // 5. fork: the child writes on the inherited descriptor and exits; the parent's
    // tasks serve it. The parent closes its copy first: the connection lives on. The
    // child leaves by exit(), which runs the exit handlers it inherited (the library's
    // drain, the stack's goodbye): both only act for a stack the exiting process started
    // itself (this child started none), and a connection opened before the fork still
    // works afterwards.
    let mut c5 = TcpStream::connect(addr).unwrap();
    let (mut s5, _) = l.accept().unwrap();
    let c4 = TcpStream::connect(addr).unwrap();
    let (mut s4, _) = l.accept().unwrap();
    let fd = c4.into_raw_fd();
    // SAFETY: the child only writes and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let msg = b"from the child";
        // SAFETY: writes our buffer to the inherited descriptor.
        let n = unsafe { libc::write(fd, msg.as_ptr().cast(), msg.len()) };
        // SAFETY: ends the child, running the exit handlers it inherited.
        unsafe { libc::exit(if n == msg.len() as isize { 0 } else { 1 }) };
    }
    // SAFETY: our descriptor (the child holds its own copy).
    unsafe { libc::close(fd) };
    let mut st = 0;
    // SAFETY: waits for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "child status {st}"
    );
    let mut got = Vec::new();
    s4.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"from the child");
    c5.write_all(b"alive").unwrap();
    echo_once(&mut s5);
    c5.read_exact(&mut b).unwrap();
    assert_eq!(
        &b, b"alive",
        "the parent's link group outlived the child's exit()"
    );

    // 7. A destination named on a connected stream (sendto/sendmsg, as sockperf does):
    // TCP ignores it, so must an SMC-R descriptor (an AF_UNIX socket would say EISCONN).
    let dest = socket2::SockAddr::from(addr);
    // SAFETY: sends our buffer, naming the peer's address of the right length.
    let n = unsafe {
        libc::sendto(
            c5.as_raw_fd(),
            b"to".as_ptr().cast(),
            2,
            0,
            dest.as_ptr().cast(),
            dest.len(),
        )
    };
    assert_eq!(
        n,
        2,
        "sendto with an address: {}",
        std::io::Error::last_os_error()
    );
    let mut iov = libc::iovec {
        iov_base: b"msg".as_ptr() as *mut libc::c_void,
        iov_len: 3,
    };
    // SAFETY: zeroed msghdr is valid (no name, no control); filled below.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_name = dest.as_ptr() as *mut libc::c_void;
    m.msg_namelen = dest.len();
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    // SAFETY: a valid msghdr pointing at live buffers.
    let n = unsafe { libc::sendmsg(c5.as_raw_fd(), &m, 0) };
    assert_eq!(
        n,
        3,
        "sendmsg with msg_name: {}",
        std::io::Error::last_os_error()
    );
    let mut five = [0u8; 5];
    // SAFETY: an all-zero sockaddr_storage is valid (plain integers).
    let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut from_len = std::mem::size_of_val(&from) as libc::socklen_t;
    let mut got = 0;
    while got < 5 {
        // SAFETY: receives into the rest of `five`, the source into `from`.
        let r = unsafe {
            libc::recvfrom(
                s5.as_raw_fd(),
                five[got..].as_mut_ptr().cast(),
                5 - got,
                0,
                (&mut from as *mut libc::sockaddr_storage).cast(),
                &mut from_len,
            )
        };
        assert!(r > 0, "recvfrom: {}", std::io::Error::last_os_error());
        got += r as usize;
    }
    assert_eq!(&five, b"tomsg");
    assert_eq!(
        from_len, 0,
        "recvfrom on a stream gives no source address, as TCP"
    );

    // 6. Pre-forking: a child accepts on the listener it inherited (the connection's
    // pump runs in this process, which listened) and echoes.
    // SAFETY: the child accepts, echoes and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = l.accept().is_ok_and(|(mut s, _)| {
            let mut b = [0u8; 5];
            s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok()
        });
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut c6 = TcpStream::connect(addr).unwrap();
    c6.write_all(b"fork!").unwrap();
    c6.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"fork!", "echoed by the child that accepted");
    let mut st = 0;
    // SAFETY: waits for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "child status {st}"
    );

    // 9. Urgent data both ways (MSG_OOB, RFC 7609 §4.7.5): the receiver reads up to the
    // mark, SIOCATMARK says it is there, POLLPRI announces it, recv(MSG_OOB) gets it,
    // and the data after it follows in-band.
    let c9 = TcpStream::connect(addr).unwrap();
    let (mut s9, _) = l.accept().unwrap();
    for (mut tx, mut rx) in [(&c9, &s9), (&s9, &c9)] {
        tx.write_all(b"ab").unwrap();
        // SAFETY: sends one byte from our buffer.
        assert_eq!(
            unsafe { libc::send(tx.as_raw_fd(), b"!".as_ptr().cast(), 1, libc::MSG_OOB) },
            1
        );
        tx.write_all(b"cd").unwrap();
        assert_ne!(
            poll1(rx.as_raw_fd(), libc::POLLPRI, 10_000) & libc::POLLPRI,
            0,
            "POLLPRI"
        );
        let mut two = [0u8; 2];
        rx.read_exact(&mut two).unwrap();
        assert_eq!(&two, b"ab", "reads stop at the mark");
        let mut mark: libc::c_int = 0;
        // SAFETY: SIOCATMARK writes one int.
        assert_eq!(unsafe { libc::ioctl(rx.as_raw_fd(), 0x8905, &mut mark) }, 0);
        assert_eq!(mark, 1, "SIOCATMARK at the urgent byte");
        let mut u = 0u8;
        // SAFETY: receives one byte into `u`.
        let n = unsafe { libc::recv(rx.as_raw_fd(), (&mut u as *mut u8).cast(), 1, libc::MSG_OOB) };
        assert_eq!(
            (n, u),
            (1, b'!'),
            "recv(MSG_OOB): {}",
            std::io::Error::last_os_error()
        );
        rx.read_exact(&mut two).unwrap();
        assert_eq!(&two, b"cd", "in-band data after the mark");
    }
    // An urgent byte alone, with nothing before or after it.
    // SAFETY: sends one byte from our buffer.
    assert_eq!(
        unsafe { libc::send(c9.as_raw_fd(), b"?".as_ptr().cast(), 1, libc::MSG_OOB) },
        1
    );
    assert_ne!(
        poll1(s9.as_raw_fd(), libc::POLLPRI, 10_000) & libc::POLLPRI,
        0
    );
    let mut u = 0u8;
    // SAFETY: receives one byte into `u`.
    let n = unsafe { libc::recv(s9.as_raw_fd(), (&mut u as *mut u8).cast(), 1, libc::MSG_OOB) };
    assert_eq!((n, u), (1, b'?'));
    drop(c9);
    let mut rest = Vec::new();
    s9.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    drop(s9);

    // 10. SO_RCVBUF / SO_SNDBUF set before connect() or listen() size the connection's
    // RMB and send buffer (an accepted one's from its listener's), as Linux sizes an
    // SMC socket's from sk_rcvbuf / sk_sndbuf; the parent finds the sizes in the
    // stats lines.
    let ls = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    ls.set_recv_buffer_size(32768).unwrap();
    ls.bind(&SocketAddr::new(addr.ip(), 0).into()).unwrap();
    ls.listen(8).unwrap();
    let l10: TcpListener = ls.into();
    let cs = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    cs.set_recv_buffer_size(65536).unwrap();
    cs.set_send_buffer_size(131072).unwrap();
    cs.connect(&l10.local_addr().unwrap().into()).unwrap();
    let mut c10: TcpStream = cs.into();
    let (mut s10, _) = l10.accept().unwrap();
    c10.write_all(b"sized").unwrap();
    echo_once(&mut s10);
    c10.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"sized");
    drop((c10, s10, l10));

    // 11. close() with SO_LINGER {1, 0} aborts, as TCP sends RST: the other end reads
    // ECONNRESET (then end of file, as after a TCP reset), and its TCP socket (TCP_INFO)
    // ends in CLOSE (reset), not CLOSE_WAIT.
    let c11 = TcpStream::connect(addr).unwrap();
    let (mut s11, _) = l.accept().unwrap();
    let c11s = socket2::SockRef::from(&c11);
    c11s.set_linger(Some(Duration::ZERO)).unwrap();
    assert_eq!(c11s.linger().unwrap(), Some(Duration::ZERO));
    drop(c11);
    let mut rest = Vec::new();
    let e = s11.read_to_end(&mut rest).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert_eq!(s11.read(&mut b).unwrap(), 0, "end of file after the reset");
    let tcp_state = |s: &TcpStream| {
        // SAFETY: an all-zero tcp_info is valid (plain integers).
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: getsockopt into a tcp_info of the given length.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0);
        info.tcpi_state
    };
    let t0 = std::time::Instant::now();
    while tcp_state(&s11) != 7 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(tcp_state(&s11), 7, "TCP_CLOSE after the peer's abort (RST)");
    drop(s11);

    // 12. TCP_CORK holds small writes until it is removed (tcp(7); at most 200 ms), on
    // the SMC-R connection as on TCP; getsockopt gives it back.
    let c12 = TcpStream::connect(addr).unwrap();
    let (mut s12, _) = l.accept().unwrap();
    let c12s = socket2::SockRef::from(&c12);
    // No getsockopt before the check below: the setsockopt alone must cork.
    c12s.set_tcp_cork(true).unwrap();
    let t12 = std::time::Instant::now();
    (&c12).write_all(b"co").unwrap();
    (&c12).write_all(b"rk").unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let mut queued: libc::c_int = -1;
    // SAFETY: FIONREAD writes one int.
    assert_eq!(
        unsafe { libc::ioctl(s12.as_raw_fd(), libc::FIONREAD, &mut queued) },
        0
    );
    // Only conclusive if this thread was not held up past the cork's ceiling.
    if t12.elapsed() < Duration::from_millis(150) {
        assert_eq!(queued, 0, "held by TCP_CORK");
    }
    assert!(c12s.tcp_cork().unwrap());
    c12s.set_tcp_cork(false).unwrap();
    assert!(!c12s.tcp_cork().unwrap());
    s12.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut four = [0u8; 4];
    s12.read_exact(&mut four).unwrap();
    assert_eq!(&four, b"cork", "sent once uncorked");
    drop((c12, s12));

    // 8. A server that daemonizes: a process listens, forks, and exits; its child,
    // accepting on the inherited listener, takes over the accept task once the
    // listening process is gone (nginx's default: daemon on). The child then opens a
    // connection of its own: SMC-R too (its own stack, the parent's threads are not
    // in it). Both processes are forked children of this one, so each starts its own
    // stack on addresses this process uses (the RoCEv2 port is shared).
    let daemon_ip = ip(3);
    let mut pipe = [0; 2];
    // SAFETY: `pipe` has room for two descriptors.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    l.set_nonblocking(false).unwrap();
    // The daemon is reparented to this process when its parent exits, so it can be
    // waited for.
    // SAFETY: prctl with integer arguments.
    assert_eq!(
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) },
        0
    );
    // SAFETY: the child listens, forks, writes the port and exits.
    let d1 = unsafe { libc::fork() };
    assert!(d1 >= 0);
    if d1 == 0 {
        let l8 = TcpListener::bind(format!("{daemon_ip}:0")).unwrap();
        let port = l8.local_addr().unwrap().port();
        // SAFETY: the daemon accepts, echoes, connects, and calls _exit.
        let d2 = unsafe { libc::fork() };
        if d2 == 0 {
            // Waiting in poll() starts the takeover as accept() would. A connection
            // that never comes (the test failed before it connected) ends the daemon
            // instead of leaving it to hold the test's output open.
            let mut p = libc::pollfd {
                fd: l8.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd; the listener is open.
            if unsafe { libc::poll(&mut p, 1, 90_000) } != 1 {
                // SAFETY: ends the daemon.
                unsafe { libc::_exit(3) };
            }
            let ok = l8.accept().is_ok_and(|(mut s, _)| {
                let mut b = [0u8; 5];
                s.set_read_timeout(Some(Duration::from_secs(60))).is_ok()
                    && s.read_exact(&mut b).is_ok()
                    && s.write_all(&b).is_ok()
            }) && TcpStream::connect(addr).is_ok_and(|mut c| {
                c.set_read_timeout(Some(Duration::from_secs(60))).is_ok()
                    && c.write_all(b"child").is_ok()
                    && c.shutdown(Shutdown::Write).is_ok()
                    && {
                        let mut e = Vec::new();
                        c.read_to_end(&mut e).is_ok()
                    }
            });
            // SAFETY: ends the daemon, running its exit handlers (the drain).
            unsafe { libc::exit(if ok { 0 } else { 1 }) };
        }
        let msg = [u32::from(port), d2 as u32];
        // SAFETY: writes eight bytes to the pipe.
        unsafe { libc::write(pipe[1], msg.as_ptr().cast(), 8) };
        // SAFETY: the listening process leaves as a daemonizing parent does.
        unsafe { libc::exit(if d2 > 0 { 0 } else { 1 }) };
    }
    let mut msg = [0u32; 2];
    // SAFETY: reads eight bytes from the pipe.
    assert_eq!(
        unsafe { libc::read(pipe[0], msg.as_mut_ptr().cast(), 8) },
        8
    );
    let [port, d2] = msg;
    let mut st = 0;
    // SAFETY: waits for our child (the listening process).
    assert_eq!(unsafe { libc::waitpid(d1, &mut st, 0) }, d1);
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "listening process {st}"
    );
    let daemon: SocketAddr = format!("{daemon_ip}:{port}").parse().unwrap();
    let mut c8 = TcpStream::connect(daemon).unwrap();
    c8.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    c8.write_all(b"daemn").unwrap();
    c8.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"daemn", "echoed by the daemon after its parent exited");
    let (mut s8, _) = l.accept().unwrap();
    let mut got = Vec::new();
    s8.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"child", "a connection the daemon opened itself");
    drop(s8);
    drop(c8);
    // SAFETY: waits for the daemon (reparented to us).
    assert_eq!(unsafe { libc::waitpid(d2 as i32, &mut st, 0) }, d2 as i32);
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "daemon {st}"
    );
}

/// `close()` with `SO_LINGER` {1, t > 0} returns once what was written is confirmed in the
/// peer's RMB, as TCP's returns once its data is acknowledged: a forked child writes
/// 1 MiB, closes with a linger time and leaves with `_exit` (no exit handler drains
/// anything); the server still reads every byte. On both paths (SMC-R, same host).
#[test]
fn so_linger_close_waits_under_ld_preload() {
    run_under_preload("child_linger", false);
    run_under_preload("child_linger", true);
}

#[test]
#[ignore = "run by so_linger_close_waits_under_ld_preload, under LD_PRELOAD"]
fn child_linger() {
    const LEN: usize = 1 << 20;
    let server = std::env::var("SMC_PRELOAD_TEST_SERVER").expect("run by the parent test");
    let l = TcpListener::bind(format!("{server}:0")).unwrap();
    let addr = l.local_addr().unwrap();
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
    // SAFETY: the child connects, writes, closes and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = (|| -> std::io::Result<()> {
            let mut c = TcpStream::connect(addr)?;
            socket2::SockRef::from(&c).set_linger(Some(Duration::from_secs(20)))?;
            c.write_all(&data)?;
            drop(c); // close(): waits until the data is confirmed
            Ok(())
        })()
        .is_ok();
        // SAFETY: ends the child at once: no exit handler, no drain of the pumps.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = vec![0u8; LEN];
    s.read_exact(&mut got)
        .expect("every byte written before the lingering close");
    assert!(got == data, "the bytes arrived intact");
    let mut st = 0;
    // SAFETY: waits for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "child status {st}"
    );
}

/// What the program writes arrives in order and each write whole, however the writes
/// meet the pump: one thread writing with every call of the family (write, writev,
/// send, sendto, sendmsg) and an urgent byte in the middle while the reader waits (the
/// connection fills, then the socketpair, then the writer blocks); four threads writing
/// records at once; a non-blocking writer until EAGAIN, writable again once drained; a
/// write after shutdown(SHUT_WR) fails with EPIPE. On both paths.
#[test]
fn writes_keep_order_under_ld_preload() {
    for same_host in [false, true] {
        let log = run_under_preload("child_writes", same_host);
        assert_eq!(
            log.lines().filter(|l| l.contains(" close ")).count(),
            6,
            "{log}"
        );
    }
}

/// The byte at `i` of a test stream.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

#[test]
#[ignore = "run by writes_keep_order_under_ld_preload, under LD_PRELOAD"]
fn child_writes() {
    use std::io::IoSlice;
    let server = std::env::var("SMC_PRELOAD_TEST_SERVER").expect("run by the parent test");
    let l = TcpListener::bind(format!("{server}:0")).unwrap();
    let addr = l.local_addr().unwrap();

    // 1. One thread, every call of the family, 6 MiB, an urgent byte after the first
    // half; the reader starts late.
    const TOTAL: usize = 6 << 20;
    const MARK: usize = TOTAL / 2;
    let c = TcpStream::connect(addr).unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let writer = std::thread::spawn(move || {
        let fd = c.as_raw_fd();
        let sizes = [1usize, 3, 100, 1000, 4096, 65536, 200_000, 17, 300_000];
        let (mut off, mut k) = (0usize, 0usize);
        while off < TOTAL {
            let end = if off < MARK { MARK } else { TOTAL };
            let len = sizes[k % sizes.len()].min(end - off);
            let buf: Vec<u8> = (off..off + len).map(pattern).collect();
            let (a, b) = buf.split_at(len / 2);
            let iov = [IoSlice::new(a), IoSlice::new(b)];
            // SAFETY (all five): our buffer/iovecs, valid for the call.
            let n = match k % 5 {
                0 => unsafe { libc::write(fd, buf.as_ptr().cast(), len) },
                1 => unsafe { libc::writev(fd, iov.as_ptr().cast(), 2) },
                2 => unsafe { libc::send(fd, buf.as_ptr().cast(), len, 0) },
                3 => unsafe {
                    libc::sendto(
                        fd,
                        buf.as_ptr().cast(),
                        len,
                        libc::MSG_NOSIGNAL,
                        std::ptr::null(),
                        0,
                    )
                },
                _ => unsafe {
                    let mut m: libc::msghdr = std::mem::zeroed();
                    m.msg_iov = iov.as_ptr().cast_mut().cast();
                    m.msg_iovlen = 2;
                    libc::sendmsg(fd, &m, 0)
                },
            };
            assert_eq!(
                n,
                len as isize,
                "a blocking write writes all: {}",
                std::io::Error::last_os_error()
            );
            off += len;
            k += 1;
            if off == MARK {
                // SAFETY: sends one byte from our buffer.
                assert_eq!(
                    unsafe { libc::send(fd, b"U".as_ptr().cast(), 1, libc::MSG_OOB) },
                    1
                );
            }
        }
        c.shutdown(Shutdown::Write).unwrap();
        c
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut got = vec![0u8; MARK];
    s.read_exact(&mut got).unwrap();
    assert!(
        got.iter().enumerate().all(|(i, b)| *b == pattern(i)),
        "first half in order"
    );
    assert_ne!(
        poll1(s.as_raw_fd(), libc::POLLPRI, 10_000) & libc::POLLPRI,
        0
    );
    let mut u = 0u8;
    // SAFETY: receives one byte into `u`.
    let n = unsafe { libc::recv(s.as_raw_fd(), (&mut u as *mut u8).cast(), 1, libc::MSG_OOB) };
    assert_eq!((n, u), (1, b'U'), "the urgent byte at its place");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert_eq!(rest.len(), TOTAL - MARK);
    assert!(
        rest.iter()
            .enumerate()
            .all(|(i, b)| *b == pattern(MARK + i)),
        "second half in order"
    );
    drop(writer.join().unwrap());
    drop(s);

    // 2. Four threads write 20,000-byte records at once; each arrives whole, each
    // thread's in its order.
    const RECORDS: usize = 300;
    const REC: usize = 20_000;
    let c2 = std::sync::Arc::new(TcpStream::connect(addr).unwrap());
    let (mut s2, _) = l.accept().unwrap();
    s2.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let writers: Vec<_> = (0..4u8)
        .map(|t| {
            let c2 = c2.clone();
            std::thread::spawn(move || {
                for seq in 0..RECORDS as u32 {
                    let mut r = vec![t ^ seq as u8; REC];
                    r[0] = t;
                    r[1..5].copy_from_slice(&seq.to_le_bytes());
                    // SAFETY: our record, valid for the call.
                    let n = unsafe { libc::write(c2.as_raw_fd(), r.as_ptr().cast(), REC) };
                    assert_eq!(n, REC as isize);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut next = [0u32; 4];
    let mut r = vec![0u8; REC];
    for _ in 0..4 * RECORDS {
        s2.read_exact(&mut r).unwrap();
        let t = r[0] as usize;
        assert!(t < 4, "a record starts where one ended");
        let seq = u32::from_le_bytes(r[1..5].try_into().unwrap());
        assert_eq!(seq, next[t], "thread {t}'s records in order");
        assert!(
            r[5..].iter().all(|b| *b == t as u8 ^ seq as u8),
            "record whole"
        );
        next[t] += 1;
    }
    for w in writers {
        w.join().unwrap();
    }
    drop(c2);
    let mut tail = Vec::new();
    s2.read_to_end(&mut tail).unwrap();
    assert!(tail.is_empty());

    // 3. Non-blocking: writes until EAGAIN (connection, then socketpair full), every
    // byte arrives; the descriptor is writable again once the reader drained it; after
    // shutdown(SHUT_WR) a write fails with EPIPE and the reader sees end of file.
    let c3 = TcpStream::connect(addr).unwrap();
    let (mut s3, _) = l.accept().unwrap();
    s3.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c3.set_nonblocking(true).unwrap();
    let mut written = 0usize;
    loop {
        let buf: Vec<u8> = (written..written + 65536).map(pattern).collect();
        match (&c3).write(&buf) {
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("non-blocking write: {e}"),
        }
        assert!(written < 1 << 30, "never full");
    }
    let mut got = vec![0u8; written];
    s3.read_exact(&mut got).unwrap();
    assert!(got.iter().enumerate().all(|(i, b)| *b == pattern(i)));
    assert_ne!(
        poll1(c3.as_raw_fd(), libc::POLLOUT, 10_000) & libc::POLLOUT,
        0
    );
    c3.shutdown(Shutdown::Write).unwrap();
    // SAFETY: one byte from our buffer; MSG_NOSIGNAL: EPIPE instead of SIGPIPE.
    let n = unsafe { libc::send(c3.as_raw_fd(), b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    assert_eq!(n, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPIPE)
    );
    let mut tail = Vec::new();
    s3.read_to_end(&mut tail).unwrap();
    assert!(tail.is_empty(), "nothing after the half-close");
}
