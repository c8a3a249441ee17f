//! A link fails as soon as its device's interface goes down or loses the device's
//! address (rtnetlink, RFC 7609 §4.6), and comes back when the path does.
//!
//! Runs in a network namespace of its own (the test thread unshares one; every thread
//! and socket of both stacks is created from it): two interfaces (veth), each with one
//! address of the server and one of the client, both stacks with a device on each.
//! Needs root (CAP_NET_ADMIN) and `ip`; without them the test says so and passes
//! without checking anything (`scripts/test.sh` runs as root).

mod common;

use std::process::Command;
use std::thread;
use std::time::Duration;

use common::*;

const SRV: [&str; 2] = ["10.77.1.2", "10.77.2.2"];
const CLI: [&str; 2] = ["10.77.1.1", "10.77.2.1"];
const DEVS: [&str; 2] = ["smcpl1", "smcpl2"];

fn ip_cmd(args: &str) -> bool {
    Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .is_ok_and(|s| s.success())
}

/// A private network namespace for the calling thread (and the threads and children it
/// creates) with the two interfaces; false if this machine cannot.
fn private_netns() -> bool {
    // SAFETY: unshare(2) with CLONE_NEWNET changes only the calling thread's network
    // namespace; it takes no pointers.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return false;
    }
    let mut ok = ip_cmd("link set lo up");
    for (i, d) in DEVS.iter().enumerate() {
        // A veth pair (dummy interfaces are not in every kernel): the addresses on one
        // end, traffic between them delivered locally.
        ok &= ip_cmd(&format!("link add {d} type veth peer name {d}p"))
            && ip_cmd(&format!("link set {d}p up"))
            && ip_cmd(&format!("addr add {}/24 dev {d}", SRV[i]))
            && ip_cmd(&format!("addr add {}/24 dev {d}", CLI[i]))
            && ip_cmd(&format!("link set {d} up"));
    }
    ok
}

fn active(s: &smc::Stack) -> Vec<(u8, String)> {
    s.link_groups()
        .iter()
        .flat_map(|g| g.links.iter())
        .filter(|l| l.state == "Active")
        .map(|l| (l.num, l.peer_gid.clone().unwrap_or_default()))
        .collect()
}

/// `total` bytes each way; once a quarter of the client's bytes are out, `cut` is given
/// the subnet index (0 or 1) of the client's link that carries the connection and must
/// take that path away. Returns the link number that was cut.
fn transfer_with_path_loss(
    srv: &smc::Stack,
    cli: &smc::Stack,
    total: usize,
    seed: u64,
    cut: impl FnOnce(usize),
) -> u8 {
    let l = smc::SmcListener::bind_with(srv, (SRV[0], 0)).unwrap();
    let addr = l.local_addr().unwrap();
    thread::scope(|sc| {
        let server = sc.spawn(|| {
            let (s, _) = l.accept().unwrap();
            let s2 = s.try_clone().unwrap();
            let w = thread::spawn(move || {
                let h = send_stream(&s2, seed + 1, total, 65536);
                s2.shutdown(std::net::Shutdown::Write).unwrap();
                h
            });
            let (n, h) = recv_stream(&s, usize::MAX);
            (s, n, h, w.join().unwrap())
        });
        let c = smc::SmcStream::connect_with(cli, addr).unwrap();
        assert!(c.mode().is_smc(), "client mode: {}", c.mode());
        let me = c.local_addr().unwrap();
        let c2 = c.try_clone().unwrap();
        let w = thread::spawn(move || {
            let h = send_stream(&c2, seed, total, 65536);
            c2.shutdown(std::net::Shutdown::Write).unwrap();
            h
        });
        let mut num = None;
        assert!(
            wait_until(Duration::from_secs(60), || {
                num = cli
                    .connections()
                    .iter()
                    .find(|c| c.local == me && c.bytes_sent > (total / 4) as u64)
                    .and_then(|c| c.link);
                num.is_some()
            }),
            "the transfer never got going"
        );
        let num = num.unwrap();
        let gid = active(cli)
            .into_iter()
            .find(|l| l.0 == num)
            .map(|l| l.1)
            .expect("the connection's link is active");
        let subnet = SRV.iter().position(|a| gid.ends_with(a)).expect("peer GID");
        cut(subnet);
        let (n, h) = recv_stream(&c, usize::MAX);
        let sent = w.join().unwrap();
        let (s, sn, sh, back) = server.join().unwrap();
        assert_eq!((sn, sh), (total, sent), "server received everything intact");
        assert_eq!((n, h), (total, back), "client received everything intact");
        assert!(s.mode().is_smc() && c.mode().is_smc(), "still SMC-R");
        num
    })
}

