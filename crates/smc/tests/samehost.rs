//! The same-host path (docs/samehost.md) between two stacks of this process: which path
//! a connection takes, data integrity both ways, flow control, leaks over many
//! connections, a peer scribbling on the shared memory, a peer that vanishes, and a
//! stack with a same-host peer and an SMC-R peer at once. The close/abort/urgent
//! scenarios of `close.rs` run on this path with `SMC_RS_TEST_SAME_HOST=1`
//! (scripts/test.sh does).
//!
//! `SMC_RS_SAMEHOST_FULL=1` runs the long loops in full (1,000 sequential and 1,000
//! concurrent connections, 1 GiB each way); by default they run short.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use smc::{Mode, SmcListener, SmcStream, Stack, StackConfig};

/// The tests of this file run one at a time: the scribbling test finds its connection's
/// memory as the mappings that appear while it connects, and the leak test counts this
/// process's mappings and descriptors.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn full() -> bool {
    std::env::var("SMC_RS_SAMEHOST_FULL").is_ok_and(|v| v == "1")
}

/// A pair of stacks with the same-host path on both (or as the closures say).
fn sh_pair_with(
    srv: impl FnOnce(&mut StackConfig),
    cli: impl FnOnce(&mut StackConfig),
) -> (Stack, Stack) {
    pair_with(
        |c| {
            enable_same_host(c);
            srv(c)
        },
        |c| {
            enable_same_host(c);
            cli(c)
        },
    )
}

fn sh_pair() -> (Stack, Stack) {
    sh_pair_with(|_| {}, |_| {})
}

fn connect_pair(srv: &Stack, cli: &Stack) -> (SmcStream, SmcStream) {
    let l = listen(srv);
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || l.accept().unwrap().0);
    let c = SmcStream::connect_with(cli, addr).unwrap();
    (c, t.join().unwrap())
}

/// Mappings of same-host memfds in this process (`/proc/self/maps`).
fn shm_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:smc-rs-samehost"))
        .count()
}

/// The inodes of the same-host memfds mapped in this process now.
fn shm_inodes() -> Vec<u64> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:smc-rs-samehost"))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect()
}

/// Open descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// What the open descriptors are, by kind (for failure reports).
fn fd_kinds() -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let t = std::fs::read_link(e.path())
            .map(|p| {
                p.to_string_lossy()
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_default();
        *m.entry(t).or_insert(0) += 1;
    }
    m
}

#[test]
fn both_on_takes_the_same_host_path_and_one_off_stays_smc_r() {
    let _serial = serial();
    let (srv, cli) = sh_pair();
    let (c, s) = connect_pair(&srv, &cli);
    assert!(c.mode().is_same_host(), "{}", c.mode());
    assert!(s.mode().is_same_host(), "{}", s.mode());
    assert!(c.mode().is_smc());
    let Mode::SameHost { peer_pid } = c.mode() else {
        unreachable!()
    };
    assert_eq!(peer_pid as u32, std::process::id());
    // Same-host RMBs have their own size (larger than SMC-R's by default).
    assert_eq!(cli.config().same_host_rmb_size, 1 << 20);
    assert_eq!(c.buffer_sizes().map(|b| b.0), Some(1 << 20));
    assert_eq!(s.buffer_sizes().map(|b| b.0), Some(1 << 20));
    assert!(c.mode().to_string().contains("same-host"), "{}", c.mode());
    assert_eq!(cli.stats().same_host_connections, 1);
    assert_eq!(cli.stats().link_groups, 0, "no RDMA on this path");
    assert_eq!(srv.stats().same_host_total, 1);
    assert!(cli
        .connections()
        .iter()
        .any(|i| i.mode == "same-host" && i.lgr.is_none()));
    (&c).write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    drop((c, s));

    // The server does not take the offer: SMC-R over the RNIC, as with a Linux peer.
    // Sized by the configuration (both ends the same here; each side's RMB is its own).
    let (srv, cli) = sh_pair_with(
        |c| c.same_host_rmb_size = 64 << 10,
        |c| c.same_host_rmb_size = 128 << 10,
    );
    let (c, s) = connect_pair(&srv, &cli);
    assert!(c.mode().is_same_host());
    assert_eq!(c.buffer_sizes().map(|b| b.0), Some(128 << 10));
    assert_eq!(s.buffer_sizes().map(|b| b.0), Some(64 << 10));
    drop((c, s));
    let (srv, cli) = sh_pair_with(|c| c.same_host = false, |_| {});
    let (c, s) = connect_pair(&srv, &cli);
    assert!(matches!(c.mode(), Mode::Smc { .. }), "{}", c.mode());
    assert!(matches!(s.mode(), Mode::Smc { .. }), "{}", s.mode());
    // The client does not offer.
    let (srv, cli) = sh_pair_with(|_| {}, |c| c.same_host = false);
    let (c2, _s2) = connect_pair(&srv, &cli);
    assert!(matches!(c2.mode(), Mode::Smc { .. }), "{}", c2.mode());
    // Different socket directories (another mount namespace, say): no proof, SMC-R.
    let (srv, cli) = sh_pair_with(
        |c| c.same_host_dir = std::env::temp_dir().join("smc-rs-test-samehost-other"),
        |_| {},
    );
    let (c3, _s3) = connect_pair(&srv, &cli);
    assert!(matches!(c3.mode(), Mode::Smc { .. }), "{}", c3.mode());
    drop((c, s));
}

