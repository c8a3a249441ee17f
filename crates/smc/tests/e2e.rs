//! SMC-R end to end between two stacks in one process (127.0.0.1 ↔ 127.0.0.2 over the
//! software RNIC): first and subsequent contact, data both ways, close.

mod common;

use std::io::{Read, Write};
use std::thread;
use std::time::Duration;

use common::*;

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
