//! `smc-verbs`: the RDMA verbs API that the SMC-R core is written against.
//!
//! The API follows ibverbs semantics (device, protection domain, memory region,
//! completion queue, reliable-connected queue pair, work requests and work
//! completions), so that very different RNICs implement it without changes to
//! the layers above: the software RoCEv2 RNIC (`smc-softroce`), RoCE NICs
//! through libibverbs (`smc-ibverbs`) and the software iWARP RNIC
//! (`smc-iwarp`). Which one a stack uses is the caller's choice
//! (`smc-providers`, `SMC_RS_PROVIDER`); the SMC-R runtime names none.
//! `docs/architecture.md` ("Adding a provider") says what a new one takes.
//!
//! Handles (`Device`, `Pd`, `Mr`, `Cq`, `Qp`) are cheap, cloneable wrappers
//! around provider trait objects (see [`provider`]). Providers implement the
//! `*Ops` traits; users only see the handles.
//!
//! Memory that an RNIC may read or write is allocated as an [`RdmaBuffer`]
//! (page-aligned, zeroed, shared with the provider; every access is atomic
//! word by word, so it stays sound whatever peers and threads do). Work
//! requests name memory the ibverbs way: by address, length and lkey
//! ([`Sge`]), where the address is the region's I/O virtual address
//! ([`Mr::addr`]), chosen by the provider and unrelated to where the buffer
//! lies in the process.

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod error;
pub mod event;
pub mod mem;
pub mod netdev;
pub mod process;
pub mod provider;
pub mod qp;
pub mod types;
pub mod wc;
pub mod wr;

pub use error::{Result, VerbsError};
pub use event::{DriveWaker, EventFd};
pub use mem::{random_iova, RdmaBuffer};
pub use provider::wait_on_event_fd;
pub use provider::{
    CompletionHandler, Cq, CqOps, Device, DeviceAttr, DeviceOps, Mr, MrOps, Pd, PdOps, Provider,
    Qp, QpInitAttr, QpOps,
};
pub use qp::{AddressHandle, InitAttr, QpCap, QpState, RtrAttr, RtsAttr};
pub use types::{psn_add, psn_diff, AccessFlags, Gid, Mac, Mtu, PSN_MASK, QPN_MASK};
pub use wc::{WcOpcode, WcStatus, WorkCompletion};
pub use wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
