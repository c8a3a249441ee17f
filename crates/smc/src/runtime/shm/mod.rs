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
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use smc_verbs::{EventFd, RdmaBuffer};
use smc_wire::clc::samehost::{HELLO_ACCEPTED, HELLO_REFUSED, HELLO_RELEASE};
use smc_wire::clc::{SameHostHello, SameHostOffer};
use tracing::{debug, warn};

use self::region::{Region, RxRing, TxRing};

/// Default directory of the stacks' Unix sockets.
pub const DEFAULT_DIR: &str = "/tmp/.smc-rs-samehost";

/// The memory a side receives into (its region, which the peer maps and writes) and its
/// doorbell: made for a connection, and kept for a later one with the same session peer
/// when the connection ended cleanly (`SameHost::give_back`).
pub(crate) struct OwnMem {
    /// Our number for it ([`SameHostHello::region`]).
    pub num: u32,
    pub region: Region,
    pub bell: Arc<EventFd>,
}

/// A peer's region, mapped, and its doorbell: what we write into.
#[derive(Clone)]
pub(crate) struct PeerMem {
    pub region: Region,
    pub bell: Arc<OwnedFd>,
}

/// The session a connection's memory belongs to (`gen` tells a session from a later one
/// with the same stack).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SessionLink {
    pub stack: u64,
    pub gen: u64,
}

/// Everything one side has for a connection once the exchange is done.
pub(crate) struct ShmSetup {
    pub local_token: u32,
    pub peer_token: u32,
    pub rx: OwnMem,
    pub tx: PeerMem,
    /// The peer's number for `tx` (0: none).
    pub tx_num: u32,
    pub peer_pid: i32,
    /// The session between the two stacks, once there is one: `rx` goes back to it at
    /// the connection's end.
    pub session: Option<SessionLink>,
}

/// A client's offer waiting for its server.
struct Pending {
    token: u32,
    /// The server's address (the TCP peer): which stack serves it is learnt from its
    /// same-host Accept, for the next offer to it.
    peer: SocketAddr,
    ready: Option<ShmSetup>,
    /// Our memory, already sent on our session with the stack that served `peer` last
    /// (subsequent contact): used only if that same stack accepts.
    pre: Option<PreOffer>,
    /// The Unix connection a server made for this offer: kept as our session with its
    /// stack once its Accept names that stack.
    session: Option<(UnixStream, i32)>,
}

struct PreOffer {
    link: SessionLink,
    rx: OwnMem,
}

/// A full exchange for the exchange thread ([`SameHost::connect_later`]), and what to do
/// with its outcome there.
pub(crate) struct ExchangeJob {
    pub offer: SameHostOffer,
    pub token: u32,
    /// When its rendezvous stops waiting (`ClcConfig::same_host_timeout`): a job still
    /// queued then is not run (its outcome would go unused, and a full exchange
    /// replaces the session between the two stacks).
    pub deadline: Instant,
    pub done: Box<dyn FnOnce(io::Result<ShmSetup>) + Send>,
}

/// A hello that came on a session before its rendezvous asked for it.
struct Received {
    hello: SameHostHello,
    fds: Vec<OwnedFd>,
    at: Instant,
}

/// Hellos a session holds for rendezvous to come, at most; a peer that sends more
/// loses its oldest ones (their descriptors are closed).
const SESSION_INBOX: usize = 64;
/// How long a hello waits on a session for its rendezvous (a Proposal that never came).
const SESSION_HELLO_TTL: Duration = Duration::from_secs(5);
/// Servers remembered by address (client side), at most.
const MAX_ROUTES: usize = 4096;
/// Regions of ours a session keeps for the next connections with its peer, at most.
const FREE_PER_SESSION: usize = 16;

/// The Unix connection between two stacks of this host, kept after their first
/// exchange (the server made it and checked the client's credentials; the client
/// checked the server's). The next rendezvous between them need no new connection and
/// no thread hand-off: the client sends its hello on it before its Proposal, the server
/// finds it there when the Proposal comes and answers on it before its Accept, and the
/// client finds that answer there when the Accept comes (docs/samehost.md, "Subsequent
/// contact"). Non-blocking on both sides; a broken one is dropped and the next
/// rendezvous makes a new one.
///
/// The memory of a connection between them is reused too: a region of ours that a
/// connection left cleanly (the peer sent its last CDC, so it writes no more) waits in
/// `free` for the next connection with the same peer, which names it by number instead
/// of sending a new memfd; the peer keeps its mapping (`peer_maps`) until we tell it we
/// dropped it (`HELLO_RELEASE`) or the session ends. A region is only ever reused with
/// the peer that already had it mapped: whatever that peer does to it reaches only its
/// own connections.
struct Session {
    stream: UnixStream,
    peer_pid: i32,
    gen: u64,
    inbox: HashMap<u64, Received>,
    /// Our regions, free for the next connection with this peer.
    free: Vec<OwnMem>,
    /// The peer's regions we have mapped, by its numbers.
    peer_maps: HashMap<u32, PeerMem>,
    /// Connections over this session not yet given back: a peer that follows the
    /// protocol has at most `live + FREE_PER_SESSION` regions we know of (it releases
    /// the others), so `peer_maps` beyond that (plus a margin) is a misbehaving peer,
    /// whose session goes rather than let it pile up our mappings and descriptors.
    live: usize,
    /// Hellos of ours sent on it (client, subsequent contact) whose rendezvous has not
    /// looked for the answer yet: while there are any, the session is kept aside when it
    /// is replaced or ends (`SameHost::end_session`).
    out: usize,
}

impl Session {
    fn new(stream: UnixStream, peer_pid: i32, gen: u64) -> io::Result<Session> {
        stream.set_nonblocking(true)?;
        Ok(Session {
            stream,
            peer_pid,
            gen,
            inbox: HashMap::new(),
            free: Vec::new(),
            peer_maps: HashMap::new(),
            live: 0,
            out: 0,
        })
    }

    /// Reads every hello waiting on the socket; hellos nobody asked for in time go.
    fn drain(&mut self) -> io::Result<()> {
        let now = Instant::now();
        self.inbox
            .retain(|_, r| now.duration_since(r.at) < SESSION_HELLO_TTL);
        while let Some((hello, fds)) = exchange::recv_nowait(&self.stream)? {
            if hello.status == HELLO_RELEASE {
                // The peer dropped that region: our mapping of it goes (a connection
                // still writing into it keeps its own reference until it ends).
                self.peer_maps.remove(&hello.region);
                continue;
            }
            if self.inbox.len() >= SESSION_INBOX {
                let oldest = self.inbox.iter().min_by_key(|(_, r)| r.at).map(|(n, _)| *n);
                if let Some(n) = oldest {
                    self.inbox.remove(&n);
                }
            }
            self.inbox.insert(
                hello.nonce,
                Received {
                    hello,
                    fds,
                    at: now,
                },
            );
        }
        Ok(())
    }

