//! Test peer for the system tests (tests/system/bpf-*.sh): a TCP client or
//! server that marks its socket for the SMC-R option (or not) and prints the
//! handshake's [`Outcome`] as one `key=value` line per connection.
//!
//! ```text
//! smc-bpf-probe server --listen 10.0.0.1:0 [--mark] [--count N] [--fastopen] [--md5 KEY --md5-peer IP] [--no-data]
//! smc-bpf-probe client --connect 10.0.0.1:PORT [--mark] [--fastopen] [--md5 KEY] [--no-data]
//! ```
//!
//! The server prints `listening port=P` once it listens, then
//! `accepted peer=... outcome=TAG ...` per connection, and sends
//! `server-outcome=TAG` to the client, which prints
//! `connected outcome=TAG ... server-outcome=TAG`.

use std::io::{BufRead, BufReader, Write};
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use smc_bpf::{NotAnnounced, Outcome, PinPaths, SmcOption};
use socket2::{Domain, SockAddr, Socket, Type};

#[derive(Parser)]
#[command(
    name = "smc-bpf-probe",
    about = "TCP peer that reports the SMC-R option outcome"
)]
struct Cli {
    /// Pin directory of the installation [default: $SMC_RS_BPF_DIR or /sys/fs/bpf/smc-rs]
    #[arg(long, global = true)]
    pin_dir: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Listen and report the outcome of each accepted connection.
    Server {
        #[arg(long)]
        listen: SocketAddr,
        /// Mark the listener (accepted sockets inherit it).
        #[arg(long)]
        mark: bool,
        /// Connections to accept before exiting.
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// Enable TCP Fast Open on the listener.
        #[arg(long)]
        fastopen: bool,
        /// TCP MD5 signature key (RFC 2385), for peer --md5-peer.
        #[arg(long, requires = "md5_peer")]
        md5: Option<String>,
        #[arg(long)]
        md5_peer: Option<IpAddr>,
        /// Report right after accept() and close, without reading (for
        /// peers that speak CLC, e.g. the Linux kernel's SMC client).
        #[arg(long)]
        no_data: bool,
    },
    /// Connect once and report the outcome.
    Client {
        #[arg(long)]
        connect: SocketAddr,
        /// Mark the socket before connect().
        #[arg(long)]
        mark: bool,
        /// Use TCP Fast Open (TCP_FASTOPEN_CONNECT: the SYN carries data).
        #[arg(long)]
        fastopen: bool,
        /// TCP MD5 signature key for the server's address.
        #[arg(long)]
        md5: Option<String>,
        /// Report right after connect() and close, without sending (for
        /// peers that speak CLC, e.g. the Linux kernel's SMC server).
        #[arg(long, conflicts_with = "fastopen")]
        no_data: bool,
    },
}

fn tag(o: &Outcome) -> String {
    match o {
        Outcome::BothAnnounced => "BothAnnounced".into(),
        Outcome::PeerDidNotAnnounce => "PeerDidNotAnnounce".into(),
        Outcome::LocalNotAnnounced { why } => format!(
            "LocalNotAnnounced:{}",
            match why {
                NotAnnounced::NotMarked => "NotMarked",
                NotAnnounced::NotArmed => "NotArmed",
                NotAnnounced::HandshakeNotSeen => "HandshakeNotSeen",
                NotAnnounced::NoOptionSpace => "NoOptionSpace",
                NotAnnounced::SynCookie => "SynCookie",
                NotAnnounced::NotWritten => "NotWritten",
                NotAnnounced::HelperError(_) => "HelperError",
            }
        ),
        Outcome::Unavailable { .. } => "Unavailable".into(),
    }
}

fn sockopt_int(s: &Socket, level: i32, name: i32, val: i32) -> Result<()> {
    // SAFETY: `val` is a live c_int and its size is passed; the kernel only
    // reads it.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&val as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("setsockopt({level}, {name})"));
    }
    Ok(())
}

/// `struct tcp_md5sig` from <linux/tcp.h>.
#[repr(C)]
struct TcpMd5Sig {
    addr: libc::sockaddr_storage,
    flags: u8,
    prefixlen: u8,
    keylen: u16,
    ifindex: i32,
    key: [u8; 80],
}

fn set_md5(s: &Socket, peer: IpAddr, key: &str) -> Result<()> {
    if key.len() > 80 {
        bail!("MD5 key longer than 80 bytes");
    }
    let sa = SockAddr::from(SocketAddr::new(peer, 0));
    // SAFETY: an all-zero tcp_md5sig is valid (plain integers and arrays).
    let mut sig: TcpMd5Sig = unsafe { MaybeUninit::zeroed().assume_init() };
    // SAFETY: `sa` holds `sa.len()` valid bytes and sockaddr_storage is large
    // enough for any address.
    unsafe {
        std::ptr::copy_nonoverlapping(
            sa.as_ptr().cast::<u8>(),
            (&mut sig.addr as *mut libc::sockaddr_storage).cast::<u8>(),
            sa.len() as usize,
        )
    };
    sig.keylen = key.len() as u16;
    sig.key[..key.len()].copy_from_slice(key.as_bytes());
    // SAFETY: `sig` is a live tcp_md5sig and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MD5SIG,
            (&sig as *const TcpMd5Sig).cast(),
            std::mem::size_of::<TcpMd5Sig>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("setsockopt(TCP_MD5SIG)");
    }
    Ok(())
}

