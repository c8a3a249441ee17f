//! Local interfaces and their addresses, the facts ib_core's RoCE GID table
//! keeps for hardware RNICs: which netdev carries an address, its MTU and
//! MAC. One implementation for the workspace (the software RNIC's device
//! attributes, the SMC-R runtime's same-LAN and prefix facts), on the
//! `if-addrs` crate (getifaddrs) and sysfs.

use std::net::IpAddr;

use crate::types::Mac;

/// One address of a local interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    /// Interface name (`lo`, `eth0`).
    pub name: String,
    /// The address.
    pub addr: IpAddr,
    /// Length of its subnet prefix.
    pub prefix_len: u8,
}

/// Every address of every interface, uncached (getifaddrs; empty if it
/// fails).
pub fn if_addrs() -> Vec<IfAddr> {
    if_addrs::get_if_addrs()
        .unwrap_or_default()
        .into_iter()
        .map(|i| IfAddr {
            addr: i.ip(),
            prefix_len: match &i.addr {
                if_addrs::IfAddr::V4(a) => a.prefixlen,
                if_addrs::IfAddr::V6(a) => a.prefixlen,
            },
            name: i.name,
        })
        .collect()
}

/// The interface that carries `ip`: the one with exactly that address, else
/// for a loopback address (every 127.x falls under lo's 127.0.0.1/8) the
/// loopback interface of its family.
pub fn carrier_of(ip: IpAddr) -> Option<String> {
    let all = if_addrs();
    if let Some(a) = all.iter().find(|a| a.addr == ip) {
        return Some(a.name.clone());
    }
    all.into_iter()
        .find(|a| ip.is_loopback() && a.addr.is_loopback() && a.addr.is_ipv4() == ip.is_ipv4())
        .map(|a| a.name)
}

/// Whether an address can carry RoCE traffic, as the kernel's RoCE GID table and
/// port state see it: a GID exists only while its address is configured, and the
/// port is active only while the netdev is running (rxe reports `IB_EVENT_PORT_ERR`
/// when its netdev goes down; SMC-R then fails the port's links, RFC 7609 §4.6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathState {
    /// The address is configured and its interface is running.
    Up,
    /// No interface carries the address any more.
    AddressGone,
    /// The interface carrying the address is down (administratively or no carrier).
    InterfaceDown(String),
}

/// The [`PathState`] of local address `ip`, uncached (getifaddrs: interface flags
/// come from the calling thread's network namespace, unlike sysfs). Loopback
/// addresses without an interface of their own are served by `lo`.
pub fn path_state(ip: IpAddr) -> PathState {
    let all = if_addrs::get_if_addrs().unwrap_or_default();
    let carrier = all.iter().find(|i| i.ip() == ip).or_else(|| {
        all.iter()
            .find(|i| ip.is_loopback() && i.is_loopback() && i.ip().is_ipv4() == ip.is_ipv4())
    });
    match carrier {
        None => PathState::AddressGone,
        // Linux: `oper_status` is IFF_RUNNING (up, with carrier).
        Some(i) if !i.is_oper_up() => PathState::InterfaceDown(i.name.clone()),
        Some(_) => PathState::Up,
    }
}

/// The MTU of netdev `name` (sysfs).
pub fn mtu(name: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// The MAC address of netdev `name` (sysfs); `None` for netdevs without
/// one (all zero, e.g. loopback).
pub fn mac(name: &str) -> Option<Mac> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{name}/address")).ok()?;
    let b: Vec<u8> = s
        .trim()
        .split(':')
        .filter_map(|x| u8::from_str_radix(x, 16).ok())
        .collect();
    (b.len() == 6 && b.iter().any(|&x| x != 0)).then(|| Mac([b[0], b[1], b[2], b[3], b[4], b[5]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_carries_every_127_address() {
        let lo = carrier_of("127.0.0.1".parse().unwrap()).expect("lo has 127.0.0.1");
        assert_eq!(carrier_of("127.3.4.5".parse().unwrap()), Some(lo.clone()));
        assert!(if_addrs().iter().any(|a| a.name == lo
            && a.addr == "127.0.0.1".parse::<IpAddr>().unwrap()
            && a.prefix_len == 8));
        assert!(mtu(&lo).is_some_and(|m| m >= 1280));
        // Loopback has no MAC of its own (all zero in sysfs).
        assert_eq!(mac(&lo), None);
        // Not a local address and not loopback: nobody carries it.
        assert_eq!(carrier_of("192.0.2.77".parse().unwrap()), None);
    }

    #[test]
    fn path_state_of_loopback_and_of_an_absent_address() {
        assert_eq!(path_state("127.0.0.1".parse().unwrap()), PathState::Up);
        // Any 127.x is lo's (127.0.0.1/8).
        assert_eq!(path_state("127.9.8.7".parse().unwrap()), PathState::Up);
        assert_eq!(
            path_state("192.0.2.77".parse().unwrap()),
            PathState::AddressGone
        );
    }
}