#[test]
fn interface_down_and_address_removal_fail_over_at_once() {
    init_tracing();
    let t = thread::spawn(|| {
        if !private_netns() {
            eprintln!(
                "SKIP: no private network namespace with veth interfaces here (needs root and ip)"
            );
            return;
        }
        let retry = Duration::from_millis(300);
        let mut s = config(SRV[0], CLI[0]);
        s.devices = SRV.iter().map(|a| a.parse().unwrap()).collect();
        s.add_link_retry = retry;
        let mut c = config(CLI[0], SRV[0]);
        c.devices = CLI.iter().map(|a| a.parse().unwrap()).collect();
        c.add_link_retry = retry;
        let (srv, cli) = (smc::Stack::new(s).unwrap(), smc::Stack::new(c).unwrap());
        let l = smc::SmcListener::bind_with(&srv, (SRV[0], 0)).unwrap();
        let addr = l.local_addr().unwrap();
        echo_server(l);
        assert!(echo_once(&cli, addr, 1, 1 << 16).is_smc());
        let two = || active(&srv).len() == 2 && active(&cli).len() == 2;
        assert!(wait_until(Duration::from_secs(20), two), "two links");

        // 1: the interface of the connection's path goes down (both stacks see it).
        let mut down = None;
        transfer_with_path_loss(&srv, &cli, 32 << 20, 10, |i| {
            assert!(ip_cmd(&format!("link set {} down", DEVS[i])));
            down = Some(i);
        });
        for (name, st) in [("server", srv.stats()), ("client", cli.stats())] {
            assert!(
                st.paths_down >= 1,
                "{name} saw the interface go down: {st:?}"
            );
            assert!(st.failovers >= 1, "{name}: {st:?}");
        }
        assert!(ip_cmd(&format!("link set {} up", DEVS[down.unwrap()])));
        assert!(
            wait_until(Duration::from_secs(30), two),
            "the link is added again once the interface is up: {:?} {:?}",
            srv.link_groups(),
            cli.link_groups()
        );

        // 2: the client's address of the connection's path is removed (only the client
        // sees it; the server learns it from the client's DELETE LINK).
        let before = (srv.stats().failovers, cli.stats().paths_down);
        let mut gone = None;
        transfer_with_path_loss(&srv, &cli, 32 << 20, 20, |i| {
            assert!(ip_cmd(&format!("addr del {}/24 dev {}", CLI[i], DEVS[i])));
            gone = Some(i);
        });
        let (cs, ss) = (cli.stats(), srv.stats());
        assert!(
            cs.paths_down > before.1,
            "client saw its address go: {cs:?}"
        );
        assert!(ss.failovers > before.0, "server moved its side too: {ss:?}");
        let i = gone.unwrap();
        assert!(ip_cmd(&format!("addr add {}/24 dev {}", CLI[i], DEVS[i])));
        assert!(
            wait_until(Duration::from_secs(30), two),
            "the link is added again once the address is back: {:?} {:?}",
            srv.link_groups(),
            cli.link_groups()
        );
        assert_eq!(srv.link_groups().len(), 1, "one link group throughout");
    });
    t.join().unwrap();
}