#[test]
fn bulk_both_ways_hash_verified() {
    let _serial = serial();
    let (srv, cli) = sh_pair();
    let (c, s) = connect_pair(&srv, &cli);
    assert!(c.mode().is_same_host());
    let total = if full() { 1 << 30 } else { 64 << 20 };
    let (c, s) = (Arc::new(c), Arc::new(s));
    let mut th = Vec::new();
    for (tx, seed) in [(c.clone(), 1u64), (s.clone(), 2u64)] {
        th.push(thread::spawn(move || {
            let h = send_stream(&tx, seed, total, 65536 + 17);
            tx.shutdown(Shutdown::Write).unwrap();
            h
        }));
    }
    let rs = {
        let s = s.clone();
        thread::spawn(move || recv_stream(&s, usize::MAX))
    };
    let (got_c, h_c) = recv_stream(&c, usize::MAX);
    let (got_s, h_s) = rs.join().unwrap();
    let sent_c = th.remove(0).join().unwrap();
    let sent_s = th.remove(0).join().unwrap();
    assert_eq!((got_s, got_c), (total, total));
    assert_eq!(h_s, sent_c, "client → server bytes differ");
    assert_eq!(h_c, sent_s, "server → client bytes differ");
    // Writers waited for their readers rather than fill the send buffer: bytes went
    // straight from the application's buffer into the peer's RMB.
    for (name, st) in [("client", &cli), ("server", &srv)] {
        let info = st.connections();
        let i = info
            .iter()
            .find(|i| i.mode == "same-host")
            .expect("the connection is listed");
        assert_eq!(i.bytes_sent, total as u64, "{name}");
        assert!(
            i.bytes_placed > 0 && i.bytes_placed <= i.bytes_sent,
            "{name}: {} of {} bytes placed",
            i.bytes_placed,
            i.bytes_sent
        );
        eprintln!(
            "{name}: {} of {} bytes placed",
            i.bytes_placed, i.bytes_sent
        );
    }
}

