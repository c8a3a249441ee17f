//! `smc rdma conformance`: `smc_verbs::conformance` (every RC opcode and the completion
//! statuses every RNIC produces) on the provider `SMC_RS_PROVIDER` selects, between the
//! devices of two local addresses (or within the device of one: QP to QP on one port).

use std::net::IpAddr;

use super::RdmaError;

/// `smc rdma conformance` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Local address of the first device.
    #[arg(long)]
    pub addr: IpAddr,
    /// Local address of the second device (default: the first: both QPs on one device).
    #[arg(long)]
    pub addr2: Option<IpAddr>,
    /// Run only the cases whose name contains this.
    #[arg(long)]
    pub only: Option<String>,
    /// A case this RNIC is known to fail (repeatable): it still runs and its outcome is
    /// printed as KNOWN, but it does not count (e.g. a completion status the RNIC reports
    /// differently; README "RoCE NICs" lists Linux rxe's).
    #[arg(long = "known")]
    pub known: Vec<String>,
}

/// Runs the suite; fails when a case fails.
pub fn run(args: &Args) -> Result<(), RdmaError> {
    let sel = smc_providers::selection_from_env().map_err(RdmaError::Usage)?;
    let a = smc_providers::open_device(sel, args.addr)?;
    let b = match args.addr2 {
        Some(ip) if ip != args.addr => smc_providers::open_device(sel, ip)?,
        _ => a.clone(),
    };
    println!(
        "conformance: {} ({}, {}) <-> {} ({}, {})",
        a.name(),
        a.attr().provider,
        a.attr().local_addr,
        b.name(),
        b.attr().provider,
        b.attr().local_addr
    );
    let mut failed = 0;
    let mut ran = 0;
    for c in smc_verbs::conformance::CASES {
        if args.only.as_deref().is_some_and(|o| !c.name.contains(o)) {
            continue;
        }
        let known = args.known.iter().any(|k| k == c.name);
        if !known {
            ran += 1;
        }
        match (c.run)(&a, &b) {
            Ok(()) if known => println!("KNOWN {} (passed)", c.name),
            Ok(()) => println!("PASS {}", c.name),
            Err(e) if known => println!("KNOWN {}: {e}", c.name),
            Err(e) => {
                failed += 1;
                println!("FAIL {}: {e}", c.name);
            }
        }
    }
    println!("conformance: {} passed, {failed} failed", ran - failed);
    if failed > 0 || ran == 0 {
        return Err(RdmaError::Protocol(format!(
            "{failed} of {ran} conformance cases failed"
        )));
    }
    Ok(())
}
