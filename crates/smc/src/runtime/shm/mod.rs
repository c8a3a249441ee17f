//! The same-host path (docs/samehost.md): when both ends of a connection are smc-rs
//! stacks on one host, its data goes through shared memory instead of RDMA.
//!
//! - **Proof of same host.** Every stack that offers the path listens on a Unix socket
//!   `<dir>/<stack id>.sock` (`StackConfig::same_host_dir`). A client puts its stack id
//!   and a fresh nonce in the Proposal (`smc_wire::clc::samehost`). A server that can
//!   connect to that socket, finds a process of the same user (or root) there
//!   (SO_PEERCRED), and gets the nonce acknowledged by it, has proven that the process
//!   at the other end of the TCP connection shares its kernel and file system: an
//!   address being local proves nothing across network namespaces, a Unix socket in a
//!   shared directory does. Two network namespaces that share the directory take the
//!   path; a server that cannot reach the socket (another mount namespace, another
//!   host that happens to offer) goes on with SMC-R.
//! - **Memory.** Each side creates the region it receives into (`region.rs`: a sealed
//!   memfd with a control page and its RMB) and sends it with its doorbell eventfd over
//!   the socket (`exchange.rs`); the descriptors are closed once mapped.
//! - **Data path.** The connection machine is the SMC-R one (`smc_proto::conn`): the
//!   runtime copies the RDMA WRITEs of a `Transmit` into the peer's mapped RMB and puts
//!   its CDC in the peer's ring (`ConnShared::flush`), so flow control, urgent data,
//!   half-close and abort behave exactly as on SMC-R. A reader or writer about to sleep
//!   first spins on its ring for an adaptive while (`StackConfig::same_host_spin`); a
//!   writer rings the peer's eventfd only when no thread of the peer spins, and the
//!   event thread of a sleeping peer takes the CDCs from the ring.

pub(crate) mod exchange;
pub(crate) mod region;

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use smc_verbs::{EventFd, RdmaBuffer};
use smc_wire::clc::{SameHostHello, SameHostOffer};
use tracing::{debug, warn};

use self::region::{Region, RxRing, TxRing};

/// Default directory of the stacks' Unix sockets.
pub const DEFAULT_DIR: &str = "/tmp/.smc-rs-samehost";

/// Everything one side has for a connection once the exchange is done.
pub(crate) struct ShmSetup {
    pub local_token: u32,
    pub peer_token: u32,
    pub rx: Region,
    pub tx: Region,
    pub bell: EventFd,
    pub peer_bell: OwnedFd,
    pub peer_pid: i32,
}

/// A client's offer waiting for its server.
struct Pending {
    token: u32,
    rmb_len: u32,
    ready: Option<ShmSetup>,
}

/// The same-host state of a stack, shared with its socket thread.
pub(crate) struct SameHost {
    pub stack_id: u64,
    dir: PathBuf,
    rmb_len: u32,
    pending: Mutex<HashMap<u64, Pending>>,
    stop: AtomicBool,
    /// The socket thread, started with the first offer.
    thread: Mutex<Option<(PathBuf, JoinHandle<()>)>>,
    /// The socket could not be created: no offers (logged once).
    broken: AtomicBool,
}

impl SameHost {
    pub(crate) fn new(dir: PathBuf, rmb_len: usize) -> SameHost {
        let page = region::CTRL_LEN;
        let rmb_len = rmb_len
            .clamp(region::MIN_RMB as usize, region::MAX_RMB as usize)
            .div_ceil(page)
            * page;
        SameHost {
            stack_id: rand::random::<u64>() | 1,
            dir,
            rmb_len: rmb_len as u32,
            pending: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            broken: AtomicBool::new(false),
        }
    }

    fn sock_path(dir: &Path, id: u64) -> PathBuf {
        dir.join(format!("{id:016x}.sock"))
    }

    /// Starts the socket thread if needed; false when the path cannot be offered.
    fn ensure_listener(self: &Arc<Self>) -> bool {
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        let mut t = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if t.is_some() {
            return true;
        }
        match self.listen() {
            Ok((path, l)) => {
                let me = self.clone();
                match std::thread::Builder::new()
                    .name("smc-samehost".into())
                    .spawn(move || me.serve(l))
                {
                    Ok(h) => {
                        *t = Some((path, h));
                        true
                    }
                    Err(e) => {
                        warn!(error = %e, "same-host path off: no thread");
                        self.broken.store(true, Ordering::Relaxed);
                        false
                    }
                }
            }
            Err(e) => {
                warn!(dir = %self.dir.display(), error = %e, "same-host path off: no socket");
                self.broken.store(true, Ordering::Relaxed);
                false
            }
        }
    }