/// Connections that sent more CDCs than a ring has slots (64) and end with both sides
/// half-closing and then closing at about the same time (as `smc bench`'s do):
/// whichever stack releases its connection first gives its region back and zeroes its
/// ring while the other still takes the last CDCs. A connection that sent its last CDC
/// must not look at the peer's ring any more: its TAIL, back at 0, read as a broken ring
/// and the connection ended with a reset.
#[test]
fn simultaneous_closes_break_no_ring() {
    let _serial = serial();
    let (srv, cli) = sh_pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    let n = if full() { 1000 } else { 100 };
    let server = thread::spawn(move || {
        for _ in 0..n {
            let (s, _) = l.accept().unwrap();
            let mut b = [0u8; 16];
            for _ in 0..80 {
                (&s).read_exact(&mut b[..1]).unwrap();
                (&s).write_all(&b[..1]).unwrap();
            }
            let mut got = 0;
            loop {
                match (&s).read(&mut b).unwrap() {
                    0 => break,
                    k => got += k,
                }
            }
            (&s).write_all(&(got as u64).to_be_bytes()).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
        }
    });
    for i in 0..n {
        let c = SmcStream::connect_with(&cli, addr).unwrap();
        assert!(c.mode().is_same_host());
        for k in 0..80u8 {
            (&c).write_all(&[k]).unwrap();
            let mut b = [0u8; 1];
            (&c).read_exact(&mut b).unwrap();
            assert_eq!(b[0], k);
        }
        (&c).write_all(&pattern(i as u64, 1 + i % 13)).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut b = [0u8; 8];
        (&c).read_exact(&mut b).unwrap();
        assert_eq!(u64::from_be_bytes(b), 1 + i as u64 % 13);
        assert_eq!((&c).read(&mut b).unwrap(), 0);
    }
    server.join().unwrap();
    wait_until(Duration::from_secs(10), || {
        cli.stats().smc_connections == 0 && srv.stats().smc_connections == 0
    });
    assert_eq!(
        (
            cli.stats().same_host_violations,
            srv.stats().same_host_violations
        ),
        (0, 0),
        "well-behaved peers broke no ring"
    );
}

/// Both ends write more than the peer's RMB holds before either reads (a pattern TCP's
/// buffers allow): the writers first place into the peer's RMB, wait a little for a
/// reader that does not come, then fill their send buffers, and everything arrives.
#[test]
fn writers_ahead_of_readers_use_the_send_buffer_too() {
    let _serial = serial();
    let (srv, cli) = sh_pair();
    let (c, s) = connect_pair(&srv, &cli);
    let (rmb, sndbuf) = c.buffer_sizes().unwrap();
    assert_eq!(s.buffer_sizes(), Some((rmb, sndbuf)));
    let total = rmb + sndbuf / 2;
    let (c, s) = (Arc::new(c), Arc::new(s));
    let mut th = Vec::new();
    for (tx, seed) in [(c.clone(), 3u64), (s.clone(), 4u64)] {
        th.push(thread::spawn(move || {
            // Without the send buffer both writers would wait for ever.
            tx.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
            let data = pattern(seed, total);
            (&*tx).write_all(&data).unwrap();
            data
        }));
    }
    let sent_c = th.remove(0).join().unwrap();
    let sent_s = th.remove(0).join().unwrap();
    let mut got = vec![0u8; total];
    (&*s).read_exact(&mut got).unwrap();
    assert!(got == sent_c, "client → server bytes differ");
    (&*c).read_exact(&mut got).unwrap();
    assert!(got == sent_s, "server → client bytes differ");
    let i = cli.connections();
    let i = i.iter().find(|i| i.mode == "same-host").unwrap();
    assert_eq!(i.bytes_sent, total as u64);
    assert_eq!(
        i.bytes_placed, rmb as u64,
        "the RMB placed, the rest written"
    );
}