    /// The hello for `nonce`, if it came (reading the socket first). A whole hello read
    /// before the stream's end or a broken one counts: the peer sent it, then closed
    /// (a server answers on a session, then may replace it).
    fn take(&mut self, nonce: u64) -> io::Result<Option<Received>> {
        if let Some(r) = self.inbox.remove(&nonce) {
            return Ok(Some(r));
        }
        let drained = self.drain();
        if let Some(r) = self.inbox.remove(&nonce) {
            return Ok(Some(r));
        }
        drained.map(|()| None)
    }
}

/// The same-host state of a stack, shared with its socket thread.
pub(crate) struct SameHost {
    pub stack_id: u64,
    dir: PathBuf,
    rmb_len: u32,
    pending: Mutex<HashMap<u64, Pending>>,
    /// Open sessions with other stacks, by their stack id (lock order: `pending`, then
    /// `sessions`, then `retired`, then `routes`).
    sessions: Mutex<HashMap<u64, Session>>,
    /// Client: sessions replaced or ended while hellos of ours sent on them were still
    /// to be answered (`end_session`); each goes once the last of them has been looked
    /// for. Never used for new hellos, out of the epoll set (lock order: after
    /// `sessions`).
    retired: Mutex<Vec<Session>>,
    /// Client: which stack served an address last (its same-host Accept).
    routes: Mutex<HashMap<SocketAddr, u64>>,
    /// Numbers for our regions and for sessions.
    next_num: AtomicU64,
    /// The sessions' sockets, watched by the event thread (keyed by the peer's stack id)
    /// for what comes on them and for their peer's end (`on_sessions`): a release or the
    /// end of a process that exited is handled at once, not at the next rendezvous
    /// with it, which may never come. `None` if it could not be made: then no session
    /// is kept.
    sess_epoll: Option<OwnedFd>,
    stop: AtomicBool,
    /// The socket thread, started with the first offer.
    thread: Mutex<Option<(PathBuf, JoinHandle<()>)>>,
    /// Server: the exchange thread, which runs the full exchanges one after another
    /// (started with the first; [`Self::connect_later`]).
    exchanger: Mutex<Option<(std::sync::mpsc::Sender<ExchangeJob>, JoinHandle<()>)>>,
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
            sessions: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            routes: Mutex::new(HashMap::new()),
            next_num: AtomicU64::new(1),
            sess_epoll: rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)
                .ok()
                .map(smc_verbs::process::lift),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            exchanger: Mutex::new(None),
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

    /// A client offer for a new rendezvous with `peer`: registers it with a fresh token.
    /// When a stack of this host served `peer` last and our session with it is open, our
    /// hello goes to it now, before the Proposal (subsequent contact).
    pub(crate) fn offer(self: &Arc<Self>, token: u32, peer: SocketAddr) -> Option<SameHostOffer> {
        if !self.ensure_listener() {
            return None;
        }
        let nonce = rand::random::<u64>();
        let pre = self.pre_offer(nonce, token, peer);
        let mut p = self.pending.lock().ok()?;
        p.insert(
            nonce,
            Pending {
                token,
                peer,
                ready: None,
                pre,
                session: None,
            },
        );
        Some(SameHostOffer {
            stack_id: self.stack_id,
            nonce,
        })
    }

    /// Subsequent contact, client side: our memory (a free region of the session, or a
    /// new one) on the session with the stack that served `peer` last. Any failure only
    /// means the server does the full exchange.
    fn pre_offer(&self, nonce: u64, token: u32, peer: SocketAddr) -> Option<PreOffer> {
        let stack = *self.routes.lock().ok()?.get(&peer)?;
        let mut sessions = self.sessions.lock().ok()?;
        let s = sessions.get_mut(&stack)?;
        let link = SessionLink { stack, gen: s.gen };
        let made = (|| -> io::Result<OwnMem> {
            let (rx, fds) = self.own_mem(Some(&mut *s))?;
            let fds: Vec<&OwnedFd> = fds.iter().collect();
            exchange::send_nowait(&s.stream, &hello(nonce, token, &rx), &fds)?;
            Ok(rx)
        })();
        match made {
            Ok(rx) => {
                s.out += 1;
                Some(PreOffer { link, rx })
            }
            Err(e) => {
                debug!(error = %e, stack = format_args!("{stack:016x}"), "same-host session dropped");
                self.end_session(&mut sessions, stack);
                None
            }
        }
    }

    /// Client: the server's stack `server_stack` took the offer `nonce`; is its memory
    /// ready? Either the server did the full exchange with our socket thread, or
    /// (subsequent contact) its answer to the hello we sent on our session with that
    /// same stack is waiting there.
    pub(crate) fn client_ready(&self, nonce: u64, server_stack: u64) -> bool {
        let Ok(mut p) = self.pending.lock() else {
            return false;
        };
        let Some(x) = p.get_mut(&nonce) else {
            return false;
        };
        let Ok(mut ss) = self.sessions.lock() else {
            return false;
        };
        if let Some(setup) = &mut x.ready {
            // The full exchange: its connection becomes our session with that stack,
            // and the server's region is remembered there by its number.
            if let Some((s, pid)) = x.session.take() {
                if let Some(link) = self.add_session(&mut ss, server_stack, s, pid) {
                    if let Some(sess) = ss.get_mut(&server_stack) {
                        if setup.tx_num != 0 {
                            sess.peer_maps.insert(setup.tx_num, setup.tx.clone());
                        }
                        sess.live += 1;
                    }
                    setup.session = Some(link);
                }
            }
            drop(ss);
            self.learn_route(x.peer, server_stack);
            return true;
        }
        let Some(pre) = x.pre.take() else {
            return false;
        };
        let Ok(mut retired) = self.retired.lock() else {
            return false;
        };
        let link = pre.link;
        if link.stack != server_stack {
            // Another stack serves that address now: the memory we sent was never used
            // by this rendezvous.
            hello_done(&mut ss, &mut retired, link);
            if let Some(s) = give_back_in(&mut ss, link, pre.rx, false, false) {
                self.set_aside(s, &mut retired);
            }
            return false;
        }
        // The session the hello went on: ours with that stack still, or one kept aside
        // since (replaced by another rendezvous's exchange, or ended by the server after
        // it answered: the answer is still there to read).
        let live = ss.get(&server_stack).is_some_and(|s| s.gen == link.gen);
        let aside = retired.iter().position(|s| s.gen == link.gen);
        let s = match (live, aside) {
            (true, _) => ss.get_mut(&server_stack).expect("checked above"),
            (false, Some(i)) => &mut retired[i],
            (false, None) => {
                // Gone without a trace: dropped as broken.
                return false;
            }
        };
        let r = match s.take(nonce) {
            Ok(Some(r)) if r.hello.status == HELLO_ACCEPTED => {
                let pid = s.peer_pid;
                peer_mem(&r.hello, r.fds, Some(&mut *s))
                    .map(|tx| finish_setup(pre.rx, x.token, &r.hello, tx, pid, Some(link)))
                    .map_err(|e| (e, None))
            }
            Ok(_) => Err((io::Error::other("no answer on the session"), Some(pre))),
            Err(e) => Err((e, Some(pre))),
        };
        let ok = match r {
            Ok(setup) => {
                if live {
                    s.live += 1;
                }
                x.ready = Some(setup);
                true
            }
            Err((e, pre)) => {
                // The server accepted but its answer is missing or bad: a broken or
                // misbehaving session, which goes (and with it all its memory).
                debug!(error = %e, "same-host answer on the session refused: session dropped");
                if let Some(pre) = pre {
                    // The session goes just below, whatever this says.
                    drop(give_back_in(&mut ss, pre.link, pre.rx, false, false));
                }
                match aside {
                    Some(i) if !live => {
                        retired.swap_remove(i);
                    }
                    _ => {
                        ss.remove(&server_stack);
                    }
                }
                return false;
            }
        };
        hello_done(&mut ss, &mut retired, link);
        ok
    }

    /// Our memory for a connection with the peer of `session`: a free region of it, or a
    /// new one with the descriptors to send (its memfd and a copy of its bell).
    fn own_mem(&self, session: Option<&mut Session>) -> io::Result<(OwnMem, Vec<OwnedFd>)> {
        if let Some(m) = session.and_then(|s| s.free.pop()) {
            return Ok((m, Vec::new()));
        }
        let (region, memfd) = Region::create(self.rmb_len)?;
        let bell = EventFd::new()?;
        let bell_fd = bell_owned(&bell)?;
        let num = (self.next_num.fetch_add(1, Ordering::Relaxed) as u32).max(1);
        Ok((
            OwnMem {
                num,
                region,
                bell: Arc::new(bell),
            },
            vec![memfd, bell_fd],
        ))
    }

    /// A connection's memory at its end (the event thread, once the connection is
    /// released): back to its session's free regions when the peer sent its last CDC
    /// (`clean`), else dropped, and the peer told to drop its mapping.
    pub(crate) fn give_back(&self, link: SessionLink, own: OwnMem, clean: bool) {
        if let Ok(mut ss) = self.sessions.lock() {
            if let Some(s) = give_back_in(&mut ss, link, own, clean, true) {
                self.set_aside_locking(s);
            }
        }
    }

    /// Drops our session with `stack` (broken, replaced, or ended by its peer). While
    /// hellos of ours sent on it have not been looked for, it is kept aside instead —
    /// out of the epoll set, never used for new hellos: a server that found one there
    /// answered on it and is committed (its Accept is on the way), and the client's
    /// rendezvous reads that answer there when the Accept comes.
    fn end_session(&self, ss: &mut HashMap<u64, Session>, stack: u64) {
        if let Some(s) = ss.remove(&stack) {
            self.set_aside_locking(s);
        }
    }

    /// [`Self::set_aside`], taking the `retired` lock (the caller holds no more than
    /// `sessions`).
    fn set_aside_locking(&self, s: Session) {
        if s.out == 0 {
            return;
        }
        if let Ok(mut r) = self.retired.lock() {
            self.set_aside(s, &mut r);
        }
    }

    /// A session taken out of `sessions`: dropped, or kept aside in `retired` while
    /// hellos of ours are out on it (see [`Self::end_session`]).
    fn set_aside(&self, s: Session, retired: &mut Vec<Session>) {
        if s.out == 0 {
            return;
        }
        if let Some(ep) = &self.sess_epoll {
            let _ = rustix::event::epoll::delete(ep, &s.stream);
        }
        retired.push(s);
    }

    /// Keeps `stream` as our session with `stack` (replacing an older one), watched for
    /// its end. Without the watch no session is kept (it could never be reaped).
    fn add_session(
        &self,
        sessions: &mut HashMap<u64, Session>,
        stack: u64,
        stream: UnixStream,
        pid: i32,
    ) -> Option<SessionLink> {
        use rustix::event::epoll;
        let ep = self.sess_epoll.as_ref()?;
        // The older one's descriptor leaves the epoll set as it closes (or is taken out
        // of it, kept aside for hellos of ours still out on it).
        self.end_session(sessions, stack);
        let gen = self.next_num.fetch_add(1, Ordering::Relaxed);
        let s = Session::new(stream, pid, gen).ok()?;
        epoll::add(
            ep,
            &s.stream,
            epoll::EventData::new_u64(stack),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )
        .ok()?;
        sessions.insert(stack, s);
        Some(SessionLink { stack, gen })
    }

    /// The epoll set of the sessions' sockets, for the event thread's `poll`.
    pub(crate) fn sessions_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.sess_epoll.as_ref().map(|f| f.as_fd())
    }

    /// The sessions the event thread found ready: what came on them is read (a hello for
    /// a rendezvous to come waits in the inbox; a release unmaps that region of the peer
    /// now, not at the next rendezvous, which may never come); a session whose peer
    /// closed its end (its process exited, or it dropped the session) goes, with
    /// whatever it held.
    pub(crate) fn on_sessions(&self) {
        use rustix::event::epoll;
        let Some(ep) = &self.sess_epoll else { return };
        // On the stack: this runs once per rendezvous on each side. What does not fit
        // stays ready for the next call (level-triggered).
        let mut buf = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 16];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let Ok((ready, _)) = epoll::wait(ep, &mut buf, Some(&zero)) else {
            return;
        };
        let Ok(mut ss) = self.sessions.lock() else {
            return;
        };
        for ev in ready.iter() {
            let (stack, flags) = (ev.data.u64(), ev.flags);
            let ended = flags.intersects(
                epoll::EventFlags::RDHUP | epoll::EventFlags::HUP | epoll::EventFlags::ERR,
            );
            let Some(s) = ss.get_mut(&stack) else {
                continue;
            };
            if ended || s.drain().is_err() {
                debug!(
                    stack = format_args!("{stack:016x}"),
                    "same-host session ended by its peer"
                );
                self.end_session(&mut ss, stack);
            }
        }
    }

    /// Open sessions (tests).
    #[cfg(test)]
    fn session_count(&self) -> usize {
        self.sessions.lock().map(|s| s.len()).unwrap_or(0)
    }

    fn learn_route(&self, peer: SocketAddr, stack: u64) {
        if let Ok(mut r) = self.routes.lock() {
            if r.len() >= MAX_ROUTES && !r.contains_key(&peer) {
                r.clear();
            }
            r.insert(peer, stack);
        }
    }

    /// Client: the rendezvous of this offer ended. Returns the token and, when the
    /// exchange was done, the memory (the caller uses it or drops it).
    pub(crate) fn take(&self, nonce: u64) -> Option<(u32, Option<ShmSetup>)> {
        let x = self.pending.lock().ok()?.remove(&nonce)?;
        if let Some(pre) = x.pre {
            // Sent on the session but not used: the server may have mapped it.
            if let Ok(mut ss) = self.sessions.lock() {
                if let Ok(mut retired) = self.retired.lock() {
                    hello_done(&mut ss, &mut retired, pre.link);
                    if let Some(s) = give_back_in(&mut ss, pre.link, pre.rx, false, false) {
                        self.set_aside(s, &mut retired);
                    }
                }
            }
        }
        Some((x.token, x.ready))
    }

    /// Server: prove the offering client is on this host and exchange the memory: on
    /// our session with its stack if its hello is waiting there (subsequent contact),
    /// else over a new connection to its socket, kept as that session.
    #[cfg(test)]
    pub(crate) fn connect(&self, offer: &SameHostOffer, token: u32) -> io::Result<ShmSetup> {
        if let Some(r) = self.connect_by_session(offer, token) {
            return r;
        }
        self.connect_full(offer, token)
    }

    /// Server: runs the full exchange for `offer` ([`Self::connect_full`]) on the
    /// stack's exchange thread and hands its outcome to `done` there: a client's process
    /// that answers slowly or not at all (each step waits up to `exchange::IO_TIMEOUT`)
    /// holds up only the first contacts queued behind it, which then go on with SMC-R
    /// when their rendezvous stops waiting (`ClcConfig::same_host_timeout`) — never the
    /// event thread and the connections it serves. An error when no thread can run it
    /// (then `done` is dropped unrun).
    pub(crate) fn connect_later(self: &Arc<Self>, job: ExchangeJob) -> io::Result<()> {
        if self.stop.load(Ordering::SeqCst) {
            // Stopped (`shutdown` took the thread): no new one.
            return Err(io::Error::other("stack stopping"));
        }
        let mut x = self
            .exchanger
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        if x.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<ExchangeJob>();
            // Not an Arc: the thread must not keep the stack's same-host state alive.
            let me = Arc::downgrade(self);
            let h = std::thread::Builder::new()
                .name("smc-samehost-x".into())
                .spawn(move || {
                    for job in rx {
                        let r = match me.upgrade() {
                            Some(sh) if sh.stop.load(Ordering::SeqCst) => {
                                Err(io::Error::other("stack stopping"))
                            }
                            Some(_) if Instant::now() >= job.deadline => Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "its rendezvous stopped waiting",
                            )),
                            Some(sh) => sh.connect_full(&job.offer, job.token),
                            None => Err(io::Error::other("stack gone")),
                        };
                        (job.done)(r);
                    }
                })?;
            *x = Some((tx, h));
        }
        let Some((tx, _)) = x.as_ref() else {
            return Err(io::Error::other("no exchange thread"));
        };
        tx.send(job)
            .map_err(|_| io::Error::other("exchange thread gone"))
    }

    /// Server: the full exchange over a new connection to the client's socket, kept as
    /// our session with its stack. It waits on the client's process (its socket thread
    /// answers; each step bounded by `exchange::IO_TIMEOUT`), so the runtime runs it on
    /// the exchange thread ([`Self::connect_later`]), never on its event thread.
    pub(crate) fn connect_full(&self, offer: &SameHostOffer, token: u32) -> io::Result<ShmSetup> {
        let path = Self::sock_path(&self.dir, offer.stack_id);
        let s = exchange::connect(&path)?;
        let peer_pid = exchange::check_peer(&s)?;
        let (rx, fds) = self.own_mem(None)?;
        let fd_refs: Vec<&OwnedFd> = fds.iter().collect();
        exchange::send(&s, &hello(offer.nonce, token, &rx), &fd_refs)?;
        drop(fds);
        let (h, fds) = exchange::recv(&s)?;
        if h.status != HELLO_ACCEPTED || h.nonce != offer.nonce {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "same-host offer not acknowledged",
            ));
        }
        let tx = peer_mem(&h, fds, None)?;
        let mut setup = finish_setup(rx, token, &h, tx, peer_pid, None);
        if let Ok(mut ss) = self.sessions.lock() {
            if let Some(link) = self.add_session(&mut ss, offer.stack_id, s, peer_pid) {
                if let Some(sess) = ss.get_mut(&offer.stack_id) {
                    if h.region != 0 {
                        sess.peer_maps.insert(h.region, setup.tx.clone());
                    }
                    sess.live += 1;
                }
                setup.session = Some(link);
            }
        }
        Ok(setup)
    }

    /// Subsequent contact, server side: `None` when the client's hello is not on our
    /// session with its stack (the full exchange follows), else the outcome.
    pub(crate) fn connect_by_session(
        &self,
        offer: &SameHostOffer,
        token: u32,
    ) -> Option<io::Result<ShmSetup>> {
        let mut ss = self.sessions.lock().ok()?;
        let s = ss.get_mut(&offer.stack_id)?;
        let got = match s.take(offer.nonce) {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            Err(e) => {
                debug!(error = %e, "same-host session dropped");
                self.end_session(&mut ss, offer.stack_id);
                return None;
            }
        };
        let (peer_pid, link) = (
            s.peer_pid,
            SessionLink {
                stack: offer.stack_id,
                gen: s.gen,
            },
        );
        // Err(true): our answer could not be sent (nothing committed: the full exchange
        // can still follow); Err(false): the hello or its memory is bad.
        let r = (|| -> Result<ShmSetup, (io::Error, bool)> {
            if got.hello.status != HELLO_ACCEPTED {
                return Err((
                    io::Error::new(io::ErrorKind::ConnectionRefused, "same-host hello refused"),
                    false,
                ));
            }
            let tx = peer_mem(&got.hello, got.fds, Some(&mut *s)).map_err(|e| (e, false))?;
            let (rx, fds) = self.own_mem(Some(&mut *s)).map_err(|e| (e, false))?;
            // Answered before our Accept leaves: the client finds it when that comes.
            let fd_refs: Vec<&OwnedFd> = fds.iter().collect();
            exchange::send_nowait(&s.stream, &hello(offer.nonce, token, &rx), &fd_refs)
                .map_err(|e| (e, true))?;
            s.live += 1;
            Ok(finish_setup(
                rx,
                token,
                &got.hello,
                tx,
                peer_pid,
                Some(link),
            ))
        })();
        match r {
            Ok(setup) => Some(Ok(setup)),
            Err((e, unsent)) => {
                // A bad hello, or a client that does not read its session: no more of it.
                debug!(error = %e, "same-host session dropped");
                self.end_session(&mut ss, offer.stack_id);
                // A hello whose answer did not leave (its session broke: the client had
                // replaced it, say) committed nothing: the full exchange, as if it had
                // not been there.
                (!unsent).then_some(Err(e))
            }
        }
    }

    /// The socket thread: answers servers' hellos for our pending offers.
    fn serve(self: Arc<Self>, l: UnixListener) {
        for s in l.incoming() {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let Ok(s) = s else { continue };
            if let Err(e) = self.answer(s) {
                debug!(error = %e, "same-host hello refused");
            }
        }
    }

    fn answer(&self, stream: UnixStream) -> io::Result<()> {
        let s = &stream;
        s.set_read_timeout(Some(exchange::IO_TIMEOUT))?;
        s.set_write_timeout(Some(exchange::IO_TIMEOUT))?;
        let peer_pid = exchange::check_peer(s)?;
        let (h, fds) = exchange::recv(s)?;
        let token = {
            let p = self
                .pending
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?;
            match p.get(&h.nonce) {
                Some(x) if x.ready.is_none() => x.token,
                _ => {
                    drop(p);
                    let no = SameHostHello {
                        nonce: h.nonce,
                        token: 0,
                        rmb_len: 0,
                        status: HELLO_REFUSED,
                        region: 0,
                    };
                    let _ = exchange::send(s, &no, &[]);
                    return Err(io::Error::other("no such offer"));
                }
            }
        };
        let tx = peer_mem(&h, fds, None)?;
        let (rx, my_fds) = self.own_mem(None)?;
        let reply = hello(h.nonce, token, &rx);
        let setup = finish_setup(rx, token, &h, tx, peer_pid, None);
        // Ready before the server hears back: it answers the client on TCP at once, and
        // the client's rendezvous asks for the memory as soon as that arrives.
        {
            let mut p = self
                .pending
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?;
            match p.get_mut(&h.nonce) {
                Some(x) if x.ready.is_none() => {
                    x.ready = Some(setup);
                    // Our session with the server's stack, once its Accept names it.
                    x.session = s.try_clone().ok().map(|c| (c, peer_pid));
                }
                _ => return Err(io::Error::other("offer gone meanwhile")),
            }
        }
        let fd_refs: Vec<&OwnedFd> = my_fds.iter().collect();
        let sent = exchange::send(s, &reply, &fd_refs);
        if sent.is_err() {
            // The server goes on with SMC-R; this memory will not be used.
            if let Ok(mut p) = self.pending.lock() {
                if let Some(x) = p.get_mut(&h.nonce) {
                    x.ready = None;
                    x.session = None;
                }
            }
        }
        sent
    }

    /// Stops the socket thread and removes the socket (stack shutdown).
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // The exchange thread ends with its queue (what is queued still runs, bounded).
        let x = self.exchanger.lock().ok().and_then(|mut x| x.take());
        if let Some((tx, h)) = x {
            drop(tx);
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
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
        if let Ok(mut s) = self.sessions.lock() {
            s.clear();
        }
        if let Ok(mut r) = self.retired.lock() {
            r.clear();
        }
    }
}

