//! `smc rdma devices`: the RDMA devices of this host as smc-rs sees them (like
//! `ibv_devices` / `rdma link`, plus the GID table), whether libibverbs loads, and which
//! provider `SMC_RS_PROVIDER` gives an address.

use std::net::IpAddr;

use smc_ibverbs::IbVerbs;

use super::RdmaError;

/// `smc rdma devices` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Also say which provider serves these local addresses (repeatable).
    #[arg(long = "addr")]
    pub addrs: Vec<IpAddr>,
}

/// Lists devices; an unusable library or no device is reported, not an error.
pub fn run(args: &Args) -> Result<(), RdmaError> {
    let sel = smc_providers::selection_from_env().map_err(RdmaError::Usage)?;
    let ib = IbVerbs::global();
    let probe = ib.probe();
    match &probe.library {
        Ok(()) => println!("libibverbs: loaded"),
        Err(e) => println!("libibverbs: not available ({e})"),
    }
    if probe.devices.is_empty() {
        println!(
            "no RDMA device found ({} is empty or missing){}",
            smc_ibverbs::sysfs::SYSFS_INFINIBAND,
            if sel == smc_providers::Selection::IbVerbs {
                ""
            } else {
                ": smc-rs uses the software RNIC (softroce)"
            }
        );
    }
    for d in &probe.devices {
        let usable = probe.usable.iter().any(|u| u == &d.name);
        println!(
            "{}: node_guid {} fw {} libibverbs: {}",
            d.name,
            if d.node_guid.is_empty() {
                "-"
            } else {
                &d.node_guid
            },
            if d.fw_ver.is_empty() { "-" } else { &d.fw_ver },
            if usable {
                "usable"
            } else {
                "no user-space provider (ibverbs-providers)"
            }
        );
        for p in &d.ports {
            let mtu = if usable {
                ib.port_mtu(&d.name, p.port)
                    .map(|m| m.bytes().to_string())
                    .unwrap_or_else(|e| format!("? ({e})"))
            } else {
                "-".into()
            };
            let ndevs: Vec<&str> = {
                let mut v: Vec<&str> = p.gids.iter().filter_map(|g| g.ndev.as_deref()).collect();
                v.dedup();
                v
            };
            println!(
                "  link {}/{} state {} physical_state {} link_layer {} active_mtu {} netdev {}",
                d.name,
                p.port,
                p.state,
                if p.phys_state.is_empty() {
                    "-"
                } else {
                    &p.phys_state
                },
                p.link_layer,
                mtu,
                if ndevs.is_empty() {
                    "-".to_string()
                } else {
                    ndevs.join(",")
                }
            );
            for g in &p.gids {
                println!(
                    "    gid {:>3} {:<40} {:<11} {}",
                    g.index,
                    g.gid.to_string(),
                    g.gid_type,
                    g.ndev.as_deref().unwrap_or("-")
                );
            }
        }
    }
    println!("selection: {}={sel}", smc_providers::ENV);
    for a in &args.addrs {
        println!("  {a}: {}", smc_providers::describe(sel, *a));
    }
    Ok(())
}