/// A thread inside a read or write call counts as polling the ring, so the peer does
/// not ring for the CDCs it publishes meanwhile (api::samehost::Polling): the call must
/// take them before it returns. Here the peer's one byte is published while our
/// writer copies 256 KiB into the peer's RMB, and our reader sleeps on the doorbell (no spin) waiting for
/// it; nothing else comes on the connection until the reader has it. Had the writer's
/// call left the byte in the ring, the reader would sleep until its timeout. Loops until
/// the peer's write fell inside our writer's call a few times.
#[test]
fn a_cdc_published_during_a_call_is_taken_by_that_call() {
    use std::sync::mpsc;
    let _serial = serial();
    let (srv, cli) = sh_pair_with(|_| {}, |c| c.same_host_spin = Duration::ZERO);
    let (c, s) = connect_pair(&srv, &cli);
    assert!(matches!(c.mode(), Mode::SameHost { .. }));
    // One write call copies at most what the peer's RMB and our send buffer allow
    // (the send buffer counts placed bytes until the peer consumes them): the smaller,
    // which the peer reads whole before the next round, so the window stays open.
    let (rmb, sndbuf) = c.buffer_sizes().unwrap();
    let chunk = rmb.min(sndbuf);
    let big = pattern(9, chunk);
    // "Go" is a word the peer spins on (a channel's wake-up takes longer than our call).
    let go = AtomicU64::new(0);
    let (sent_tx, sent_rx) = mpsc::channel::<(Instant, Instant)>();
    let (drain_tx, drain_rx) = mpsc::channel::<()>();
    let (got_tx, got_rx) = mpsc::channel::<()>();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    thread::scope(|sc| {
        let (c, s, go) = (&c, &s, &go);
        // Owned here: a failing round drops it, which ends the peer's thread.
        let drain_tx = drain_tx;
        // The peer: one byte a little after each "go", and reading our chunk only when
        // told (its window updates would ring our bell and hide a byte left behind).
        sc.spawn(move || {
            let mut buf = vec![0u8; chunk];
            let mut round = 0u64;
            loop {
                let mut spins = 0u32;
                let g = loop {
                    let g = go.load(Ordering::Acquire);
                    if g != round {
                        break g;
                    }
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(1024) {
                        // Others may need this CPU (two in CI).
                        thread::yield_now();
                    }
                    std::hint::spin_loop();
                };
                if g == u64::MAX {
                    return;
                }
                round = g;
                let t = Instant::now();
                while t.elapsed() < Duration::from_micros(round % 16) {
                    std::hint::spin_loop();
                }
                let t0 = Instant::now();
                (&*s).write_all(b"x").unwrap();
                sent_tx.send((t0, Instant::now())).unwrap();
                if drain_rx.recv().is_err() {
                    return;
                }
                (&*s).read_exact(&mut buf).unwrap();
            }
        });
        // Our reader, asleep on the doorbell.
        sc.spawn(move || {
            let mut b = [0u8; 1];
            while (&*c).read_exact(&mut b).is_ok() {
                assert_eq!(&b, b"x");
                if got_tx.send(()).is_err() {
                    return;
                }
            }
        });
        let stop = StopOnDrop(go);
        let mut hits = 0;
        let mut rounds = 0u64;
        while hits < 5 {
            assert!(rounds < 2000, "the peer's write never fell inside our call");
            // Let the reader fall asleep.
            thread::sleep(Duration::from_millis(2));
            rounds += 1;
            go.store(rounds, Ordering::Release);
            let t0 = Instant::now();
            let n = (&*c).write(&big).unwrap();
            let t1 = Instant::now();
            assert_eq!(n, chunk, "the window was open");
            let (p0, p1) = sent_rx.recv().unwrap();
            if t0 < p0 && p1 < t1 {
                hits += 1;
            }
            got_rx
                .recv_timeout(Duration::from_secs(10))
                .expect("the peer's byte was left in the ring: our reader never woke");
            drain_tx.send(()).unwrap();
        }
        eprintln!("{hits} of {rounds} rounds had the peer's write inside our call");
        drop(stop);
        c.shutdown(Shutdown::Both).unwrap();
    });
}

/// Stops the spinning peer of `a_cdc_published_during_a_call_is_taken_by_that_call`
/// however the test ends.
struct StopOnDrop<'a>(&'a AtomicU64);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(u64::MAX, Ordering::Release);
    }
}

#[test]
fn small_messages_ping_pong_and_odd_sizes() {
    let _serial = serial();
    let (srv, cli) = sh_pair();
    let (c, s) = connect_pair(&srv, &cli);
    let echo = thread::spawn(move || {
        let mut b = vec![0u8; 70_000];
        loop {
            match (&s).read(&mut b) {
                Ok(0) | Err(_) => return,
                Ok(n) => (&s).write_all(&b[..n]).unwrap(),
            }
        }
    });
    for (i, len) in [1usize, 7, 8, 9, 1023, 4096, 65_537, 1, 3]
        .iter()
        .enumerate()
    {
        let data = pattern(i as u64, *len);
        (&c).write_all(&data).unwrap();
        let mut got = vec![0u8; *len];
        (&c).read_exact(&mut got).unwrap();
        assert!(got == data, "round trip of {len} bytes");
    }
    for _ in 0..2000 {
        (&c).write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        (&c).read_exact(&mut b).unwrap();
    }
    drop(c);
    echo.join().unwrap();
}