/// Our hello for a rendezvous, naming our memory.
fn hello(nonce: u64, token: u32, rx: &OwnMem) -> SameHostHello {
    SameHostHello {
        nonce,
        token,
        rmb_len: rx.region.data.len() as u32,
        status: HELLO_ACCEPTED,
        region: rx.num,
    }
}

/// See [`SameHost::give_back`]; with the sessions locked.
/// A hello of ours sent on the session `link` has been looked for (or its rendezvous
/// ended): a session kept aside for such hellos goes with the last of them.
fn hello_done(ss: &mut HashMap<u64, Session>, retired: &mut Vec<Session>, link: SessionLink) {
    if let Some(s) = ss.get_mut(&link.stack).filter(|s| s.gen == link.gen) {
        s.out = s.out.saturating_sub(1);
        return;
    }
    if let Some(i) = retired.iter().position(|s| s.gen == link.gen) {
        retired[i].out = retired[i].out.saturating_sub(1);
        if retired[i].out == 0 {
            retired.swap_remove(i);
        }
    }
}

/// A connection's memory back to its session (see `SameHost::give_back`). Returns the
/// session when telling the peer failed and it was taken out of `ss` as broken: the
/// caller keeps it aside if hellos of ours are still out on it (`set_aside`).
#[must_use]
fn give_back_in(
    ss: &mut HashMap<u64, Session>,
    link: SessionLink,
    own: OwnMem,
    clean: bool,
    counted: bool,
) -> Option<Session> {
    let Some(s) = ss.get_mut(&link.stack).filter(|s| s.gen == link.gen) else {
        // That session is gone: so is the peer's mapping of this memory.
        return None;
    };
    if counted {
        s.live = s.live.saturating_sub(1);
    }
    if clean && s.free.len() < FREE_PER_SESSION {
        // A fresh start for the next connection's ring (its indices begin at 0); the
        // RMB keeps what this peer itself wrote there, which tells it nothing new.
        own.region.ctrl.fill(0, region::CTRL_LEN, 0);
        own.bell.drain();
        s.free.push(own);
        return None;
    }
    let release = SameHostHello {
        nonce: 0,
        token: 0,
        rmb_len: 0,
        status: HELLO_RELEASE,
        region: own.num,
    };
    if exchange::send_nowait(&s.stream, &release, &[]).is_err() {
        return ss.remove(&link.stack);
    }
    None
}