    fn listen(&self) -> io::Result<(PathBuf, UnixListener)> {
        use std::os::unix::fs::PermissionsExt;
        if std::fs::create_dir(&self.dir).is_ok() {
            // Shared by the users of the host, like /tmp (sticky: nobody removes
            // another's socket); who may talk is decided by SO_PEERCRED.
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o1777))?;
        }
        remove_stale(&self.dir);
        let path = Self::sock_path(&self.dir, self.stack_id);
        let l = smc_verbs::process::lift(UnixListener::bind(&path)?);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        Ok((path, l))
    }

    /// A client offer for a new rendezvous: registers it with a fresh token.
    pub(crate) fn offer(self: &Arc<Self>, token: u32) -> Option<SameHostOffer> {
        if !self.ensure_listener() {
            return None;
        }
        let nonce = rand::random::<u64>();
        let mut p = self.pending.lock().ok()?;
        p.insert(
            nonce,
            Pending {
                token,
                rmb_len: self.rmb_len,
                ready: None,
            },
        );
        Some(SameHostOffer {
            stack_id: self.stack_id,
            nonce,
        })
    }

    /// Client: is the memory of this offer ready (the server did its exchange)?
    pub(crate) fn client_ready(&self, nonce: u64) -> bool {
        self.pending
            .lock()
            .map(|p| p.get(&nonce).is_some_and(|x| x.ready.is_some()))
            .unwrap_or(false)
    }

    /// Client: the rendezvous of this offer ended. Returns the token and, when the
    /// exchange was done, the memory (the caller uses it or drops it).
    pub(crate) fn take(&self, nonce: u64) -> Option<(u32, Option<ShmSetup>)> {
        let x = self.pending.lock().ok()?.remove(&nonce)?;
        Some((x.token, x.ready))
    }

    /// Server: prove the offering client is on this host and exchange the memory.
    pub(crate) fn connect(&self, offer: &SameHostOffer, token: u32) -> io::Result<ShmSetup> {
        let path = Self::sock_path(&self.dir, offer.stack_id);
        let s = UnixStream::connect(&path)?;
        s.set_read_timeout(Some(exchange::IO_TIMEOUT))?;
        s.set_write_timeout(Some(exchange::IO_TIMEOUT))?;
        let peer_pid = exchange::check_peer(&s)?;
        let (rx, memfd) = Region::create(self.rmb_len)?;
        let bell = EventFd::new()?;
        let bell_fd = bell_owned(&bell)?;
        exchange::send(
            &s,
            &SameHostHello {
                nonce: offer.nonce,
                token,
                rmb_len: self.rmb_len,
                status: 0,
            },
            &[&memfd, &bell_fd],
        )?;
        drop((memfd, bell_fd));
        let (h, fds) = exchange::recv(&s)?;
        if h.status != 0 || h.nonce != offer.nonce {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "same-host offer not acknowledged",
            ));
        }
        finish_setup(rx, bell, token, &h, fds, peer_pid)
    }

    /// The socket thread: answers servers' hellos for our pending offers.
    fn serve(self: Arc<Self>, l: UnixListener) {
        for s in l.incoming() {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let Ok(s) = s else { continue };
            if let Err(e) = self.answer(&s) {
                debug!(error = %e, "same-host hello refused");
            }
        }
    }

    fn answer(&self, s: &UnixStream) -> io::Result<()> {
        s.set_read_timeout(Some(exchange::IO_TIMEOUT))?;
        s.set_write_timeout(Some(exchange::IO_TIMEOUT))?;
        let peer_pid = exchange::check_peer(s)?;
        let (h, fds) = exchange::recv(s)?;
        let (token, rmb_len) = {
            let p = self
                .pending
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?;
            match p.get(&h.nonce) {
                Some(x) if x.ready.is_none() => (x.token, x.rmb_len),
                _ => {
                    drop(p);
                    let no = SameHostHello {
                        nonce: h.nonce,
                        token: 0,
                        rmb_len: 0,
                        status: 1,
                    };
                    let _ = exchange::send(s, &no, &[]);
                    return Err(io::Error::other("no such offer"));
                }
            }
        };
        let (rx, memfd) = Region::create(rmb_len)?;
        let bell = EventFd::new()?;
        let bell_fd = bell_owned(&bell)?;
        let setup = finish_setup(rx, bell, token, &h, fds, peer_pid)?;
        // Ready before the server hears back: it answers the client on TCP at once, and
        // the client's rendezvous asks for the memory as soon as that arrives.
        {
            let mut p = self
                .pending
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?;
            match p.get_mut(&h.nonce) {
                Some(x) if x.ready.is_none() => x.ready = Some(setup),
                _ => return Err(io::Error::other("offer gone meanwhile")),
            }
        }
        let sent = exchange::send(
            s,
            &SameHostHello {
                nonce: h.nonce,
                token,
                rmb_len,
                status: 0,
            },
            &[&memfd, &bell_fd],
        );
        if sent.is_err() {
            // The server goes on with SMC-R; this memory will not be used.
            if let Ok(mut p) = self.pending.lock() {
                if let Some(x) = p.get_mut(&h.nonce) {
                    x.ready = None;
                }
            }
        }
        sent
    }

    /// Stops the socket thread and removes the socket (stack shutdown).
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let t = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some((path, h)) = t {
            // Wakes the blocking accept.
            drop(UnixStream::connect(&path));
            let _ = h.join();
            let _ = std::fs::remove_file(&path);
        }
        if let Ok(mut p) = self.pending.lock() {
            p.clear();
        }
    }
}