#[test]
fn many_sequential_and_concurrent_connections_leave_nothing() {
    let _serial = serial();
    let (srv, cli) = sh_pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    // Warm up (threads, sockets, the socket thread and the two stacks' session exist
    // from here on).
    assert!(echo_once(&cli, addr, 0, 100).is_same_host());
    // This thread sleeps once in a blocking read, so that its sleeper eventfd (one per
    // thread that ever blocks on a same-host connection, for the thread's life) is
    // counted in the baseline.
    {
        let c = SmcStream::connect_with(&cli, addr).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!((&c).read(&mut b).unwrap_err().kind(), ErrorKind::WouldBlock);
    }
    let settle = |n: usize| {
        wait_until(Duration::from_secs(10), || {
            cli.stats().smc_connections == 0 && srv.stats().smc_connections == n
        })
    };
    let n = if full() { 1000 } else { 200 };
    thread::sleep(Duration::from_millis(100));
    let (fds0, maps0, tok0) = (fds(), shm_mappings(), cli.stats().alert_tokens);
    // What the two stacks may keep for their next connections: each keeps at most 16 of
    // its regions free for the other (shm FREE_PER_SESSION), each mapped by both stacks
    // (in this one process: two mappings), and each with its doorbell eventfd held by
    // its owner and by the peer. Everything beyond that must go.
    const POOL_MAPS: usize = 2 * 16 * 2;
    const POOL_FDS: usize = 2 * 16 * 2;
    let mut regions = std::collections::BTreeSet::new();
    for i in 0..n {
        let m = echo_once(&cli, addr, i as u64, 1000 + i);
        assert!(m.is_same_host(), "{m}");
        regions.extend(shm_inodes());
    }
    assert!(settle(0), "{:?} {:?}", cli.stats(), srv.stats());
    // A connection whose last CDC is out no longer looks at the peer's ring: the peer
    // may already have zeroed it for its next connection (it read as a broken ring).
    assert_eq!(
        (
            cli.stats().same_host_violations,
            srv.stats().same_host_violations
        ),
        (0, 0),
        "well-behaved peers broke no ring"
    );
    // Connections that ended cleanly gave their regions back to the session and the
    // next ones took them by number: a handful of memfds served all of them (without
    // the reuse, two new ones per connection).
    assert!(
        regions.len() <= 16,
        "{} distinct memfd regions over {n} sequential connections",
        regions.len()
    );
    assert!(
        wait_until(Duration::from_secs(20), || fds() <= fds0 + POOL_FDS
            && shm_mappings() <= POOL_MAPS),
        "fds {} (before {fds0}): {:?}; mappings {} (before {maps0})",
        fds(),
        fd_kinds(),
        shm_mappings()
    );
    assert_eq!(cli.stats().alert_tokens, tok0);
    assert_eq!(srv.stats().alert_tokens, 0);
    // The released connections' send buffers wait for the next ones (at most
    // rmb_cache, 16), none in use.
    let pooled: usize = cli.buffer_sizes().sndbufs.values().sum();
    assert!((1..=16).contains(&pooled), "{pooled} send buffers kept");
    assert_eq!(cli.stats().same_host_total, n as u64 + 2);

    // All open at once.
    let conns: Vec<SmcStream> = (0..n)
        .map(|_| SmcStream::connect_with(&cli, addr).unwrap())
        .collect();
    assert_eq!(cli.stats().same_host_connections, n);
    for (i, c) in conns.iter().enumerate() {
        assert!(c.mode().is_same_host());
        let data = pattern(i as u64, 333);
        (&*c)
            .write_all(&data)
            .unwrap_or_else(|e| panic!("connection {i}: {e} ({:?})", cli.stats()));
    }
    for (i, c) in conns.iter().enumerate() {
        let mut got = vec![0u8; 333];
        (&*c)
            .read_exact(&mut got)
            .unwrap_or_else(|e| panic!("connection {i}: {e} ({:?})", cli.stats()));
        assert!(got == pattern(i as u64, 333));
    }
    // Two memfds per connection, each mapped (control page and RMB in one mapping) by
    // its owner and by the peer.
    assert!(
        shm_mappings() >= 4 * n,
        "{} mappings for {n} connections",
        shm_mappings()
    );
    drop(conns);
    assert!(settle(0), "{:?} {:?}", cli.stats(), srv.stats());
    assert!(
        wait_until(Duration::from_secs(10), || fds() <= fds0 + POOL_FDS
            && shm_mappings() <= POOL_MAPS),
        "fds {} (before {fds0}), mappings {} (before {maps0})",
        fds(),
        shm_mappings()
    );
}

