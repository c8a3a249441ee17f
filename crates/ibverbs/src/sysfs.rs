//! RDMA device discovery from sysfs (`/sys/class/infiniband`, the kernel's stable ABI in
//! Documentation/ABI/stable/sysfs-class-infiniband): devices, ports, port state and link
//! layer, and each port's GID table with the GID type and the netdev that carries it.
//!
//! The GID for an address is chosen as Linux SMC-Rv2 does (net/smc/smc_ib.c,
//! `smc_ib_determine_gid` → `smc_ib_determine_gid_rcu`): a GID of type RoCE v2 whose value
//! is the IPv4-mapped (or IPv6) form of the connection's local address, on an active
//! Ethernet port. libibverbs itself does not expose the GID type before rdma-core 32 and
//! never exposes the netdev name, which is why this reads sysfs.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use smc_verbs::{Gid, Mac};

/// Where the kernel lists RDMA devices.
pub const SYSFS_INFINIBAND: &str = "/sys/class/infiniband";
/// Where the kernel lists network devices.
pub const SYSFS_NET: &str = "/sys/class/net";

/// One GID table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's GID table (the `sgid_index` of address vectors).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// "RoCE v2", "IB/RoCE v1", ... as the kernel names it.
    pub gid_type: String,
    /// The netdev this GID belongs to (RoCE).
    pub ndev: Option<String>,
}

impl GidEntry {
    /// True for a RoCEv2 (UDP-encapsulated) GID.
    pub fn is_roce_v2(&self) -> bool {
        self.gid_type.eq_ignore_ascii_case("RoCE v2")
    }
}

/// One port of an RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (1-based).
    pub port: u8,
    /// State text without its number, e.g. "ACTIVE", "DOWN".
    pub state: String,
    /// Physical state text, e.g. "LINK_UP".
    pub phys_state: String,
    /// "Ethernet" (RoCE) or "InfiniBand".
    pub link_layer: String,
    /// Valid (non-zero) GID entries.
    pub gids: Vec<GidEntry>,
}

impl PortInfo {
    /// True when the port can carry traffic.
    pub fn is_active(&self) -> bool {
        self.state == "ACTIVE"
    }
}

/// One RDMA device as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel device name, e.g. "rxe0", "mlx5_0".
    pub name: String,
    /// Node GUID text.
    pub node_guid: String,
    /// Firmware version text (may be empty).
    pub fw_ver: String,
    /// Ports.
    pub ports: Vec<PortInfo>,
}

/// Where an address is served: device, port and the RoCEv2 GID of that address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Device name.
    pub device: String,
    /// Port number.
    pub port: u8,
    /// The GID entry (its index is the `sgid_index` of every QP of this address).
    pub gid: GidEntry,
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Parses the sysfs GID form `fe80:0000:0000:0000:5054:00ff:fe44:0001`.
pub fn parse_gid(s: &str) -> Option<Gid> {
    let mut out = [0u8; 16];
    let mut n = 0;
    for part in s.trim().split(':') {
        if n >= 8 || part.len() != 4 {
            return None;
        }
        let v = u16::from_str_radix(part, 16).ok()?;
        out[2 * n..2 * n + 2].copy_from_slice(&v.to_be_bytes());
        n += 1;
    }
    (n == 8).then_some(Gid(out))
}

/// Parses a MAC `52:54:00:44:00:01`.
pub fn parse_mac(s: &str) -> Option<Mac> {
    let mut out = [0u8; 6];
    let mut n = 0;
    for part in s.trim().split(':') {
        if n >= 6 || part.len() != 2 {
            return None;
        }
        out[n] = u8::from_str_radix(part, 16).ok()?;
        n += 1;
    }
    (n == 6).then_some(Mac(out))
}

/// "4: ACTIVE" → "ACTIVE".
fn state_text(s: &str) -> String {
    s.split_once(':')
        .map(|(_, t)| t.trim().to_string())
        .unwrap_or_else(|| s.trim().to_string())
}

