//! Signals of the SMC commands, taken synchronously by one thread with `sigwait` so that
//! their handlers run as ordinary code, not in a signal handler:
//! - SIGUSR1 → print the stack's state (like `dd` prints its progress), so that a test
//!   can ask a running `smc listen --stats` for its link groups and counters;
//! - SIGTERM, SIGINT → end the link groups in order (DELETE LINK, RFC 7609 §3.5.4) and
//!   exit, so that peers are told at once instead of finding out by timeouts — and never
//!   send to this host's addresses and QP numbers after a new process took them.
//!
//! The signals are blocked in every thread ([`block`], called before any thread is
//! spawned, so that all threads inherit the mask).

use std::io;

const SIGNALS: [libc::c_int; 3] = [libc::SIGUSR1, libc::SIGTERM, libc::SIGINT];

fn set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise the set we own; a zeroed sigset_t is a valid
    // starting value for sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks SIGUSR1, SIGTERM and SIGINT in the calling thread (and the threads it spawns
/// afterwards).
pub fn block() -> io::Result<()> {
    let set = set();
    // SAFETY: `set` is an initialised signal set; the old mask is not requested.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Starts the thread that takes the signals: `on_usr1` for each SIGUSR1; on SIGTERM or
/// SIGINT, `on_exit` and then the process exits with 128 + the signal number. Needs
/// [`block`] first.
pub fn handle(
    on_usr1: impl Fn() + Send + 'static,
    on_exit: impl Fn() + Send + 'static,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let set = set();
            loop {
                let mut sig = 0;
                // SAFETY: `set` is initialised and `sig` is a valid out pointer.
                if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                    continue;
                }
                if sig == libc::SIGUSR1 {
                    on_usr1();
                } else {
                    on_exit();
                    std::process::exit(128 + sig);
                }
            }
        })?;
    Ok(())
}

// Tested end to end by tests/system/smc-many.sh (SIGUSR1 snapshots; SIGTERM to the
// listener) — a unit test cannot block the signals in the test harness's other threads,
// where their default action would end the process.