/// A peer that writes garbage into the shared control page (outside the cursor
/// protocol) ends only that connection; its other connections and the stack go on.
#[test]
fn scribbling_on_the_shared_memory_ends_only_that_connection() {
    let _serial = serial();
    let (srv, cli) = sh_pair();
    let (a_c, a_s) = connect_pair(&srv, &cli);
    let before: Vec<String> = maps_of_shm();
    let (b_c, b_s) = connect_pair(&srv, &cli);
    let new: Vec<String> = maps_of_shm()
        .into_iter()
        .filter(|l| !before.contains(l))
        .collect();
    // B's control pages (the first 4 KiB of each mapping of a region: one mapping from
    // file offset 0 holds the control page and the RMB), written through
    // /proc/self/map_files like any process holding the memfd could.
    let mut hit = 0;
    for l in &new {
        let mut cols = l.split_whitespace();
        let range = cols.next().unwrap();
        let offset = cols.nth(1).unwrap();
        if u64::from_str_radix(offset, 16).unwrap() != 0 {
            continue;
        }
        let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/self/map_files/{range}"))
        else {
            eprintln!("skipped: /proc/self/map_files needs CAP_SYS_ADMIN");
            return;
        };
        f.write_all(&[0xa5; 4096]).unwrap();
        hit += 1;
    }
    assert!(hit >= 2, "B's control pages found: {new:?}");
    // B notices at its next look at the ring and aborts; A is untouched.
    (&b_c).write_all(b"after scribble").ok();
    b_s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    b_c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    let r1 = (&b_s).read(&mut buf);
    let r2 = (&b_c).read(&mut buf);
    assert!(
        r1.is_err() || r2.is_err(),
        "the scribbled connection must fail: {r1:?} {r2:?}"
    );
    let violations = srv.stats().same_host_violations + cli.stats().same_host_violations;
    assert!(violations >= 1, "the broken ring is counted");
    let data = pattern(9, 1 << 20);
    let d2 = data.clone();
    let w = thread::spawn(move || (&a_c).write_all(&d2).unwrap());
    let mut got = vec![0u8; data.len()];
    (&a_s).read_exact(&mut got).unwrap();
    w.join().unwrap();
    assert!(got == data, "the other connection's data is intact");
    // The stack still makes new connections.
    let (c, s) = connect_pair(&srv, &cli);
    (&c).write_all(b"fine").unwrap();
    let mut b = [0u8; 4];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"fine");
}

fn maps_of_shm() -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:smc-rs-samehost"))
        .map(str::to_string)
        .collect()
}

