//! The stage of every attack: a victim stack carrying honest, hash-verified transfers to
//! and from a second, honest stack while the attack runs; afterwards the checks of issue
//! 10 — the honest transfers finished intact, the victim still serves new connections,
//! and its connections, rendezvous, RMB elements, alert tokens, link groups, QPs and the
//! process's file descriptors are back to the baseline.
//!
//! Tests run one at a time (the fd count is process-wide), each with fresh stacks on fixed
//! loopback addresses private to this test process.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use smc::{Mode, SmcListener, SmcStream, Stack, StackConfig};
use smc_verbs::Provider;

use crate::common;

/// Addresses of a scene (host parts of the process's private 127.x.y.0/24).
pub struct Net {
    pub victim: IpAddr,
    pub honest: IpAddr,
    /// Attackers with an RNIC.
    pub evil: IpAddr,
    pub evil2: IpAddr,
    /// No RNIC: raw UDP / TCP only.
    pub forger: IpAddr,
}

pub fn net() -> Net {
    let ip = |h: u8| common::ip(h).parse().unwrap();
    Net {
        victim: ip(20),
        honest: ip(21),
        evil: ip(22),
        evil2: ip(23),
        forger: ip(24),
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

/// One test at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A stack on `local` that runs CLC with every address of the test network (no eBPF) and
/// short timers, so that dead peers and idle link groups go away within a test.
pub fn stack_config(local: IpAddr) -> StackConfig {
    let mut c = common::config(&local.to_string(), &format!("{}/24", common::ip(0)));
    c.clc_timeout = Duration::from_millis(1500);
    c.keepalive = Some(Duration::from_millis(300));
    c.llc_reply_timeout = Duration::from_secs(1);
    c.lgr_idle_timeout = Duration::from_millis(200);
    c.conn.close_timeout = Duration::from_secs(3);
    c.conn.abort_timeout = Duration::from_secs(2);
    c
}

/// What the victim's (or honest server's) echo application saw on one connection.
#[derive(Clone, Debug)]
pub struct Report {
    pub peer: SocketAddr,
    pub mode: String,
    pub bytes: u64,
    pub sha: [u8; 32],
    pub error: Option<String>,
}

/// An echo server that hashes what it echoes and reports each connection at its end.
pub struct EchoApp {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    pub reports: Arc<Mutex<Vec<Report>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl EchoApp {
    pub fn start(l: SmcListener) -> EchoApp {
        let addr = l.local_addr().unwrap();
        l.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reports = Arc::new(Mutex::new(Vec::new()));
        let (s2, r2) = (stop.clone(), reports.clone());
        let thread = thread::spawn(move || {
            while !s2.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((s, peer)) => {
                        let r = r2.clone();
                        thread::spawn(move || echo_one(s, peer, r));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(5))
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        EchoApp {
            addr,
            stop,
            reports,
            thread: Some(thread),
        }
    }

    /// The report of the connection from `peer`, once it ended.
    pub fn report(&self, peer: SocketAddr, t: Duration) -> Option<Report> {
        let end = Instant::now() + t;
        loop {
            if let Some(r) = self
                .reports
                .lock()
                .unwrap()
                .iter()
                .find(|r| r.peer == peer)
                .cloned()
            {
                return Some(r);
            }
            if Instant::now() > end {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for EchoApp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn echo_one(s: SmcStream, peer: SocketAddr, reports: Arc<Mutex<Vec<Report>>>) {
    let mode = s.mode().to_string();
    let mut h = Sha256::new();
    let mut n = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let error = loop {
        match (&s).read(&mut buf) {
            Ok(0) => {
                let _ = s.shutdown(std::net::Shutdown::Write);
                break None;
            }
            Ok(k) => {
                h.update(&buf[..k]);
                n += k as u64;
                if let Err(e) = (&s).write_all(&buf[..k]) {
                    break Some(format!("write: {e}"));
                }
            }
            Err(e) => break Some(format!("read: {e}")),
        }
    };
    reports.lock().unwrap().push(Report {
        peer,
        mode,
        bytes: n,
        sha: h.finalize().into(),
        error,
    });
}

/// An honest transfer: writes a pattern until told to stop (and at least `min` bytes),
/// reads the echo back; both directions are hashed.
pub struct Transfer {
    pub local: SocketAddr,
    pub mode: Mode,
    stop: Arc<AtomicBool>,
    done: mpsc::Receiver<(&'static str, io::Result<Hashed>)>,
}

/// Bytes and their SHA-256.
type Hashed = (u64, [u8; 32]);

/// What an honest transfer moved.
#[derive(Debug)]
pub struct Moved {
    pub bytes: u64,
    pub sha: [u8; 32],
}

impl Transfer {
    pub fn start(stack: &Stack, to: SocketAddr, seed: u64, min: u64) -> Transfer {
        let s = SmcStream::connect_with(stack, to).expect("honest connect");
        let mode = s.mode();
        assert!(mode.is_smc(), "honest connection is not SMC-R: {mode}");
        let local = s.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, done) = mpsc::channel();
        let w = s.try_clone().unwrap();
        let (st, txw) = (stop.clone(), tx.clone());
        thread::spawn(move || {
            let r = (|| {
                let data = common::pattern(seed, 256 * 1024);
                let mut h = Sha256::new();
                let mut sent = 0u64;
                let mut i = 0usize;
                while !(st.load(Ordering::SeqCst) && sent >= min) {
                    let n = 16 * 1024 + (i * 7919) % (48 * 1024);
                    let off = (i * 104_729) % (data.len() - n);
                    let piece = &data[off..off + n];
                    (&w).write_all(piece)?;
                    h.update(piece);
                    sent += n as u64;
                    i += 1;
                }
                w.shutdown(std::net::Shutdown::Write)?;
                Ok((sent, h.finalize().into()))
            })();
            let _ = txw.send(("sent", r));
        });
        thread::spawn(move || {
            let r = (|| {
                let mut h = Sha256::new();
                let mut n = 0u64;
                let mut buf = vec![0u8; 64 * 1024];
                s.set_read_timeout(Some(Duration::from_secs(30)))?;
                loop {
                    let k = (&s).read(&mut buf)?;
                    if k == 0 {
                        break;
                    }
                    h.update(&buf[..k]);
                    n += k as u64;
                }
                Ok((n, h.finalize().into()))
            })();
            let _ = tx.send(("received", r));
        });
        Transfer {
            local,
            mode,
            stop,
            done,
        }
    }

    /// Stops the writer, waits for the echo to end; panics on any error, loss or change.
    pub fn finish(self, what: &str) -> Moved {
        self.stop.store(true, Ordering::SeqCst);
        let mut sent = None;
        let mut received = None;
        for _ in 0..2 {
            let (which, r) = self
                .done
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("{what}: honest transfer hung"));
            let r = r.unwrap_or_else(|e| panic!("{what}: honest transfer failed ({which}): {e}"));
            if which == "sent" {
                sent = Some(r);
            } else {
                received = Some(r);
            }
        }
        let (sent, received) = (sent.unwrap(), received.unwrap());
        assert_eq!(
            sent, received,
            "{what}: the echo differs from what was sent (bytes, sha256)"
        );
        Moved {
            bytes: sent.0,
            sha: sent.1,
        }
    }
}

/// Which side the victim plays.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// The victim listens; the honest stack and the attacker connect to it.
    Server,
    /// The victim connects: to the honest server and to the attacker's server.
    Client,
}

/// A victim, an honest stack, their echo application and the baseline to return to.
pub struct Scene {
    pub net: Net,
    pub role: Role,
    pub victim: Stack,
    pub honest: Stack,
    /// The server side's echo application (the victim's when `role` is Server).
    pub app: EchoApp,
    transfers: Vec<(Transfer, &'static str)>,
    base_fds: usize,
    // Dropped after the stacks (whose drop joins their event threads).
    _watchdog: Watchdog,
    // Last: released after everything else.
    _serial: MutexGuard<'static, ()>,
}

/// Longest a scene may live: a hang (a stuck event thread, a transfer that never ends)
/// aborts the test binary with a message instead of stalling the whole suite.
pub const SCENE_LIMIT: Duration = Duration::from_secs(120);

struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    fn start() -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let name = thread::current().name().unwrap_or("?").to_string();
        thread::spawn(move || {
            let end = Instant::now() + SCENE_LIMIT;
            while Instant::now() < end {
                if d.load(Ordering::SeqCst) {
                    return;
                }
                thread::sleep(Duration::from_millis(100));
            }
            eprintln!("malicious-peer test {name} still running after {SCENE_LIMIT:?}: aborting");
            std::process::abort();
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Minimum bytes each honest transfer moves each way.
pub const MIN_HONEST: u64 = 8 << 20;

impl Scene {
    /// A victim server with its echo application and an honest client stack.
    pub fn server_victim(f: impl FnOnce(&mut StackConfig)) -> Scene {
        Scene::new(Role::Server, f)
    }

    /// A victim client and an honest server stack with its echo application.
    pub fn client_victim(f: impl FnOnce(&mut StackConfig)) -> Scene {
        Scene::new(Role::Client, f)
    }

    fn new(role: Role, f: impl FnOnce(&mut StackConfig)) -> Scene {
        let serial = serial();
        let watchdog = Watchdog::start();
        common::init_tracing();
        let net = net();
        // Every RNIC the scene may use exists before the baseline (they live as long as
        // the process: one per address).
        let rnic = smc_softroce::SoftRoce::global();
        for ip in [net.victim, net.honest, net.evil, net.evil2] {
            rnic.device_for(ip).expect("RNIC");
        }
        let mut vc = stack_config(net.victim);
        f(&mut vc);
        let victim = Stack::new(vc).unwrap();
        let honest = Stack::new(stack_config(net.honest)).unwrap();
        let (server, server_ip) = match role {
            Role::Server => (&victim, net.victim),
            Role::Client => (&honest, net.honest),
        };
        let l = SmcListener::bind_with(server, (server_ip, 0)).unwrap();
        let app = EchoApp::start(l);
        let mut s = Scene {
            net,
            role,
            victim,
            honest,
            app,
            transfers: Vec::new(),
            base_fds: 0,
            _watchdog: watchdog,
            _serial: serial,
        };
        // A first connection warms everything up (threads, pools); its end is the baseline.
        s.check_serves("warm-up");
        s.settle("baseline");
        s.base_fds = count_fds();
        s
    }

    /// The stack and address an honest connection goes from and to.
    fn honest_path(&self) -> (&Stack, SocketAddr) {
        match self.role {
            Role::Server => (&self.honest, self.app.addr),
            Role::Client => (&self.victim, self.app.addr),
        }
    }

    /// Starts an honest, hash-verified transfer that runs until `finish`.
    pub fn start_transfer(&mut self, seed: u64, what: &'static str) {
        let (st, to) = self.honest_path();
        let t = Transfer::start(st, to, seed, MIN_HONEST);
        self.transfers.push((t, what));
    }

    /// The listener address of the victim (server scenes).
    pub fn victim_addr(&self) -> SocketAddr {
        assert_eq!(self.role, Role::Server);
        self.app.addr
    }

    /// A short echo on a new honest connection: the victim still serves (no panic, no
    /// stuck event thread).
    pub fn check_serves(&self, what: &str) {
        let mode = self.echo_new(what, Duration::from_secs(10));
        assert!(mode.is_smc(), "{what}: new connection not SMC-R: {mode}");
    }

    /// A short echo on a new honest connection, SMC-R or TCP (see [`echo_new`]).
    pub fn echo_new(&self, what: &str, t: Duration) -> Mode {
        let (st, to) = self.honest_path();
        echo_new(st, to, what, t)
    }

    /// Waits until the victim has no connection, rendezvous, RMB element in use, alert
    /// token, link group or QP left, and the honest stack no link group either (a new
    /// connection while one side still ends an idle link group can race with it).
    fn settle(&self, what: &str) {
        let ok = common::wait_until(Duration::from_secs(30), || {
            let s = self.victim.stats();
            s.smc_connections == 0
                && s.handshakes == 0
                && s.rmb_elements_in_use == 0
                && s.alert_tokens == 0
                && s.link_groups == 0
                && s.qps_open == 0
                && s.rmbs == 0
                && self.honest.stats().qps_open == 0
        });
        assert!(
            ok,
            "{what}: victim resources not released: {:?} (honest stack: {:?})",
            self.victim.stats(),
            self.honest.stats()
        );
    }

    /// Ends the scene: the honest transfers finished with their hashes intact (and the
    /// server application saw exactly those bytes), the victim serves a new connection,
    /// and everything is back to the baseline.
    pub fn finish(mut self) {
        for (t, what) in std::mem::take(&mut self.transfers) {
            let local = t.local;
            let moved = t.finish(what);
            assert!(
                moved.bytes >= MIN_HONEST,
                "{what}: only {} bytes",
                moved.bytes
            );
            let r = self
                .app
                .report(local, Duration::from_secs(20))
                .unwrap_or_else(|| panic!("{what}: the server application never saw the end"));
            assert_eq!(r.error, None, "{what}: server application error");
            assert_eq!(
                (r.bytes, r.sha),
                (moved.bytes, moved.sha),
                "{what}: the server application received other bytes than were sent"
            );
        }
        self.settle("after the attack");
        self.check_serves("after the attack");
        self.settle("after the last connection");
        let base = self.base_fds;
        assert!(
            common::wait_until(Duration::from_secs(10), || count_fds() <= base + 2),
            "file descriptors: {} at the baseline, {} now",
            base,
            count_fds()
        );
    }
}

/// A short echo on a new connection from `st` to the echo application at `to`, SMC-R or
/// TCP (connect and each step within `t`); panics on any error or changed byte. Returns
/// the connection's mode.
pub fn echo_new(st: &Stack, to: SocketAddr, what: &str, t: Duration) -> Mode {
    let s = SmcStream::connect_timeout_with(st, &to, t)
        .unwrap_or_else(|e| panic!("{what}: the victim no longer serves: {e}"));
    let mode = s.mode();
    let data = common::pattern(77, 100_000);
    let w = s.try_clone().unwrap();
    let d2 = data.clone();
    let th = thread::spawn(move || (&w).write_all(&d2));
    let mut back = vec![0u8; data.len()];
    s.set_read_timeout(Some(t)).unwrap();
    (&s).read_exact(&mut back)
        .unwrap_or_else(|e| panic!("{what}: echo on a new connection ({mode}) failed: {e}"));
    th.join().unwrap().unwrap();
    assert!(back == data, "{what}: echo on a new connection differs");
    mode
}

/// Open file descriptors of this process.
pub fn count_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count().saturating_sub(1))
        .unwrap_or(0)
}

/// Resident memory of this process, in bytes.
pub fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