fn sorted_dir(p: &Path) -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default();
    v.sort_by_key(|a| natural_key(&a.0));
    v
}

fn natural_key(s: &str) -> (String, u64) {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = s.split_at(s.len() - digits);
    (head.to_string(), tail.parse().unwrap_or(0))
}

/// Every RDMA device under `root` (normally [`SYSFS_INFINIBAND`]), sorted by name. A
/// missing directory means no devices.
pub fn scan(root: &Path) -> Vec<DeviceInfo> {
    let mut devs = Vec::new();
    for (name, dir) in sorted_dir(root) {
        let mut ports = Vec::new();
        for (pname, pdir) in sorted_dir(&dir.join("ports")) {
            let Ok(port) = pname.parse::<u8>() else {
                continue;
            };
            let mut gids = Vec::new();
            for (gname, gpath) in sorted_dir(&pdir.join("gids")) {
                let Ok(index) = gname.parse::<u32>() else {
                    continue;
                };
                // Unused entries read as zeros (or fail with EINVAL on newer kernels).
                let Some(gid) = read_trim(&gpath).and_then(|s| parse_gid(&s)) else {
                    continue;
                };
                if gid.is_zero() {
                    continue;
                }
                let attrs = pdir.join("gid_attrs");
                gids.push(GidEntry {
                    index,
                    gid,
                    gid_type: read_trim(&attrs.join("types").join(&gname)).unwrap_or_default(),
                    ndev: read_trim(&attrs.join("ndevs").join(&gname)).filter(|s| !s.is_empty()),
                });
            }
            ports.push(PortInfo {
                port,
                state: read_trim(&pdir.join("state"))
                    .map(|s| state_text(&s))
                    .unwrap_or_default(),
                phys_state: read_trim(&pdir.join("phys_state"))
                    .map(|s| state_text(&s))
                    .unwrap_or_default(),
                link_layer: read_trim(&pdir.join("link_layer")).unwrap_or_default(),
                gids,
            });
        }
        devs.push(DeviceInfo {
            node_guid: read_trim(&dir.join("node_guid")).unwrap_or_default(),
            fw_ver: read_trim(&dir.join("fw_ver")).unwrap_or_default(),
            name,
            ports,
        });
    }
    devs
}

/// The device, port and RoCEv2 GID that serve `local` (see the module documentation).
/// Ports that are not active are skipped: a connection cannot use them.
pub fn place(devs: &[DeviceInfo], local: IpAddr) -> Option<Placement> {
    let want = Gid::from_ip(local);
    devs.iter().find_map(|d| {
        d.ports
            .iter()
            .filter(|p| p.is_active() && p.link_layer.eq_ignore_ascii_case("Ethernet"))
            .find_map(|p| {
                p.gids
                    .iter()
                    .find(|g| g.gid == want && g.is_roce_v2())
                    .map(|g| Placement {
                        device: d.name.clone(),
                        port: p.port,
                        gid: g.clone(),
                    })
            })
    })
}

/// MAC address of a netdev under `net_root` (normally [`SYSFS_NET`]).
pub fn netdev_mac(net_root: &Path, ndev: &str) -> Option<Mac> {
    read_trim(&net_root.join(ndev).join("address")).and_then(|s| parse_mac(&s))
}