/// The peer's TCP connection ends without the SMC close flags (its process died): the
/// survivor aborts at once instead of waiting, blocked reader and writer included.
#[test]
fn peer_gone_ends_blocked_reader_and_writer() {
    let _serial = serial();
    let (srv, cli) = sh_pair();
    let (c, s) = connect_pair(&srv, &cli);
    let c = Arc::new(c);
    let reader = {
        let c = c.clone();
        thread::spawn(move || {
            let mut b = [0u8; 8];
            (&*c).read(&mut b)
        })
    };
    let writer = {
        let c = c.clone();
        thread::spawn(move || {
            let chunk = vec![0u8; 1 << 20];
            loop {
                if let Err(e) = (&*c).write(&chunk) {
                    return e;
                }
            }
        })
    };
    thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    // Like a SIGKILL of the server process: its stack stops (the kernel would close its
    // sockets; here the stack's shutdown does) and nothing follows.
    drop(srv);
    let e = reader.join().unwrap().unwrap_err();
    assert!(
        matches!(
            e.kind(),
            ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
        ),
        "{e}"
    );
    let e = writer.join().unwrap();
    assert!(
        matches!(
            e.kind(),
            ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
        ),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    drop((c, s));
    assert!(wait_until(Duration::from_secs(10), || cli
        .stats()
        .smc_connections
        == 0));
}

/// One stack with a same-host peer (shared memory) and an SMC-R peer (the software
/// RNIC) at the same time, both moving data.
#[test]
fn one_stack_with_a_same_host_peer_and_an_smc_r_peer() {
    let _serial = serial();
    init_tracing();
    let mut a = config(&server_ip(), &client_ip());
    enable_same_host(&mut a);
    let mut b = config(&ip(3), &client_ip());
    b.same_host = false;
    let mut c = config(&client_ip(), &format!("{},{}", server_ip(), ip(3)));
    enable_same_host(&mut c);
    let (a, b, c) = (
        Stack::new(a).unwrap(),
        Stack::new(b).unwrap(),
        Stack::new(c).unwrap(),
    );
    let la = SmcListener::bind_with(&a, (server_ip().as_str(), 0)).unwrap();
    let lb = SmcListener::bind_with(&b, (ip(3).as_str(), 0)).unwrap();
    let (aa, ab): (SocketAddr, SocketAddr) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    echo_server(la);
    echo_server(lb);
    let t1 = {
        let c = Arc::new(c);
        let c1 = c.clone();
        let h1 = thread::spawn(move || {
            (0..20)
                .map(|i| echo_once(&c1, aa, i, 200_000))
                .collect::<Vec<_>>()
        });
        let c2 = c.clone();
        let h2 = thread::spawn(move || {
            (0..20)
                .map(|i| echo_once(&c2, ab, i, 200_000))
                .collect::<Vec<_>>()
        });
        (h1.join().unwrap(), h2.join().unwrap(), c)
    };
    assert!(t1.0.iter().all(|m| m.is_same_host()), "{:?}", t1.0);
    assert!(
        t1.1.iter().all(|m| matches!(m, Mode::Smc { .. })),
        "{:?}",
        t1.1
    );
    assert!(t1.2.stats().same_host_total >= 20);
    assert!(t1.2.stats().smc_total >= 20);
    drop(b);
}

/// A raw TCP connection from the client's address carrying a Proposal with a same-host
/// offer naming `stack_id` (as an smc-rs client's does), nothing after it.
fn raw_offer(to: SocketAddr, stack_id: u64, nonce: u64) -> std::net::TcpStream {
    use smc_wire::clc::{
        ClcMessage, Eyecatcher, IpArea, PathType, ProposalBody, ProposalRepr, SameHostOffer,
        SmcdArea, V1Area,
    };
    let mut area = SmcdArea {
        ism_gid: 0,
        chid: 0,
        vendor_oui: [0; 3],
        vendor_exp_options: [0; 5],
        reserved: [0; 20],
    };
    SameHostOffer { stack_id, nonce }.emit_into(&mut area);
    let p = ClcMessage::Proposal(ProposalRepr {
        eyecatcher: Eyecatcher::Smcr,
        version: 1,
        typev1: PathType::R,
        typev2: PathType::R,
        peer_id: Default::default(),
        gid: Default::default(),
        mac: Default::default(),
        body: ProposalBody::V1 {
            area: V1Area::Smcd(area),
            ip: IpArea {
                subnet: std::net::Ipv4Addr::new(127, 0, 0, 0),
                prefix_len: 8,
                ipv6_prefixes: Default::default(),
            },
        },
    })
    .to_vec()
    .unwrap();
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(client_ip().parse().unwrap(), 0).into())
        .unwrap();
    s.connect(&to.into()).unwrap();
    let mut t: std::net::TcpStream = s.into();
    t.write_all(&p).unwrap();
    t
}

