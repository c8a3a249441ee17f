//! The tokio surface: an SMC-R round trip with AsyncRead/AsyncWrite.

#![cfg(feature = "tokio")]

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The tests of this file run one at a time: some count this process's descriptors.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_round_trip() {
    let _g = SERIAL.lock().await;
    let (srv, cli) = pair();
    let l = smc::tokio::SmcListener::bind_with(&srv, (server_ip().as_str(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        assert!(s.mode().is_smc(), "{}", s.mode());
        let mut buf = vec![0u8; 1 << 20];
        s.read_exact(&mut buf).await.unwrap();
        s.write_all(&buf).await.unwrap();
        s.shutdown().await.unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        drop(srv);
    });
    let mut c = smc::tokio::SmcStream::connect_with(&cli, addr)
        .await
        .unwrap();
    assert!(c.mode().is_smc(), "{}", c.mode());
    let data = pattern(7, 1 << 20);
    let (mut r, mut w) = tokio::io::split(c);
    let d2 = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&d2).await.unwrap();
        w
    });
    let mut back = Vec::new();
    r.read_to_end(&mut back).await.unwrap();
    let mut w = writer.await.unwrap();
    assert!(back == data, "echo differs");
    w.shutdown().await.unwrap();
    c = r.unsplit(w);
    drop(c);
    server.await.unwrap();
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A pair of stacks on the same-host path.
fn same_host_pair() -> (smc::Stack, smc::Stack) {
    pair_with(enable_same_host, enable_same_host)
}

/// Same host: a runtime task watches each stream's doorbell (api::tokio::watch_bell),
/// one per connection (a cloned stream finds it running). Data both ways, a half-close,
/// and then every task ended with its connection: no connection left, and no
/// descriptor (each task watches a duplicate of its doorbell) beyond what the stacks
/// keep for their next connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_same_host_streams_end_with_their_doorbell_tasks() {
    let _g = SERIAL.lock().await;
    let (srv, cli) = same_host_pair();
    let l = smc::tokio::SmcListener::bind_with(&srv, (server_ip().as_str(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();
    {
        // Started at the first read or write, once per connection: two, though the
        // client's connection has two streams.
        // (The rendezvous completes without the server's accept().)
        let c = tokio::task::block_in_place(|| smc::SmcStream::connect_with(&cli, addr)).unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        let mut c1 = smc::tokio::SmcStream::from_std(c.try_clone().unwrap()).unwrap();
        let mut c2 = smc::tokio::SmcStream::from_std(c).unwrap();
        assert!(c1.mode().is_same_host(), "{}", c1.mode());
        let mut b = [0u8; 1];
        c1.write_all(b"x").await.unwrap();
        s.read_exact(&mut b).await.unwrap();
        s.write_all(b"y").await.unwrap();
        c2.read_exact(&mut b).await.unwrap();
        c1.write_all(b"z").await.unwrap();
        s.read_exact(&mut b).await.unwrap();
        assert_eq!(
            metrics.num_alive_tasks(),
            2,
            "one doorbell task per connection"
        );
    }
    // Rounds beyond what the stacks may keep: each keeps at most 16 regions free for
    // the other, each with its doorbell held by both stacks (samehost.rs, the leak
    // test); a duplicate left behind per connection would be two per round.
    const ROUNDS: u64 = 100;
    const POOL_FDS: usize = 2 * 16 * 2;
    // A first connection sets up what later ones reuse (session, regions).
    let mut before = None;
    for round in 0..ROUNDS {
        if round == 1 {
            before = Some(fds());
        }
        let server = async {
            let (mut s, _) = l.accept().await.unwrap();
            assert!(s.mode().is_same_host(), "{}", s.mode());
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        };
        let client = async {
            let mut c = smc::tokio::SmcStream::connect_with(&cli, addr)
                .await
                .unwrap();
            assert!(c.mode().is_same_host(), "{}", c.mode());
            let data = pattern(round, 300_000);
            c.write_all(&data).await.unwrap();
            c.shutdown().await.unwrap();
            let mut back = Vec::new();
            c.read_to_end(&mut back).await.unwrap();
            assert!(back == data, "round {round}: echo differs");
        };
        tokio::join!(server, client);
    }
    let gone = wait_until(Duration::from_secs(10), || {
        srv.connections().is_empty() && cli.connections().is_empty()
    });
    assert!(gone, "connections left: {:?}", srv.connections().len());
    // The doorbell tasks ended with their connections, the last ones too (woken by
    // CLOSED: no later connection rings their doorbells).
    let ended = wait_until(Duration::from_secs(10), || metrics.num_alive_tasks() == 0);
    assert!(ended, "{} tasks left", metrics.num_alive_tasks());
    let before = before.unwrap();
    let settled = wait_until(Duration::from_secs(10), || fds() <= before + POOL_FDS);
    assert!(settled, "descriptors: {} after, {before} before", fds());
}

/// Same host: a stream whose runtime is gone (its doorbell task dropped with it) gives
/// the doorbell back to the event thread, which takes the peer's close from then on.
#[test]
fn tokio_same_host_doorbell_returns_to_the_event_thread_without_a_runtime() {
    let _g = SERIAL.blocking_lock();
    let (srv, cli) = same_host_pair();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let l = rt.block_on(async {
        smc::tokio::SmcListener::bind_with(&srv, (server_ip().as_str(), 0)).unwrap()
    });
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || smc::SmcStream::connect_with(&cli, addr).map(|c| (c, cli)));
    let (mut s, _) = rt.block_on(l.accept()).unwrap();
    assert!(s.mode().is_same_host(), "{}", s.mode());
    let (mut c, _cli) = t.join().unwrap().unwrap();
    // A first read starts the doorbell's task on this runtime; then the runtime goes.
    rt.block_on(async {
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_millis(20), s.read(&mut b)).await;
        assert!(r.is_err(), "nothing to read yet");
    });
    assert_eq!(
        rt.metrics().num_alive_tasks(),
        1,
        "the doorbell's task runs"
    );
    drop(rt);
    // The peer writes: its CDC reaches our ring, and only the event thread is left to
    // take it (the connection counts what it received then).
    std::io::Write::write_all(&mut c, &[7; 1000]).unwrap();
    let received = || {
        srv.connections()
            .iter()
            .map(|i| i.bytes_received)
            .sum::<u64>()
    };
    let taken = wait_until(Duration::from_secs(5), || received() == 1000);
    assert!(taken, "the peer's CDC was not taken: {} bytes", received());
    drop(c);
    drop(s);
    assert!(
        wait_until(Duration::from_secs(10), || srv.connections().is_empty()),
        "the connection did not end"
    );
}
