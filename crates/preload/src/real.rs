//! The functions we interpose, as the next object in the lookup order (libc) defines
//! them: `dlsym(RTLD_NEXT, name)`, resolved once.

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_int, c_ulong, c_void, sockaddr, socklen_t};

macro_rules! real {
    ($($name:ident: fn($($a:ty),*) -> $r:ty;)*) => {$(
        /// The next definition of this symbol (libc's), or `None` if there is none.
        pub(crate) fn $name() -> Option<unsafe extern "C" fn($($a),*) -> $r> {
            static P: AtomicUsize = AtomicUsize::new(0);
            let mut p = P.load(Ordering::Relaxed);
            if p == 0 {
                // SAFETY: the name is a NUL-terminated literal; RTLD_NEXT is a valid
                // handle for a shared object (this library is one).
                p = unsafe {
                    libc::dlsym(libc::RTLD_NEXT, concat!(stringify!($name), "\0").as_ptr().cast())
                } as usize;
                if p == 0 {
                    return None;
                }
                P.store(p, Ordering::Relaxed);
            }
            // SAFETY: `p` is the address of libc's function of this C signature (the
            // prototypes in <sys/socket.h>, <unistd.h>, <fcntl.h>; fcntl's variadic
            // argument is passed as one integer register, see lib.rs `fcntl`).
            Some(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($a),*) -> $r>(p) })
        }
    )*};
}

real! {
    connect: fn(c_int, *const sockaddr, socklen_t) -> c_int;
    listen: fn(c_int, c_int) -> c_int;
    accept: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    accept4: fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
    close: fn(c_int) -> c_int;
    dup: fn(c_int) -> c_int;
    dup2: fn(c_int, c_int) -> c_int;
    dup3: fn(c_int, c_int, c_int) -> c_int;
    fcntl: fn(c_int, c_int, c_ulong) -> c_int;
    fcntl64: fn(c_int, c_int, c_ulong) -> c_int;
    getsockname: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    getpeername: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    getsockopt: fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
    setsockopt: fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
    sendto: fn(c_int, *const c_void, libc::size_t, c_int, *const sockaddr, socklen_t) -> libc::ssize_t;
    sendmsg: fn(c_int, *const libc::msghdr, c_int) -> libc::ssize_t;
    epoll_ctl: fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;
    poll: fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int;
    __poll_chk: fn(*mut libc::pollfd, libc::nfds_t, c_int, libc::size_t) -> c_int;
    ppoll: fn(*mut libc::pollfd, libc::nfds_t, *const libc::timespec, *const libc::sigset_t) -> c_int;
    __ppoll_chk: fn(*mut libc::pollfd, libc::nfds_t, *const libc::timespec, *const libc::sigset_t, libc::size_t) -> c_int;
    select: fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *mut libc::timeval) -> c_int;
    pselect: fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *const libc::timespec, *const libc::sigset_t) -> c_int;
}

/// `errno` of this thread.
pub(crate) fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets `errno` of this thread.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// -1 with `errno` = `e`: what a failing libc call returns.
pub(crate) fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// An integer socket option through libc's getsockopt (not ours).
pub(crate) fn sockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let f = getsockopt()?;
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: `v` and `len` are valid for writes of the sizes given.
    let r = unsafe { f(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// Sets an integer socket option through libc's setsockopt.
pub(crate) fn set_sockopt_int(fd: c_int, level: c_int, name: c_int, v: c_int) -> bool {
    let Some(f) = setsockopt() else { return false };
    // SAFETY: `v` is valid for reads of its size.
    unsafe {
        f(
            fd,
            level,
            name,
            (&v as *const c_int).cast(),
            std::mem::size_of::<c_int>() as socklen_t,
        ) == 0
    }
}

/// `fcntl(fd, cmd, arg)` through libc's fcntl.
pub(crate) fn fcntl_raw(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    match fcntl() {
        // SAFETY: F_GETFL/F_SETFL/F_GETFD/F_SETFD/F_DUPFD_CLOEXEC take an integer.
        Some(f) => unsafe { f(fd, cmd, arg) },
        None => fail(libc::ENOSYS),
    }
}

/// `dup3` through libc's dup3 (our interposer would update the table).
pub(crate) fn dup3_raw(old: c_int, new: c_int, flags: c_int) -> c_int {
    match dup3() {
        // SAFETY: plain integer arguments.
        Some(f) => unsafe { f(old, new, flags) },
        None => fail(libc::ENOSYS),
    }
}

/// Where the library's own descriptors (pump ends, its copies of TCP sockets) start:
/// above the application's. Programs size tables by the descriptors they expect — one
/// per TCP connection, numbered lowest-free (wrk's event loop holds 10 + 3 × its
/// connections) — so ours must not take the low numbers. Half the soft RLIMIT_NOFILE,
/// at most 4096 (a higher floor would grow every process's descriptor table for
/// nothing).
pub(crate) fn fd_floor() -> c_int {
    static FLOOR: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();
    *FLOOR.get_or_init(|| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
            return 0;
        }
        (r.rlim_cur / 2).min(4096) as c_int
    })
}

/// A close-on-exec duplicate of `fd` numbered from [`fd_floor`] (or the lowest free
/// number if none is free there), or -1 with errno.
pub(crate) fn dup_high(fd: c_int) -> c_int {
    let d = fcntl_raw(fd, libc::F_DUPFD_CLOEXEC, fd_floor() as c_ulong);
    if d >= 0 {
        return d;
    }
    fcntl_raw(fd, libc::F_DUPFD_CLOEXEC, 0)
}

/// `fd` (which we own) moved to a number from [`fd_floor`]; `fd` itself if that fails.
pub(crate) fn move_high<T: std::os::fd::FromRawFd + std::os::fd::IntoRawFd>(fd: T) -> T {
    let raw = fd.into_raw_fd();
    let d = dup_high(raw);
    if d < 0 {
        // SAFETY: `raw` is still ours (into_raw_fd gave up ownership to us).
        return unsafe { T::from_raw_fd(raw) };
    }
    if let Some(f) = close() {
        // SAFETY: `raw` is ours and replaced by `d`.
        unsafe { f(raw) };
    }
    // SAFETY: `d` is a new descriptor of the same file that nothing else owns.
    unsafe { T::from_raw_fd(d) }
}
