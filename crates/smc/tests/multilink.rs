//! Link groups with several links between two stacks in one process (RFC 7609 §2.2,
//! §3.5.1.6): each stack has two loopback addresses of its own as link devices
//! (`StackConfig::devices`, `SMC_RS_DEVICES`), so the server adds a second, symmetric
//! link after first contact.

mod common;

use std::thread;
use std::time::Duration;

use common::*;

/// The link devices of the server (ip 2 and 4) and of the client (ip 1 and 3).
fn two_device_pair() -> (smc::Stack, smc::Stack) {
    pair_with(
        |s| s.devices = vec![server_ip().parse().unwrap(), ip(4).parse().unwrap()],
        |c| c.devices = vec![client_ip().parse().unwrap(), ip(3).parse().unwrap()],
    )
}

fn active_links(s: &smc::Stack) -> Vec<(u8, String, String)> {
    s.link_groups()
        .iter()
        .flat_map(|g| g.links.iter())
        .filter(|l| l.state == "Active")
        .map(|l| {
            (
                l.num,
                l.device.clone(),
                l.peer_gid.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn two_devices_each_give_a_two_link_group() {
    let (srv, cli) = two_device_pair();
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mode = s.mode();
        let (n, h) = recv_stream(&s, 8 << 20);
        let back = send_stream(&s, 2, 8 << 20, 65536);
        drop(s);
        (mode, n, h, back, srv)
    });
    let c = smc::SmcStream::connect_with(&cli, addr).unwrap();
    assert!(c.mode().is_smc(), "client mode: {}", c.mode());
    let sent = send_stream(&c, 1, 8 << 20, 65536);
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let (n, h) = recv_stream(&c, usize::MAX);
    let (smode, sn, sh, back, srv) = server.join().unwrap();
    assert!(smode.is_smc(), "server mode: {smode}");
    assert_eq!((sn, sh), (8 << 20, sent));
    assert_eq!((n, h), (8 << 20, back));
    assert_eq!(srv.link_groups().len(), 1);
    assert_eq!(cli.link_groups().len(), 1);
    // The ADD LINK exchange runs right after first contact (it may still be finishing).
    assert!(
        wait_until(Duration::from_secs(10), || active_links(&srv).len() == 2
            && active_links(&cli).len() == 2),
        "two active links on each side: server {:?}, client {:?}",
        srv.link_groups(),
        cli.link_groups()
    );
    // Symmetric: each link on its own device pair.
    for s in [&srv, &cli] {
        let links = active_links(s);
        assert_ne!(links[0].1, links[1].1, "two local devices: {links:?}");
        assert_ne!(links[0].2, links[1].2, "two peer GIDs: {links:?}");
    }
    // Subsequent contacts use the group; their RMBs have RTokens on both links.
    for seed in 0..4u64 {
        let l2 = listen(&srv);
        let a2 = l2.local_addr().unwrap();
        echo_server(l2);
        let mode = echo_once(&cli, a2, 10 + seed, 1 << 20);
        assert!(mode.is_smc(), "{mode}");
    }
    assert_eq!(srv.link_groups().len(), 1, "one link group");
    assert_eq!(active_links(&srv).len(), 2);
    drop(c);
}

/// Only the server has two link devices: its ADD LINK over the second one is accepted
/// by the client on its only device (asymmetric, RFC 7609 §3.5.1.6; what our stack does
/// with a Linux server today).
#[test]
fn two_devices_on_the_server_only() {
    let (srv, cli) = pair_with(
        |s| s.devices = vec![server_ip().parse().unwrap(), ip(4).parse().unwrap()],
        |_| {},
    );
    let l = listen(&srv);
    let addr = l.local_addr().unwrap();
    echo_server(l);
    let mode = echo_once(&cli, addr, 7, 2 << 20);
    assert!(mode.is_smc(), "{mode}");
    assert!(
        wait_until(Duration::from_secs(10), || active_links(&srv).len() == 2
            && active_links(&cli).len() == 2),
        "the client accepts the server's second device: server {:?}, client {:?}",
        srv.link_groups(),
        cli.link_groups()
    );
    let links = active_links(&cli);
    assert_eq!(links[0].1, links[1].1, "one client device: {links:?}");
    assert_ne!(links[0].2, links[1].2, "two server GIDs: {links:?}");
}
