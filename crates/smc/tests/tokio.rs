//! The tokio surface: an SMC-R round trip with AsyncRead/AsyncWrite.

#![cfg(feature = "tokio")]

mod common;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_round_trip() {
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