/// A second descriptor of our bell, to send (closed after sending).
fn bell_owned(bell: &EventFd) -> io::Result<OwnedFd> {
    use std::os::fd::AsFd;
    bell.as_fd().try_clone_to_owned()
}

/// The peer's memory a hello names: sent with it (two descriptors, checked and mapped,
/// then remembered on the session under the peer's number), or (no descriptors) one of
/// the session's that the peer named by number.
fn peer_mem(
    h: &SameHostHello,
    mut fds: Vec<OwnedFd>,
    session: Option<&mut Session>,
) -> io::Result<PeerMem> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    if fds.is_empty() {
        let m = session
            .filter(|_| h.region != 0)
            .and_then(|s| s.peer_maps.get(&h.region).cloned())
            .ok_or_else(|| bad("same-host hello names a region we do not have"))?;
        if m.region.data.len() != h.rmb_len as usize {
            return Err(bad("same-host hello: another size for a known region"));
        }
        return Ok(m);
    }
    if fds.len() != 2 {
        return Err(bad("same-host hello without its two descriptors"));
    }
    let peer_bell = fds.pop().expect("two descriptors");
    let memfd = fds.pop().expect("two descriptors");
    exchange::check_eventfd(&peer_bell)?;
    let m = PeerMem {
        region: Region::map_peer(&memfd, h.rmb_len)?,
        bell: Arc::new(peer_bell),
    };
    if let Some(s) = session {
        if h.region != 0 {
            if s.peer_maps.len() >= s.live + 1 + 2 * FREE_PER_SESSION {
                return Err(bad("same-host peer holds more regions than it may"));
            }
            s.peer_maps.insert(h.region, m.clone());
        }
    }
    Ok(m)
}

