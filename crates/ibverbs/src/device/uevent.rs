//! Device removal through kernel uevents.
//!
//! A driver that can disassociate user contexts (mlx5 and others) reports its removal
//! to user space as `IBV_EVENT_DEVICE_FATAL` on the async fd. Drivers that cannot
//! (Linux rxe and siw up to at least 6.12) send nothing there: `ib_uverbs_remove_one`
//! deletes the uverbs character device and then waits until every process has closed
//! its contexts on it, so `rdma link delete` blocks for as long as we keep the device
//! open. The one thing user space sees is the kernel's `remove` uevent for that
//! character device (subsystem `infiniband_verbs`, e.g. `uverbs0`), which the event
//! thread listens for on a `NETLINK_KOBJECT_UEVENT` socket. Both lead to the same
//! handling: the device is removed for good, its QPs are failed, and once the stack has
//! dropped its objects the context is closed, which lets the kernel finish.

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The kernel's uevent multicast group (udev re-broadcasts on group 2 with its own
/// header; only the kernel's messages are wanted).
const KERNEL_GROUP: u32 = 1;

/// Opens a non-blocking socket receiving the kernel's uevents.
pub(super) fn open() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::NETLINK_KOBJECT_UEVENT,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; zero is a valid value.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    sa.nl_groups = KERNEL_GROUP;
    // SAFETY: valid socket and address of the size given.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Reads every waiting uevent; true when one says that the uverbs device `dev_name`
/// was removed. Messages not sent by the kernel (netlink port id 0) are ignored.
pub(super) fn drain(fd: &OwnedFd, dev_name: &str) -> bool {
    let mut removed = false;
    let mut buf = [0u8; 8192];
    loop {
        // SAFETY: sockaddr_nl is plain data; zero is a valid value.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        let mut alen = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: valid socket, buffer and address out-pointers of the sizes given.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                0,
                &mut sa as *mut libc::sockaddr_nl as *mut libc::sockaddr,
                &mut alen,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                // ENOBUFS: uevents were dropped (a burst of them); the removal may be
                // among them, but the next call still sees later ones.
                _ if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
                _ => return removed,
            }
        }
        if sa.nl_pid == 0 && is_removal_of(&buf[..n as usize], dev_name) {
            removed = true;
        }
    }
}

/// True when `msg` (a kernel uevent: `ACTION@DEVPATH\0KEY=VALUE\0...`) announces the
/// removal of the uverbs character device `dev_name`.
pub(super) fn is_removal_of(msg: &[u8], dev_name: &str) -> bool {
    if dev_name.is_empty() {
        return false;
    }
    let mut fields = msg.split(|&b| b == 0);
    let Some(head) = fields.next() else {
        return false;
    };
    if !head.starts_with(b"remove@") {
        return false;
    }
    let (mut action, mut subsystem, mut devpath) = (false, false, false);
    for f in fields {
        if f == b"ACTION=remove" {
            action = true;
        } else if f == b"SUBSYSTEM=infiniband_verbs" {
            subsystem = true;
        } else if let Some(p) = f.strip_prefix(b"DEVPATH=") {
            devpath = p.rsplit(|&b| b == b'/').next() == Some(dev_name.as_bytes());
        }
    }
    action && subsystem && devpath
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(parts: &[&str]) -> Vec<u8> {
        parts.join("\0").into_bytes()
    }

    const RXE_REMOVE: &[&str] = &[
        "remove@/devices/virtual/infiniband_verbs/uverbs0",
        "ACTION=remove",
        "DEVPATH=/devices/virtual/infiniband_verbs/uverbs0",
        "SUBSYSTEM=infiniband_verbs",
        "MAJOR=231",
        "MINOR=192",
        "DEVNAME=infiniband/uverbs0",
        "SEQNUM=2345",
    ];

    #[test]
    fn removal_of_our_uverbs_device() {
        assert!(is_removal_of(&msg(RXE_REMOVE), "uverbs0"));
        // a PCI device's uverbs node sits under the PCI function
        let hw = msg(&[
            "remove@/devices/pci0000:00/0000:00:03.0/infiniband_verbs/uverbs1",
            "ACTION=remove",
            "DEVPATH=/devices/pci0000:00/0000:00:03.0/infiniband_verbs/uverbs1",
            "SUBSYSTEM=infiniband_verbs",
        ]);
        assert!(is_removal_of(&hw, "uverbs1"));
        assert!(!is_removal_of(&hw, "uverbs0"));
    }

    #[test]
    fn other_events_are_not_removals() {
        // another uverbs device; a prefix of our name
        assert!(!is_removal_of(&msg(RXE_REMOVE), "uverbs1"));
        assert!(!is_removal_of(&msg(RXE_REMOVE), "uverbs"));
        // the same device added, or another subsystem
        let add: Vec<&str> = RXE_REMOVE
            .iter()
            .map(|f| match *f {
                "remove@/devices/virtual/infiniband_verbs/uverbs0" => {
                    "add@/devices/virtual/infiniband_verbs/uverbs0"
                }
                "ACTION=remove" => "ACTION=add",
                f => f,
            })
            .collect();
        assert!(!is_removal_of(&msg(&add), "uverbs0"));
        let net: Vec<&str> = RXE_REMOVE
            .iter()
            .map(|f| match *f {
                "SUBSYSTEM=infiniband_verbs" => "SUBSYSTEM=net",
                f => f,
            })
            .collect();
        assert!(!is_removal_of(&msg(&net), "uverbs0"));
        // the infiniband device itself (rxe0), not its uverbs node
        let ib = msg(&[
            "remove@/devices/virtual/infiniband/rxe0",
            "ACTION=remove",
            "DEVPATH=/devices/virtual/infiniband/rxe0",
            "SUBSYSTEM=infiniband",
        ]);
        assert!(!is_removal_of(&ib, "rxe0"));
    }

    #[test]
    fn malformed_messages_are_ignored() {
        for m in [
            &b""[..],
            b"\0\0\0",
            b"remove@",
            b"remove@/x\0ACTION=remove\0SUBSYSTEM=infiniband_verbs\0DEVPATH=",
            b"libudev\0\xfe\xed\xca\xfe",
            &[0xff; 64],
        ] {
            assert!(!is_removal_of(m, "uverbs0"));
        }
        assert!(!is_removal_of(&msg(RXE_REMOVE), ""));
    }
}
