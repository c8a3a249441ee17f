//! What a process publishes of its SMC sockets for `smc ss`, `smc lgr`, `smc stats`
//! (README, "Observing SMC sockets").
//!
//! Each process whose global stack started ([`crate::Stack::global`]) serves its state
//! on an abstract Unix socket named `smc-rs/<pid>` ([`SOCKET_PREFIX`]). Abstract names
//! have no file: the kernel removes the name when the process dies (SIGKILL included),
//! so nothing stale is ever listed; they are scoped to the network namespace, as the
//! kernel's own SMC socket listings are. A client (the `smc` command) finds them in
//! `/proc/net/unix`, connects, sends one request line (`get`, or `reset`, which zeroes
//! the process's cumulative counters and answers `get`) and reads one JSON document.
//! Only root or the process's own user may ask (SO_PEERCRED).
//!
//! TCP fallbacks leave the stack (the application owns the TCP socket), so the stack
//! remembers each by its socket's inode ([`record_fallback`]) and lists those still
//! open in the process, with the kernel's TCP state and byte counts.
//! `SMC_RS_PUBLISH=0` turns the publication off.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

use crate::clc::FallbackReason;
use crate::Stack;
use smc_verbs::process::PerProcess;

/// Abstract socket names: `smc-rs/<pid>`.
pub const SOCKET_PREFIX: &str = "smc-rs/";
/// Version of the JSON document.
pub const FORMAT_VERSION: u32 = 1;
/// At most this many fallbacks are remembered (closed ones are pruned first).
const MAX_FALLBACKS: usize = 4096;

/// A connection that stayed TCP.
#[derive(Clone, Debug)]
struct Fallback {
    inode: u64,
    local: SocketAddr,
    peer: SocketAddr,
    role: &'static str,
    reason: FallbackReason,
}

// Per process (smc_verbs::process): a forked child counts its own connections, and a
// lock a parent's thread held at fork() is not held in the child's fresh copy.
static FALLBACKS: PerProcess<Mutex<Vec<Fallback>>> = PerProcess::new();

/// Counters zeroed by `reset` (cumulative ones: they are reported minus these).
static BASELINE: PerProcess<Mutex<Option<Baseline>>> = PerProcess::new();
/// The counters at the last reset, and the fallbacks by code then.
type Baseline = (crate::Stats, BTreeMap<u32, u64>);
/// Fallbacks by local reason code, ever.
static BY_CODE: PerProcess<Mutex<BTreeMap<u32, u64>>> = PerProcess::new();

fn lock<T: Default + Send + 'static>(
    m: &PerProcess<Mutex<T>>,
) -> std::sync::MutexGuard<'static, T> {
    m.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Remembers a connection that stays TCP (`role`: "client" or "server").
pub(crate) fn record_fallback(tcp: &TcpStream, role: &'static str, reason: &FallbackReason) {
    *lock(&BY_CODE).entry(reason.local.0).or_default() += 1;
    let (Ok(local), Ok(peer), Some(inode)) = (tcp.local_addr(), tcp.peer_addr(), inode_of(tcp))
    else {
        return;
    };
    let mut v = lock(&FALLBACKS);
    if v.len() >= MAX_FALLBACKS {
        let open = open_socket_fds();
        v.retain(|f| open.contains_key(&f.inode));
        if v.len() >= MAX_FALLBACKS {
            v.remove(0);
        }
    }
    v.push(Fallback {
        inode,
        local,
        peer,
        role,
        reason: reason.clone(),
    });
}

fn inode_of(tcp: &TcpStream) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat on a descriptor the TcpStream owns, into a buffer of the right type.
    if unsafe { libc::fstat(tcp.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat returned 0: the struct is initialised.
    Some(unsafe { st.assume_init() }.st_ino)
}

/// The process's socket descriptors by inode (`/proc/self/fd/N -> socket:[INODE]`).
fn open_socket_fds() -> HashMap<u64, i32> {
    let mut m = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return m;
    };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.to_string_lossy();
            if let Some(ino) = t
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse().ok())
            {
                m.insert(ino, fd);
            }
        }
    }
    m
}