/// The connection's memory, both sides known.
fn finish_setup(
    rx: OwnMem,
    local_token: u32,
    h: &SameHostHello,
    tx: PeerMem,
    peer_pid: i32,
    session: Option<SessionLink>,
) -> ShmSetup {
    ShmSetup {
        local_token,
        peer_token: h.token,
        rx,
        tx,
        tx_num: h.region,
        peer_pid,
        session,
    }
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
    pub bell: Arc<EventFd>,
    /// The peer's doorbell.
    pub peer_bell: Arc<OwnedFd>,
    pub peer_pid: i32,
    /// Our number for our region (`OwnMem::num`) and the session it goes back to.
    pub rx_num: u32,
    pub session: Option<SessionLink>,
    /// Our ring position as last seen under the lock (a hint for spinning threads).
    pub rx_tail_hint: AtomicU64,
}

/// The rings, under the connection's lock.
pub(crate) struct ShmRings {
    pub rx: RxRing,
    pub tx: TxRing,
}

impl ShmPath {
    pub(crate) fn new(s: ShmSetup) -> io::Result<(ShmPath, ShmRings, Arc<RdmaBuffer>)> {
        let rings = ShmRings {
            rx: RxRing {
                ctrl: s.rx.region.ctrl.clone(),
                tail: 0,
            },
            tx: TxRing {
                ctrl: s.tx.region.ctrl.clone(),
                head: 0,
            },
        };
        let p = ShmPath {
            rx_ctrl: s.rx.region.ctrl,
            tx_data: s.tx.region.data,
            bell: s.rx.bell,
            peer_bell: s.tx.bell,
            peer_pid: s.peer_pid,
            rx_num: s.rx.num,
            session: s.session,
            rx_tail_hint: AtomicU64::new(0),
        };
        Ok((p, rings, s.rx.region.data))
    }