/// A second descriptor of our bell, to send (closed after sending).
fn bell_owned(bell: &EventFd) -> io::Result<OwnedFd> {
    use std::os::fd::AsFd;
    bell.as_fd().try_clone_to_owned()
}

/// Checks and maps what the peer sent.
fn finish_setup(
    rx: Region,
    bell: EventFd,
    local_token: u32,
    h: &SameHostHello,
    mut fds: Vec<OwnedFd>,
    peer_pid: i32,
) -> io::Result<ShmSetup> {
    if fds.len() != 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "same-host hello without its two descriptors",
        ));
    }
    let peer_bell = fds.pop().expect("two descriptors");
    let memfd = fds.pop().expect("two descriptors");
    exchange::check_eventfd(&peer_bell)?;
    let tx = Region::map_peer(&memfd, h.rmb_len)?;
    Ok(ShmSetup {
        local_token,
        peer_token: h.token,
        rx,
        tx,
        bell,
        peer_bell,
        peer_pid,
    })
}

/// Sockets of stacks that are gone (killed before removing theirs): removed when a new
/// stack starts listening, so that the directory does not grow.
fn remove_stale(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten().take(1024) {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "sock") {
            if let Err(err) = UnixStream::connect(&p) {
                if err.kind() == io::ErrorKind::ConnectionRefused {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
    }
}

/// The same-host part of a connection (beside the machine, the RMB and the send buffer
/// every connection has).
pub(crate) struct ShmPath {
    /// Our receive ring's control page (the RMB is `ConnShared::rmb`).
    pub rx_ctrl: Arc<RdmaBuffer>,
    /// The peer's RMB, mapped.
    pub tx_data: Arc<RdmaBuffer>,
    /// Our doorbell: the event thread polls it, and so does a thread sleeping in a
    /// blocking call.
    pub bell: EventFd,
    /// The peer's doorbell.
    pub peer_bell: OwnedFd,
    pub peer_pid: i32,
    /// Our ring position as last seen under the lock (a hint for spinning threads).
    pub rx_tail_hint: AtomicU64,
    /// Current spin budget in ns (adaptive, between 1/16 and all of the configured one).
    pub spin_ns: AtomicU64,
    pub spin_max: Duration,
}

/// The rings, under the connection's lock.
pub(crate) struct ShmRings {
    pub rx: RxRing,
    pub tx: TxRing,
}

impl ShmPath {
    pub(crate) fn new(
        s: ShmSetup,
        spin_max: Duration,
    ) -> io::Result<(ShmPath, ShmRings, Arc<RdmaBuffer>)> {
        let rings = ShmRings {
            rx: RxRing {
                ctrl: s.rx.ctrl.clone(),
                tail: 0,
            },
            tx: TxRing {
                ctrl: s.tx.ctrl.clone(),
                head: 0,
            },
        };
        let p = ShmPath {
            rx_ctrl: s.rx.ctrl,
            tx_data: s.tx.data,
            bell: s.bell,
            peer_bell: s.peer_bell,
            peer_pid: s.peer_pid,
            rx_tail_hint: AtomicU64::new(0),
            spin_ns: AtomicU64::new(spin_max.as_nanos() as u64),
            spin_max,
        };
        Ok((p, rings, s.rx.data))
    }

    /// Wakes the peer's event thread.
    pub(crate) fn ring_peer(&self) {
        let _ = rustix::io::write(&self.peer_bell, &1u64.to_ne_bytes());
    }

    /// A CDC is waiting in our ring (no lock needed).
    pub(crate) fn rx_pending(&self) -> bool {
        RxRing::pending(&self.rx_ctrl, self.rx_tail_hint.load(Ordering::Acquire))
    }

    /// Adapts the spin budget to how long a wait took, spin and sleep together: an
    /// answer that came within the longest spin means spinning that long would have
    /// caught it (the budget goes back to the maximum); a longer wait halves it, down to
    /// a sixteenth, so an idle connection costs little CPU and a busy one gets its
    /// answers without a wake-up.
    pub(crate) fn adapt(&self, waited: Duration) {
        let max = self.spin_max.as_nanos() as u64;
        let next = if waited <= self.spin_max {
            max
        } else {
            (self.spin_ns.load(Ordering::Relaxed) / 2).max(max / 16)
        };
        self.spin_ns.store(next, Ordering::Relaxed);
    }
}

/// The connection of a finished same-host rendezvous: the SMC-R connection machine over
/// this memory (docs/samehost.md "Memory").
pub(crate) fn new_conn(
    inner: &Arc<super::Inner>,
    local: std::net::SocketAddr,
    peer: std::net::SocketAddr,
    tcp: std::net::TcpStream,
    setup: ShmSetup,
) -> io::Result<Arc<super::conn::ConnShared>> {
    use super::conn::{ConnParts, ConnShared, ConnState, Kind, Path as ConnPath};
    let cfg = &inner.cfg;
    let (token, peer_token, peer_len) = (
        setup.local_token,
        setup.peer_token,
        setup.tx.data.len() as u32,
    );
    let (path, rings, rmb) = ShmPath::new(setup, cfg.same_host_spin)?;
    let geo = |len: u32| {
        // No eye catcher: the RMB is ours alone (RFC 7609 §4.2's is optional).
        crate::conn::RmbeGeometry::linux(len)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
    };
    let params = crate::conn::ConnParams::new(
        geo(rmb.len() as u32)?,
        geo(peer_len)?,
        cfg.sndbuf_size.min(u32::MAX as usize) as u32,
        token,
        peer_token,
    );
    let conn = crate::conn::Conn::new(params, cfg.conn.clone())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let sndbuf = RdmaBuffer::new(cfg.sndbuf_size)?;
    let shared = ConnShared::new(
        ConnParts {
            token,
            kind: Kind::SameHost(path),
            rmb,
            sndbuf,
            local,
            peer,
            version: 2,
            first_contact: false,
            state: ConnState::new(conn, ConnPath::Shm(rings), Some(tcp)),
        },
        inner,
    );
    // CDCs the peer put in our ring before we got here.
    shared.shm_poll(std::time::Instant::now());
    Ok(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_between_two_stacks_and_refusals() {
        let dir = std::env::temp_dir().join(format!("smc-rs-shm-test-{}", std::process::id()));
        let client = Arc::new(SameHost::new(dir.clone(), 64 << 10));
        let server = SameHost::new(dir.clone(), 32 << 10);
        let offer = client.offer(0x1111).expect("offer");
        assert!(!client.client_ready(offer.nonce));
        // A wrong nonce is refused by the client's socket.
        let bad = SameHostOffer {
            nonce: offer.nonce ^ 1,
            ..offer
        };
        assert!(server.connect(&bad, 0x2222).is_err());
        let s = server.connect(&offer, 0x2222).expect("exchange");
        assert_eq!((s.local_token, s.peer_token), (0x2222, 0x1111));
        assert_eq!(s.tx.data.len(), 64 << 10);
        assert!(client.client_ready(offer.nonce));
        // Answered once only.
        assert!(server.connect(&offer, 0x3333).is_err());
        let (token, c) = client.take(offer.nonce).unwrap();
        let c = c.unwrap();
        assert_eq!((token, c.peer_token), (0x1111, 0x2222));
        assert_eq!(c.tx.data.len(), 32 << 10);
        // The two sides see the same bytes.
        s.tx.data.write(5, b"to client");
        let mut b = [0u8; 9];
        c.rx.data.read(5, &mut b);
        assert_eq!(&b, b"to client");
        // An unknown stack: no socket, no same-host path.
        let none = SameHostOffer {
            stack_id: 2,
            nonce: 1,
        };
        assert!(server.connect(&none, 1).is_err());
        client.shutdown();
        assert!(!SameHost::sock_path(&dir, client.stack_id).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
