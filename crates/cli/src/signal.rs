//! SIGUSR1 → a callback (like `dd` prints its progress), for `smc listen --stats`: a
//! test can ask a running listener for its link groups and counters, before and after a
//! load, in the same process.
//!
//! The signal is blocked in every thread ([`block_sigusr1`], called before any thread is
//! spawned, so that all threads inherit the mask) and taken synchronously by one thread
//! with `sigwait`, so the callback runs as ordinary code, not in a signal handler.

use std::io;

fn usr1_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise the set we own; a zeroed sigset_t is a valid
    // starting value for sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        set
    }
}

/// Blocks SIGUSR1 in the calling thread (and the threads it spawns afterwards).
pub fn block_sigusr1() -> io::Result<()> {
    let set = usr1_set();
    // SAFETY: `set` is an initialised signal set; the old mask is not requested.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Runs `f` on a background thread each time the process receives SIGUSR1. Needs
/// [`block_sigusr1`] first (otherwise the default action, termination, may win).
pub fn on_sigusr1(f: impl Fn() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new()
        .name("sigusr1".into())
        .spawn(move || {
            let set = usr1_set();
            loop {
                let mut sig = 0;
                // SAFETY: `set` is initialised and `sig` is a valid out pointer.
                let rc = unsafe { libc::sigwait(&set, &mut sig) };
                if rc == 0 && sig == libc::SIGUSR1 {
                    f();
                }
            }
        })?;
    Ok(())
}

// Tested end to end by tests/system/smc-many.sh (a unit test cannot block the signal in
// the test harness's other threads, where its default action would end the process).