    /// Our region as the session keeps it for reuse ([`SameHost::give_back`]): its
    /// number, control page, RMB (`rmb`, held by the connection) and doorbell.
    pub(crate) fn own_mem(&self, rmb: Arc<RdmaBuffer>) -> OwnMem {
        OwnMem {
            num: self.rx_num,
            region: Region {
                ctrl: self.rx_ctrl.clone(),
                data: rmb,
            },
            bell: self.bell.clone(),
        }
    }

    /// Wakes the peer's event thread.
    pub(crate) fn ring_peer(&self) {
        let _ = rustix::io::write(&self.peer_bell, &1u64.to_ne_bytes());
    }

    /// A CDC is waiting in our ring (no lock needed).
    pub(crate) fn rx_pending(&self) -> bool {
        RxRing::pending(&self.rx_ctrl, self.rx_tail_hint.load(Ordering::Acquire))
    }
}

/// The connection of a finished same-host rendezvous: the SMC-R connection machine over
/// this memory (docs/samehost.md "Memory").
pub(crate) fn new_conn(
    inner: &Arc<super::Inner>,
    local: std::net::SocketAddr,
    peer: std::net::SocketAddr,
    // Taken only once nothing else can fail: on an error the caller still has it (to
    // reset the peer's TCP connection).
    tcp: &mut Option<std::net::TcpStream>,
    setup: ShmSetup,
    sndbuf: Arc<RdmaBuffer>,
) -> io::Result<Arc<super::conn::ConnShared>> {
    use super::conn::{ConnParts, ConnShared, ConnState, Kind, Path as ConnPath};
    let cfg = &inner.cfg;
    let (token, peer_token, peer_len) = (
        setup.local_token,
        setup.peer_token,
        setup.tx.region.data.len() as u32,
    );
    let (path, rings, rmb) = ShmPath::new(setup)?;
    let geo = |len: u32| {
        // No eye catcher: the RMB is ours alone (RFC 7609 §4.2's is optional).
        crate::conn::RmbeGeometry::linux(len)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
    };
    let params = crate::conn::ConnParams::new(
        geo(rmb.len() as u32)?,
        geo(peer_len)?,
        sndbuf.len().min(u32::MAX as usize) as u32,
        token,
        peer_token,
    );
    let conn = crate::conn::Conn::new(params, cfg.conn.clone())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
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
            state: ConnState::new(conn, ConnPath::Shm(rings), tcp.take()),
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
        let offer = client.offer(0x1111, addr(1)).expect("offer");
        assert!(!client.client_ready(offer.nonce, server.stack_id));
        // A wrong nonce is refused by the client's socket.
        let bad = SameHostOffer {
            nonce: offer.nonce ^ 1,
            ..offer
        };
        assert!(server.connect(&bad, 0x2222).is_err());
        let s = server.connect(&offer, 0x2222).expect("exchange");
        assert_eq!((s.local_token, s.peer_token), (0x2222, 0x1111));
        assert_eq!(s.tx.region.data.len(), 64 << 10);
        assert!(client.client_ready(offer.nonce, server.stack_id));
        // Answered once only.
        assert!(server.connect(&offer, 0x3333).is_err());
        let (token, c) = client.take(offer.nonce).unwrap();
        let c = c.unwrap();
        assert_eq!((token, c.peer_token), (0x1111, 0x2222));
        assert_eq!(c.tx.region.data.len(), 32 << 10);
        // The two sides see the same bytes.
        s.tx.region.data.write(5, b"to client");
        let mut b = [0u8; 9];
        c.rx.region.data.read(5, &mut b);
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

    fn addr(n: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, n], 5000))
    }

    /// Waits up to `ms` for one of `sh`'s sessions to be ready (what the event thread's
    /// poll would see): the number of ready descriptors (0 or 1).
    fn sessions_ready(sh: &SameHost, ms: u64) -> usize {
        let fd = sh.sessions_fd().unwrap();
        let mut pfd = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let d = Duration::from_millis(ms);
        let t = rustix::event::Timespec {
            tv_sec: d.as_secs() as i64,
            tv_nsec: i64::from(d.subsec_nanos()),
        };
        rustix::event::poll(&mut pfd, Some(&t)).unwrap()
    }

    /// The exchange thread runs a job and hands its outcome back; a job whose rendezvous
    /// stopped waiting before its turn is not run (nothing reaches the client's socket);
    /// once the stack stops, nothing more runs.
    #[test]
    fn the_exchange_thread_runs_jobs_and_skips_expired_ones() {
        let dir = std::env::temp_dir().join(format!("smc-rs-shm-later-{}", std::process::id()));
        let client = Arc::new(SameHost::new(dir.clone(), 64 << 10));
        let server = Arc::new(SameHost::new(dir.clone(), 32 << 10));
        let run = |offer: SameHostOffer, deadline: Instant| {
            let (tx, rx) = std::sync::mpsc::channel();
            server
                .connect_later(ExchangeJob {
                    offer,
                    token: 7,
                    deadline,
                    done: Box::new(move |r| tx.send(r.map(|s| s.peer_token)).unwrap()),
                })
                .unwrap();
            rx.recv_timeout(Duration::from_secs(5)).unwrap()
        };
        let late = client.offer(1, addr(2)).expect("offer");
        let e = run(late, Instant::now() - Duration::from_millis(1)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(
            !client.client_ready(late.nonce, server.stack_id),
            "an expired job never reached the client"
        );
        let ok = client.offer(2, addr(2)).expect("offer");
        assert_eq!(run(ok, Instant::now() + Duration::from_secs(5)).unwrap(), 2);
        assert!(client.client_ready(ok.nonce, server.stack_id));
        server.shutdown();
        let stopped = client.offer(3, addr(2)).expect("offer");
        assert!(
            server
                .connect_later(ExchangeJob {
                    offer: stopped,
                    token: 8,
                    deadline: Instant::now() + Duration::from_secs(5),
                    done: Box::new(|_| panic!("run after the stack stopped")),
                })
                .is_err(),
            "no exchange thread once the stack stopped"
        );
        client.shutdown();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A server that found a pre-offered hello on the session and answered it there is
    /// committed (its Accept is on the way), so the client must find that answer even
    /// when, meanwhile, its session with that stack was replaced (another rendezvous's
    /// full exchange, as concurrent first contacts make) or ended (the server replaced
    /// its end): without it the connection is reset. Both orders of the two events.
    #[test]
    fn an_answer_on_a_replaced_session_is_still_found() {
        for replaced_first in [true, false] {
            let dir = std::env::temp_dir().join(format!(
                "smc-rs-shm-retired-{}-{replaced_first}",
                std::process::id()
            ));
            let client = Arc::new(SameHost::new(dir.clone(), 64 << 10));
            let server = Arc::new(SameHost::new(dir.clone(), 32 << 10));
            let first = client.offer(1, addr(2)).expect("offer");
            server.connect(&first, 100).expect("full exchange");
            assert!(client.client_ready(first.nonce, server.stack_id));
            drop(client.take(first.nonce));
            // A: pre-offered on the session; the server takes it there and answers.
            let a = client.offer(2, addr(2)).expect("offer");
            assert!(client.pending.lock().unwrap()[&a.nonce].pre.is_some());
            let sa = server.connect(&a, 200).expect("on the session");
            // B: to another address of the same stack (no route yet): the full
            // exchange, after which both sides keep B's connection as their session.
            let b = client.offer(3, addr(3)).expect("offer");
            assert!(client.pending.lock().unwrap()[&b.nonce].pre.is_none());
            let sb = server.connect(&b, 300).expect("full exchange");
            let ended = || {
                // The server closed A's session when it replaced it (once the client
                // set that session aside, nothing of it is in the set: a short wait).
                sessions_ready(&client, 200);
                client.on_sessions();
            };
            if replaced_first {
                assert!(client.client_ready(b.nonce, server.stack_id));
                ended();
            } else {
                ended();
                assert!(client.client_ready(b.nonce, server.stack_id));
            }
            assert!(
                client.client_ready(a.nonce, server.stack_id),
                "A's answer found on the session it came on (replaced first: {replaced_first})"
            );
            let ca = client.take(a.nonce).unwrap().1.unwrap();
            assert_eq!((ca.peer_token, sa.peer_token), (200, 2));
            sa.tx.region.data.write(3, b"late");
            let mut got = [0u8; 4];
            ca.rx.region.data.read(3, &mut got);
            assert_eq!(&got, b"late");
            let cb = client.take(b.nonce).unwrap().1.unwrap();
            assert_eq!((cb.peer_token, sb.peer_token), (300, 3));
            assert!(
                client.retired.lock().unwrap().is_empty(),
                "nothing of A's session kept once A is done"
            );
            client.shutdown();
            server.shutdown();
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// The full exchange once, then every rendezvous between the same two stacks on
    /// the session it left: the client's hello is on it before the server looks, the
    /// server's answer before the client looks, and no Unix connection is made (the
    /// client's socket is gone and it still works). What must not use the session:
    /// another stack's Accept, and a broken session (the full exchange again).
    #[test]
    fn subsequent_contact_on_the_session() {
        let dir = std::env::temp_dir().join(format!("smc-rs-shm-sess-{}", std::process::id()));
        let client = Arc::new(SameHost::new(dir.clone(), 64 << 10));
        let server = Arc::new(SameHost::new(dir.clone(), 32 << 10));
        let other = Arc::new(SameHost::new(dir.clone(), 32 << 10));
        let first = client.offer(1, addr(2)).expect("offer");
        assert!(
            client.pending.lock().unwrap()[&first.nonce].pre.is_none(),
            "first contact"
        );
        server.connect(&first, 100).expect("full exchange");
        assert!(client.client_ready(first.nonce, server.stack_id));
        drop(client.take(first.nonce));
        assert!(server
            .sessions
            .lock()
            .unwrap()
            .contains_key(&client.stack_id));
        assert!(client
            .sessions
            .lock()
            .unwrap()
            .contains_key(&server.stack_id));

        // Nobody can connect to the client's socket any more: only the session works.
        let path = SameHost::sock_path(&dir, client.stack_id);
        let hidden = dir.join("hidden.sock");
        std::fs::rename(&path, &hidden).unwrap();
        // Rounds 1 and 2 reuse the regions round 0 gave back (same numbers, no memfd
        // sent), their rings starting afresh.
        let mut nums = None;
        for round in 0..3u32 {
            let o = client.offer(10 + round, addr(2)).expect("offer");
            assert!(
                client.pending.lock().unwrap()[&o.nonce].pre.is_some(),
                "pre-offered"
            );
            let s = server.connect(&o, 200 + round).expect("on the session");
            assert!(
                client.client_ready(o.nonce, server.stack_id),
                "round {round}"
            );
            let (token, c) = client.take(o.nonce).unwrap();
            let c = c.unwrap();
            assert_eq!(
                (token, c.peer_token, s.peer_token),
                (10 + round, 200 + round, 10 + round)
            );
            let now = (c.rx.num, s.rx.num);
            assert_eq!(
                (c.tx_num, s.tx_num),
                (now.1, now.0),
                "each names the other's"
            );
            if round > 0 {
                assert_eq!(Some(now), nums, "round {round} reuses the regions");
            }
            nums = Some(now);
            let mut head = [0xffu8; 8];
            c.rx.region.ctrl.read(0, &mut head);
            assert_eq!(head, [0; 8], "a reused ring starts empty");
            s.tx.region.data.write(7, b"session");
            let mut b = [0u8; 7];
            c.rx.region.data.read(7, &mut b);
            assert_eq!(&b, b"session");
            c.tx.region.data.write(9, b"back");
            let mut b = [0u8; 4];
            s.rx.region.data.read(9, &mut b);
            assert_eq!(&b, b"back");
            // Something in the ring, as a connection leaves it.
            s.tx.region.ctrl.write(0, &[7; 8]);
            // Both connections ended cleanly: the memory goes back to the session.
            client.give_back(c.session.unwrap(), c.rx, true);
            server.give_back(s.session.unwrap(), s.rx, true);
        }

        // A connection that did not end cleanly: its region is not kept, and the peer,
        // told, drops its mapping of it as soon as its event thread looks.
        let o = client.offer(30, addr(2)).expect("offer");
        let s = server.connect(&o, 300).expect("on the session");
        assert!(client.client_ready(o.nonce, server.stack_id));
        let c = client.take(o.nonce).unwrap().1.unwrap();
        let num = c.rx.num;
        let mapped = |sh: &SameHost| {
            sh.sessions.lock().unwrap()[&client.stack_id]
                .peer_maps
                .contains_key(&num)
        };
        assert!(mapped(&server));
        client.give_back(c.session.unwrap(), c.rx, false);
        assert_eq!(sessions_ready(&server, 1000), 1);
        server.on_sessions();
        assert!(!mapped(&server), "released");
        assert!(client.sessions.lock().unwrap()[&server.stack_id]
            .free
            .is_empty());
        server.give_back(s.session.unwrap(), s.rx, true);

        // Pre-offered to `server`, but `other` answers the address now: the Accept names
        // `other`, whose exchange with the client (socket gone) fails: not ready. The
        // memory sent to `server` is not used.
        let o = client.offer(20, addr(2)).expect("offer");
        assert!(other.connect(&o, 300).is_err(), "no socket to reach");
        assert!(!client.client_ready(o.nonce, other.stack_id));
        drop(client.take(o.nonce));

        // The server's stack goes: its end of the session closes, which the client's
        // event thread sees on the sessions' epoll set (`on_sessions`); then the next
        // offer is a first contact again, and the client takes nothing that is not there.
        assert_eq!(client.session_count(), 1);
        server.shutdown();
        assert_eq!(
            sessions_ready(&client, 5000),
            1,
            "the session's end is seen"
        );
        client.on_sessions();
        assert_eq!(client.session_count(), 0);
        let o = client.offer(21, addr(2)).expect("offer");
        assert!(client.pending.lock().unwrap()[&o.nonce].pre.is_none());
        assert!(!client.client_ready(o.nonce, server.stack_id));
        drop(client.take(o.nonce));
        // Back in place for the shutdown (which wakes the socket thread through it).
        std::fs::rename(&hidden, &path).unwrap();
        client.shutdown();
        other.shutdown();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A client that sends a new region with every rendezvous and never releases any
    /// (what no smc-rs stack does) would pile up mappings and descriptors in the server:
    /// once the server knows more of its regions than its live connections and free
    /// lists explain, the session goes, and with it everything the server mapped.
    #[test]
    fn a_peer_that_piles_up_regions_loses_its_session() {
        let dir = std::env::temp_dir().join(format!("smc-rs-shm-pile-{}", std::process::id()));
        let client = Arc::new(SameHost::new(dir.clone(), 16 << 10));
        let server = Arc::new(SameHost::new(dir.clone(), 16 << 10));
        let first = client.offer(1, addr(3)).expect("offer");
        let s = server.connect(&first, 100).expect("full exchange");
        assert!(client.client_ready(first.nonce, server.stack_id));
        drop(client.take(first.nonce));
        server.give_back(s.session.unwrap(), s.rx, true);
        let mut dropped_at = None;
        for round in 0..100u32 {
            let o = client.offer(10 + round, addr(3)).expect("offer");
            match server.connect(&o, 200 + round) {
                Ok(s) => {
                    // The server's connection ends cleanly every time; the client never
                    // gives its memory back (its free list stays empty: a new region
                    // each time) and releases nothing.
                    server.give_back(s.session.unwrap(), s.rx, true);
                    assert!(client.client_ready(o.nonce, server.stack_id));
                    drop(client.take(o.nonce));
                }
                Err(_) => {
                    dropped_at = Some(round);
                    drop(client.take(o.nonce));
                    break;
                }
            }
        }
        let at = dropped_at.expect("the session is dropped");
        assert!(
            (30..40).contains(&at),
            "dropped at round {at}: live + 1 + 2 x 16 regions"
        );
        assert_eq!(server.session_count(), 0);
        client.shutdown();
        server.shutdown();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
