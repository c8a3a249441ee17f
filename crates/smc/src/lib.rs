//! `smc`: the SMC-R runtime (RFC 7609) behind a `std::net`-shaped API. The protocol —
//! rendezvous, link groups, LLC, the CDC data path, urgent data, termination and TCP
//! fallback — is `smc-proto`'s sans-I/O machines and endpoint (re-exported here as
//! [`clc`], [`llc`], [`conn`], [`endpoint`]); this crate drives them with sockets, verbs
//! and threads ([`runtime`]) and offers [`SmcListener`] / [`SmcStream`].
//!
//! See `docs/architecture.md` for the crate graph and the path of a byte, and
//! `docs/core-design.md` for the module map and the threading model.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use smc::{SmcListener, SmcStream};
//! // Once per process: the RDMA provider and the TCP-option source (see `defaults`).
//! smc_providers::install_default();
//! smc_bpf::install_default();
//! let l = SmcListener::bind("127.0.0.1:5000")?;
//! let mut c = SmcStream::connect("127.0.0.1:5000")?;
//! let (mut s, _) = l.accept()?;
//! println!("{}", c.mode()); // "SMC-Rv1 on lgr1 (first contact)" or the fallback reason
//! c.write_all(b"hi")?;
//! let mut b = [0u8; 2];
//! s.read_exact(&mut b)?;
//! # Ok::<(), std::io::Error>(())
//! ```

pub mod api;
pub mod defaults;
pub mod observe;
pub mod policy;
pub mod runtime;
pub mod tcp_option;
pub mod ueid_file;

pub use smc_proto::{clc, conn, endpoint, llc};

#[cfg(feature = "tokio")]
pub use api::tokio;
pub use api::{Mode, SmcListener, SmcStream};
pub use clc::FallbackReason;
pub use endpoint::BufSizes;
pub use runtime::{
    BufferSizes, ConnInfo, LinkGroupId, LinkGroupInfo, LinkListing, Stack, StackConfig, Stats,
};