/// TCP states by socket inode, from the kernel's tables of this namespace.
fn tcp_states() -> HashMap<u64, &'static str> {
    const NAMES: [&str; 13] = [
        "?",
        "ESTABLISHED",
        "SYN_SENT",
        "SYN_RECV",
        "FIN_WAIT1",
        "FIN_WAIT2",
        "TIME_WAIT",
        "CLOSE",
        "CLOSE_WAIT",
        "LAST_ACK",
        "LISTEN",
        "CLOSING",
        "NEW_SYN_RECV",
    ];
    let mut m = HashMap::new();
    for f in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 10 {
                continue;
            }
            let st = usize::from_str_radix(cols[3], 16).unwrap_or(0);
            if let Ok(ino) = cols[9].parse::<u64>() {
                m.insert(ino, NAMES.get(st).copied().unwrap_or("?"));
            }
        }
    }
    m
}

/// Bytes acknowledged by the peer and received, of a TCP socket of this process.
fn tcp_bytes(fd: i32) -> Option<(u64, u64)> {
    let mut ti = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt into a zeroed tcp_info of the given length; a descriptor that
    // is no longer a TCP socket makes it fail, which is handled.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            ti.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: zero-initialised and partly filled by the kernel: every bit pattern is a
    // valid tcp_info (plain integers).
    let ti = unsafe { ti.assume_init() };
    Some((ti.tcpi_bytes_acked, ti.tcpi_bytes_received))
}

fn code_json(code: smc_wire::decline::DeclineCode) -> Value {
    json!({
        "code": format!("{:#010x}", code.0),
        "name": code.name(),
        "text": code.explain(),
    })
}

/// The fallbacks still open in this process.
fn fallbacks_json() -> Vec<Value> {
    let list = lock(&FALLBACKS).clone();
    if list.is_empty() {
        return Vec::new();
    }
    let open = open_socket_fds();
    let states = tcp_states();
    let mut out = Vec::new();
    let mut alive = Vec::new();
    for f in list {
        let Some(&fd) = open.get(&f.inode) else {
            continue;
        };
        let (sent, received) = tcp_bytes(fd).unwrap_or((0, 0));
        out.push(json!({
            "local": f.local.to_string(),
            "peer": f.peer.to_string(),
            "role": f.role,
            "mode": "TCP",
            "state": states.get(&f.inode).copied().unwrap_or("?"),
            "reason": f.reason.to_string(),
            "local_code": code_json(f.reason.local),
            "peer_code": f.reason.peer.map(code_json),
            "policy": f.reason.detail.as_deref().is_some_and(|d| d.starts_with("policy")),
            "bytes_sent": sent,
            "bytes_received": received,
        }));
        alive.push(f.inode);
    }
    // Forget the closed ones.
    lock(&FALLBACKS).retain(|f| alive.contains(&f.inode));
    out
}