/// A local process that offers the same-host path and then never answers on its socket
/// (stopped, or hostile: it listens with a backlog of 0 and never accepts, so that
/// connecting to it waits too) holds up only its own rendezvous: the server's exchange
/// with it runs on the stack's exchange thread, not on its event thread, every step of it
/// bounded, so other connections open meanwhile as they always do, the silent ones go on
/// with SMC-R once their wait (`ClcConfig::same_host_timeout`) ends, nothing is left
/// behind, and the stack still stops at once. With the exchange on the event thread, 16
/// such offers held it (and 20 connections with it) for 6 s; with an unbounded connect,
/// for ever.
#[test]
fn a_local_peer_that_never_answers_holds_up_only_its_own_rendezvous() {
    let _serial = serial();
    // The honest client does not offer: its connections need the server's event thread
    // (CLC, then the link's LLC), not its exchange thread.
    let (srv, cli) = sh_pair_with(|_| {}, |c| c.same_host = false);
    let before = srv.stats();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    let accepted = thread::spawn(move || {
        (0..20)
            .map(|_| l.accept().map(|(s, _)| s.mode()))
            .collect::<Vec<_>>()
    });
    // A socket in the same-host directory that takes connections and never answers.
    let silent: u64 = 0x5117_e000_0000_0001 | (u64::from(std::process::id()) << 16);
    let dir = std::env::temp_dir().join("smc-rs-test-samehost");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{silent:016x}.sock"));
    let _ = std::fs::remove_file(&path);
    let us = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).unwrap();
    us.bind(&socket2::SockAddr::unix(&path).unwrap()).unwrap();
    us.listen(0).unwrap();
    let ul: std::os::unix::net::UnixListener = us.into();
    ul.set_nonblocking(true).unwrap();
    let offers: Vec<_> = (0..16)
        .map(|n| raw_offer(addr, silent, 0x5eed + n))
        .collect();
    // Let the server read the Proposals and start the exchanges.
    thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    let conns: Vec<_> = (0..20)
        .map(|_| {
            let c = SmcStream::connect_with(&cli, addr).unwrap();
            assert!(matches!(c.mode(), Mode::Smc { .. }), "{}", c.mode());
            c
        })
        .collect();
    let took = t0.elapsed();
    for m in accepted.join().unwrap() {
        assert!(matches!(m.unwrap(), Mode::Smc { .. }));
    }
    assert!(
        took < Duration::from_millis(1500),
        "20 connections took {took:?} while a local peer did not answer"
    );
    // The silent ones: an SMC-R Accept (or a Decline) once their wait ended.
    for mut t in offers {
        t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut head = [0u8; 8];
        t.read_exact(&mut head).expect("an answer after the wait");
        assert_eq!(&head[..4], &[0xe2, 0xd4, 0xc3, 0xd9], "a CLC message");
        assert_ne!(head[4], 0x81, "not a same-host Accept");
    }
    drop(conns);
    // Nothing left behind: no rendezvous, and the tokens of the exchanges given back
    // (an exchange stuck in connect(2) would hold its own and those queued behind it).
    let t = Instant::now();
    let left = loop {
        let now = srv.stats();
        if now.handshakes == 0 && now.alert_tokens <= before.alert_tokens {
            break None;
        }
        if t.elapsed() > Duration::from_secs(8) {
            break Some(format!(
                "left behind: {} rendezvous, {} tokens (before {})",
                now.handshakes, now.alert_tokens, before.alert_tokens
            ));
        }
        thread::sleep(Duration::from_millis(50));
    };
    // Only now does the silent process take what waits in its backlog (the server's
    // connection), which also frees an exchange stuck connecting, so that a failure
    // here ends the test instead of hanging the stack's shutdown.
    let mut asked = 0;
    while ul.accept().is_ok() {
        asked += 1;
    }
    if let Some(left) = left {
        panic!("{left}");
    }
    assert!(
        asked >= 1,
        "the server's exchange reached the silent socket"
    );
    // The server stops at once (its exchange thread skips what no one waits for).
    let t = Instant::now();
    drop(srv);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "stopping took {:?}",
        t.elapsed()
    );
    let _ = std::fs::remove_file(&path);
}
