//! Signals of the SMC commands, taken by one thread (signal-hook's iterator: the handler
//! only records the signal) so that their work runs as ordinary code, not in a signal
//! handler:
//! - SIGUSR1 → print the stack's state (like `dd` prints its progress), so that a test
//!   can ask a running `smc listen --stats` for its link groups and counters;
//! - SIGTERM, SIGINT → end the link groups in order (DELETE LINK, RFC 7609 §3.5.4) and
//!   exit, so that peers are told at once instead of finding out by timeouts — and never
//!   send to this host's addresses and QP numbers after a new process took them.
//!
//! [`take`] installs the handlers before the stack starts (a signal that arrives before
//! [`handle`] runs waits for it); the handlers restart interrupted system calls
//! (SA_RESTART).

use std::io;

use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

/// Takes over SIGUSR1, SIGTERM and SIGINT: from now on they are only recorded, for
/// [`handle`].
pub fn take() -> io::Result<Signals> {
    Signals::new([SIGUSR1, SIGTERM, SIGINT])
}

/// Starts the thread that takes the signals: `on_usr1` for each SIGUSR1; on SIGTERM or
/// SIGINT, `on_exit` and then the process exits with 128 + the signal number.
pub fn handle(
    mut signals: Signals,
    on_usr1: impl Fn() + Send + 'static,
    on_exit: impl Fn() + Send + 'static,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if sig == SIGUSR1 {
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
// listener) — a unit test cannot take these signals without affecting the test
// harness's own process.
