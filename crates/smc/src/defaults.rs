//! What [`StackConfig::from_env`](crate::StackConfig::from_env) and therefore
//! [`Stack::global`](crate::Stack::global) (behind `SmcStream::connect` and
//! `SmcListener::bind`) use as RDMA provider and TCP-option source.
//!
//! This crate knows the verbs API and TCP, nothing below them: it cannot name the
//! software RNIC, libibverbs or the eBPF program without linking them into every
//! program (layer rule; libbpf alone is a C library and a build-time clang). The caller
//! installs them once at start-up, before the first connection:
//!
//! ```no_run
//! smc_providers::install_default(); // SMC_RS_PROVIDER: auto | softroce | ibverbs
//! smc_bpf::install_default();       // the RFC 7609 TCP option through eBPF
//! let s = smc::SmcStream::connect("192.0.2.1:5000")?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Without a provider every connection falls back to TCP with the reason "no RDMA
//! provider installed"; without a TCP-option source nothing is announced, so only peers
//! named by `SMC_RS_SKIP_TCP_OPTION` get SMC-R. `StackConfig::with_provider` (and
//! setting `tcp_option`) bypasses these defaults for one stack.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use smc_verbs::{Device, Provider, Result, VerbsError};

use crate::tcp_option::{NoTcpOption, TcpOption};

/// Makes a provider (called by each `StackConfig::from_env`).
pub type ProviderFactory = fn() -> Arc<dyn Provider>;
/// Makes a TCP-option source (called by each `StackConfig::from_env`).
pub type TcpOptionFactory = fn() -> Arc<dyn TcpOption>;

static PROVIDER: RwLock<Option<ProviderFactory>> = RwLock::new(None);
static TCP_OPTION: RwLock<Option<TcpOptionFactory>> = RwLock::new(None);

/// Installs the default RDMA provider. Later calls replace earlier ones; a stack already
/// running keeps the provider it started with (so install before the first connection).
pub fn set_provider(f: ProviderFactory) {
    *PROVIDER.write().unwrap_or_else(|e| e.into_inner()) = Some(f);
}

/// Installs the default TCP-option source (same rules as [`set_provider`]).
pub fn set_tcp_option(f: TcpOptionFactory) {
    *TCP_OPTION.write().unwrap_or_else(|e| e.into_inner()) = Some(f);
}

/// The installed provider, or [`NoProvider`].
pub fn provider() -> Arc<dyn Provider> {
    match *PROVIDER.read().unwrap_or_else(|e| e.into_inner()) {
        Some(f) => f(),
        None => Arc::new(NoProvider),
    }
}

/// The installed TCP-option source, or one that never announces and says why.
pub fn tcp_option() -> Arc<dyn TcpOption> {
    match *TCP_OPTION.read().unwrap_or_else(|e| e.into_inner()) {
        Some(f) => f(),
        None => Arc::new(NoTcpOption::new(
            "no TCP-option source installed (smc_bpf::install_default)",
        )),
    }
}

/// The provider of a process that installed none: no device for any address, so every
/// connection stays TCP, and the reason names what to do.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProvider;

/// The reason [`NoProvider`] gives.
pub const NO_PROVIDER: &str =
    "no RDMA provider installed (smc_providers::install_default, or StackConfig::with_provider)";

impl Provider for NoProvider {
    fn name(&self) -> &str {
        "none"
    }

    fn device_for(&self, _local: IpAddr) -> Result<Device> {
        Err(VerbsError::DeviceGone(NO_PROVIDER.into()))
    }

    fn devices(&self) -> Vec<Device> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_provider_names_the_fix() {
        let e = NoProvider
            .device_for("127.0.0.1".parse().unwrap())
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("smc_providers::install_default"),
            "{e}"
        );
    }
}