/// MTU of a netdev under `net_root`.
pub fn netdev_mtu(net_root: &Path, ndev: &str) -> Option<usize> {
    read_trim(&net_root.join(ndev).join("mtu")).and_then(|s| s.parse().ok())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a fake sysfs tree: rxe0 port 1 on eth0 with the link-local GID (RoCE v1 and
    /// v2) and ::ffff:10.44.0.1 (v1 at 2, v2 at 3); a second device whose port is down.
    pub(crate) fn fake_tree(dir: &Path) {
        let w = |p: &str, s: &str| {
            let p = dir.join(p);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, format!("{s}\n")).unwrap();
        };
        let p = "infiniband/rxe0/ports/1";
        w("infiniband/rxe0/node_guid", "5054:00ff:fe44:0001");
        w("infiniband/rxe0/fw_ver", "0.0.0");
        w(&format!("{p}/state"), "4: ACTIVE");
        w(&format!("{p}/phys_state"), "5: LinkUp");
        w(&format!("{p}/link_layer"), "Ethernet");
        let gids = [
            ("0", "fe80:0000:0000:0000:5054:00ff:fe44:0001", "IB/RoCE v1"),
            ("1", "fe80:0000:0000:0000:5054:00ff:fe44:0001", "RoCE v2"),
            ("2", "0000:0000:0000:0000:0000:ffff:0a2c:0001", "IB/RoCE v1"),
            ("3", "0000:0000:0000:0000:0000:ffff:0a2c:0001", "RoCE v2"),
            ("4", "0000:0000:0000:0000:0000:0000:0000:0000", ""),
        ];
        for (i, g, t) in gids {
            w(&format!("{p}/gids/{i}"), g);
            w(&format!("{p}/gid_attrs/types/{i}"), t);
            w(&format!("{p}/gid_attrs/ndevs/{i}"), "eth0");
        }
        let q = "infiniband/rxe1/ports/1";
        w(&format!("{q}/state"), "1: DOWN");
        w(&format!("{q}/link_layer"), "Ethernet");
        w(
            &format!("{q}/gids/1"),
            "0000:0000:0000:0000:0000:ffff:0a2d:0001",
        );
        w(&format!("{q}/gid_attrs/types/1"), "RoCE v2");
        w("net/eth0/address", "52:54:00:44:00:01");
        w("net/eth0/mtu", "1500");
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("smc-ibverbs-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn parses_gids_and_macs() {
        let g = parse_gid("0000:0000:0000:0000:0000:ffff:0a2c:0001").unwrap();
        assert_eq!(g.to_string(), "::ffff:10.44.0.1");
        assert!(parse_gid("0000:0000").is_none());
        assert!(parse_gid("zzzz:0000:0000:0000:0000:ffff:0a2c:0001").is_none());
        assert!(parse_gid("0000:0000:0000:0000:0000:ffff:0a2c:0001:0000").is_none());
        assert_eq!(
            parse_mac("52:54:00:44:00:01").unwrap().to_string(),
            "52:54:00:44:00:01"
        );
        assert!(parse_mac("52:54:00:44:00").is_none());
        assert!(parse_mac("52:54:00:44:00:01:02").is_none());
    }

    #[test]
    fn picks_the_roce_v2_gid_of_the_address_on_an_active_port() {
        let d = tmpdir("place");
        fake_tree(&d);
        let devs = scan(&d.join("infiniband"));
        assert_eq!(devs.len(), 2);
        assert_eq!(devs[0].name, "rxe0");
        assert_eq!(devs[0].ports[0].gids.len(), 4, "the zero GID is skipped");
        let p = place(&devs, "10.44.0.1".parse().unwrap()).unwrap();
        assert_eq!((p.device.as_str(), p.port, p.gid.index), ("rxe0", 1, 3));
        assert_eq!(p.gid.ndev.as_deref(), Some("eth0"));
        // rxe1's port is down: its address is not served.
        assert!(place(&devs, "10.45.0.1".parse().unwrap()).is_none());
        // An address nobody has.
        assert!(place(&devs, "10.46.0.1".parse().unwrap()).is_none());
        // IPv6: the link-local RoCE v2 GID.
        let p6 = place(&devs, "fe80::5054:ff:fe44:1".parse().unwrap()).unwrap();
        assert_eq!(p6.gid.index, 1);
        assert_eq!(
            netdev_mac(&d.join("net"), "eth0").unwrap().to_string(),
            "52:54:00:44:00:01"
        );
        assert_eq!(netdev_mtu(&d.join("net"), "eth0"), Some(1500));
        assert!(scan(&d.join("nothing-here")).is_empty());
        let _ = fs::remove_dir_all(&d);
    }
}