fn open_option(pin_dir: &Option<PathBuf>) -> Option<SmcOption> {
    let paths = pin_dir
        .clone()
        .map(PinPaths::new)
        .unwrap_or_else(PinPaths::from_env);
    match SmcOption::open_at(&paths) {
        Ok(o) => Some(o),
        Err(e) => {
            println!("option-unavailable reason=\"{e}\"");
            None
        }
    }
}

fn outcome_of(opt: &Option<SmcOption>, s: &Socket) -> (Outcome, String) {
    match opt {
        None => (
            Outcome::Unavailable {
                reason: smc_bpf::Unavailable {
                    reason: "not opened".into(),
                },
            },
            "-".into(),
        ),
        Some(o) => {
            let raw = match o.state(s) {
                Ok(Some(st)) => format!("{:#x}/{:#x}/{}", st.request, st.status, st.error),
                Ok(None) => "none".into(),
                Err(e) => e.to_string(),
            };
            (o.outcome(s), raw)
        }
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let timeout = Some(Duration::from_secs(10));
    match cli.cmd {
        Cmd::Server {
            listen,
            mark,
            count,
            fastopen,
            md5,
            md5_peer,
            no_data,
        } => {
            let opt = open_option(&cli.pin_dir);
            let s = Socket::new(Domain::for_address(listen), Type::STREAM, None)?;
            s.set_reuse_address(true)?;
            if listen.is_ipv6() {
                s.set_only_v6(true)?;
            }
            s.bind(&listen.into()).context("bind")?;
            if let (Some(key), Some(peer)) = (&md5, md5_peer) {
                set_md5(&s, peer, key)?;
            }
            if fastopen {
                sockopt_int(&s, libc::IPPROTO_TCP, libc::TCP_FASTOPEN, 16)?;
            }
            if mark {
                match &opt {
                    Some(o) => o.mark(&s).context("mark")?,
                    None => println!("mark-skipped"),
                }
            }
            s.listen(128)?;
            let port = s.local_addr()?.as_socket().context("local address")?.port();
            println!("listening port={port}");
            std::io::stdout().flush()?;
            for _ in 0..count {
                let (c, peer) = s.accept().context("accept")?;
                let (o, raw) = outcome_of(&opt, &c);
                let peer = peer.as_socket().map(|p| p.to_string()).unwrap_or_default();
                if no_data {
                    println!(
                        "accepted peer={peer} outcome={} state={raw} detail=\"{o}\"",
                        tag(&o)
                    );
                    std::io::stdout().flush()?;
                    continue;
                }
                c.set_read_timeout(timeout)?;
                c.set_write_timeout(timeout)?;
                let mut line = String::new();
                let mut r = BufReader::new(&c);
                r.read_line(&mut line).context("read from client")?;
                println!(
                    "accepted peer={peer} outcome={} state={raw} detail=\"{o}\"",
                    tag(&o)
                );
                std::io::stdout().flush()?;
                (&c).write_all(format!("server-outcome={}\n", tag(&o)).as_bytes())?;
            }
        }
        Cmd::Client {
            connect,
            mark,
            fastopen,
            md5,
            no_data,
        } => {
            let opt = open_option(&cli.pin_dir);
            let s = Socket::new(Domain::for_address(connect), Type::STREAM, None)?;
            if let Some(key) = &md5 {
                set_md5(&s, connect.ip(), key)?;
            }
            if fastopen {
                sockopt_int(&s, libc::IPPROTO_TCP, libc::TCP_FASTOPEN_CONNECT, 1)?;
            }
            if mark {
                match &opt {
                    Some(o) => o.mark(&s).context("mark")?,
                    None => println!("mark-skipped"),
                }
            }
            s.set_read_timeout(timeout)?;
            s.set_write_timeout(timeout)?;
            s.connect_timeout(&connect.into(), Duration::from_secs(10))
                .context("connect")?;
            if no_data {
                // Without Fast Open, connect() returns after the handshake.
                let (o, raw) = outcome_of(&opt, &s);
                println!("connected outcome={} state={raw} detail=\"{o}\"", tag(&o));
                return Ok(());
            }
            // With TCP_FASTOPEN_CONNECT the SYN leaves with this write.
            (&s).write_all(b"hello\n")?;
            let mut line = String::new();
            BufReader::new(&s)
                .read_line(&mut line)
                .context("read from server")?;
            // The handshake is surely complete once the server answered.
            let (o, raw) = outcome_of(&opt, &s);
            println!(
                "connected outcome={} state={raw} {} detail=\"{o}\"",
                tag(&o),
                line.trim()
            );
        }
    }
    Ok(())
}