fn stats_json(stack: &Stack) -> Value {
    let mut s = stack.stats();
    let mut by_code = lock(&BY_CODE).clone();
    if let Some((b, bc)) = &*lock(&BASELINE) {
        s.smc_total -= b.smc_total.min(s.smc_total);
        s.first_contacts -= b.first_contacts.min(s.first_contacts);
        s.fallbacks -= b.fallbacks.min(s.fallbacks);
        s.resets -= b.resets.min(s.resets);
        s.rmbs_deleted -= b.rmbs_deleted.min(s.rmbs_deleted);
        s.lgrs_ended -= b.lgrs_ended.min(s.lgrs_ended);
        s.links_failed -= b.links_failed.min(s.links_failed);
        s.same_host_total -= b.same_host_total.min(s.same_host_total);
        s.same_host_violations -= b.same_host_violations.min(s.same_host_violations);
        s.llc_received -= b.llc_received.min(s.llc_received);
        s.llc_sent -= b.llc_sent.min(s.llc_sent);
        s.llc_dropped -= b.llc_dropped.min(s.llc_dropped);
        for (k, v) in bc {
            if let Some(n) = by_code.get_mut(k) {
                *n -= (*v).min(*n);
            }
        }
        by_code.retain(|_, n| *n > 0);
    }
    let reasons: Vec<Value> = by_code
        .iter()
        .map(|(c, n)| {
            let mut v = code_json(smc_wire::decline::DeclineCode(*c));
            v["count"] = json!(n);
            v
        })
        .collect();
    let sizes = stack.buffer_sizes();
    let map = |m: &BTreeMap<usize, usize>| -> Value {
        m.iter()
            .map(|(size, n)| (size.to_string(), json!(n)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let bytes = |m: &BTreeMap<usize, usize>| m.iter().map(|(size, n)| size * n).sum::<usize>();
    json!({
        "rmb_bytes": bytes(&sizes.rmbs),
        "rmb_sizes": map(&sizes.rmbs),
        "sndbuf_bytes": bytes(&sizes.sndbufs),
        "sndbuf_sizes": map(&sizes.sndbufs),
        "link_groups": s.link_groups,
        "links": s.links,
        "rmbs": s.rmbs,
        "rmb_elements_in_use": s.rmb_elements_in_use,
        "smc_connections": s.smc_connections,
        "same_host_connections": s.same_host_connections,
        "same_host_total": s.same_host_total,
        "same_host_violations": s.same_host_violations,
        "handshakes": s.handshakes,
        "listeners": s.listeners,
        "smc_total": s.smc_total,
        "first_contacts": s.first_contacts,
        "fallbacks": s.fallbacks,
        "fallback_reasons": reasons,
        "handshake_resets": s.resets,
        "rmbs_deleted": s.rmbs_deleted,
        "lgrs_ended": s.lgrs_ended,
        "links_failed": s.links_failed,
        "llc_received": s.llc_received,
        "llc_sent": s.llc_sent,
        "llc_dropped": s.llc_dropped,
    })
}

fn process_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

/// The MODE of a connection in `smc ss` from its `ConnInfo::mode`: CLC while the
/// handshake runs, SAMEHOST on the same-host path (docs/samehost.md: SMC without RDMA,
/// no link group), SMCR otherwise.
fn mode_label(mode: &str) -> &'static str {
    match mode {
        "rendezvous" => "CLC",
        "same-host" => "SAMEHOST",
        _ => "SMCR",
    }
}

/// This process's state as the JSON document `smc ss`/`lgr`/`stats` read.
pub fn snapshot(stack: &Stack) -> Value {
    let conns: Vec<Value> = stack
        .connections()
        .into_iter()
        .map(|c| {
            json!({
                "local": c.local.to_string(),
                "peer": c.peer.to_string(),
                "mode": mode_label(&c.mode),
                "detail": c.mode,
                "state": c.state,
                "lgr": c.lgr.map(|l| l.to_string()),
                "bytes_sent": c.bytes_sent,
                "bytes_received": c.bytes_received,
            })
        })
        .collect();
    let lgrs: Vec<Value> = stack
        .link_groups()
        .into_iter()
        .map(|g| {
            json!({
                "id": g.id.to_string(),
                "role": g.role,
                "version": g.version,
                "peer": g.peer,
                "conns": g.conns,
                "rmbs": g.rmbs,
                "rmbs_in_use": g.rmbs_in_use,
                "state": if g.idle { "IDLE" } else { "ACTIVE" },
                "links": g.links.iter().map(|l| json!({
                    "num": l.num,
                    "state": l.state,
                    "device": l.device,
                    "gid": l.gid,
                    "qpn": l.qpn,
                    "peer_qpn": l.peer_qpn,
                    "peer_gid": l.peer_gid,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "version": FORMAT_VERSION,
        "pid": std::process::id(),
        "process": process_name(),
        "listeners": stack.listener_addrs().iter().map(|a| json!({"local": a.to_string()})).collect::<Vec<_>>(),
        "connections": conns,
        "fallbacks": fallbacks_json(),
        "link_groups": lgrs,
        "stats": stats_json(stack),
    })
}

/// Zeroes this process's cumulative counters (what `smc stats reset` asks).
pub fn reset(stack: &Stack) {
    *lock(&BASELINE) = Some((stack.stats(), lock(&BY_CODE).clone()));
}

/// Serves [`snapshot`] on `smc-rs/<pid>` from a thread of its own (module docs).
pub(crate) fn publish(stack: &'static Stack) {
    if smc_verbs::process::config_var("SMC_RS_PUBLISH").is_some_and(|v| v.trim() == "0") {
        return;
    }
    use std::os::linux::net::SocketAddrExt;
    let name = format!("{SOCKET_PREFIX}{}", std::process::id());
    let l = match std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| UnixListener::bind_addr(&a))
    {
        Ok(l) => smc_verbs::process::lift(l),
        Err(e) => {
            tracing::warn!(%name, error = %e, "cannot publish SMC state: smc ss will not list this process");
            return;
        }
    };
    // A forked child closes its copy of our socket: the name must go when this process
    // does (a child that outlived its parent kept it, unanswered, and `smc ss` waited on
    // it); the child publishes under its own pid if it starts a stack.
    PUBLISHED_FD.store(l.as_raw_fd(), std::sync::atomic::Ordering::Release);
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function (it only closes a descriptor).
        if unsafe { libc::pthread_atfork(None, None, Some(close_published_in_child)) } != 0 {
            tracing::debug!("pthread_atfork failed: a forked child keeps our smc ss name");
        }
    });
    let spawned = std::thread::Builder::new()
        .name("smc-publish".into())
        .spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { continue };
                // One request at a time: a slow client delays others, never the stack.
                let _ = serve(stack, c);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the SMC state publisher");
    }
}

/// The descriptor of this process's `smc-rs/<pid>` socket (-1: none).
static PUBLISHED_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn close_published_in_child() {
    let fd = PUBLISHED_FD.swap(-1, std::sync::atomic::Ordering::AcqRel);
    if fd >= 0 {
        // SAFETY: the parent's listening socket, inherited; nothing in the child uses
        // it (the parent's publisher thread is not here). The raw system call: an
        // interposing library (smc-preload) must not see it; async-signal-safe.
        unsafe { libc::syscall(libc::SYS_close, libc::c_long::from(fd)) };
    }
}

/// Root or our own user.
fn allowed(c: &UnixStream) -> bool {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt SO_PEERCRED into a ucred of the given length.
    let r = unsafe {
        libc::getsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    // SAFETY: getuid cannot fail.
    r == 0 && (cred.uid == 0 || cred.uid == unsafe { libc::getuid() })
}

fn serve(stack: &Stack, mut c: UnixStream) -> std::io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(1)))?;
    c.set_write_timeout(Some(Duration::from_secs(5)))?;
    if !allowed(&c) {
        return c.write_all(b"{\"error\":\"permission denied\"}\n");
    }
    let mut line = String::new();
    BufReader::new((&c).take_limited(64)).read_line(&mut line)?;
    match line.trim() {
        "get" => {}
        "reset" => reset(stack),
        other => {
            let msg = json!({ "error": format!("unknown request {other:?}") });
            return c.write_all(format!("{msg}\n").as_bytes());
        }
    }
    let doc = snapshot(stack);
    c.write_all(format!("{doc}\n").as_bytes())
}

/// `Read::take` for a reference.
trait TakeLimited: Sized {
    fn take_limited(self, n: u64) -> std::io::Take<Self>;
}
impl<R: std::io::Read> TakeLimited for R {
    fn take_limited(self, n: u64) -> std::io::Take<Self> {
        std::io::Read::take(self, n)
    }
}

/// Asks the process `pid` (its abstract socket) for its state, or `reset`.
pub fn query(pid: u32, request: &str, timeout: Duration) -> std::io::Result<Value> {
    use std::io::Read;
    use std::os::linux::net::SocketAddrExt;
    let name = format!("{SOCKET_PREFIX}{pid}");
    let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let mut c = UnixStream::connect_addr(&a)?;
    c.set_read_timeout(Some(timeout))?;
    c.set_write_timeout(Some(timeout))?;
    c.write_all(format!("{request}\n").as_bytes())?;
    let mut text = String::new();
    c.take(64 << 20).read_to_string(&mut text)?;
    serde_json::from_str(&text).map_err(std::io::Error::other)
}

/// The pids that publish their state in this network namespace (`/proc/net/unix`).
pub fn publishers() -> Vec<u32> {
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    parse_publishers(&text)
}

fn parse_publishers(text: &str) -> Vec<u32> {
    let mut v: Vec<u32> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|p| {
            p.strip_prefix('@')?
                .strip_prefix(SOCKET_PREFIX)?
                .parse()
                .ok()
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_host_connections_are_labelled_apart_from_smc_r() {
        assert_eq!(mode_label("same-host"), "SAMEHOST");
        assert_eq!(mode_label("SMC-Rv2"), "SMCR");
        assert_eq!(mode_label("SMC-Rv1 (moved to another link 1x)"), "SMCR");
        assert_eq!(mode_label("rendezvous"), "CLC");
    }

    #[test]
    fn publishers_are_read_from_proc_net_unix() {
        let text = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 1234 @smc-rs/4242\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 1235 @smc-rs/17\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 1236 @smc-rs/4242\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 1237 /run/smc-rs/x\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 1238 @smc-rs/notapid\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 1239\n";
        assert_eq!(parse_publishers(text), vec![17, 4242]);
    }
}
