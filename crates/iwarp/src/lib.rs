//! `smc-iwarp`: a software iWARP RNIC.
//!
//! RDMAP (RFC 5040) over DDP (RFC 5041) over MPA (RFC 5044) over a kernel TCP connection
//! per queue pair, with the RFC 6581 enhanced connection establishment (MPA revision 2:
//! IRD/ORD negotiation, peer-to-peer mode with a Ready-to-Receive message, MPA error
//! reporting), wire-compatible with Linux `siw`. It implements the [`smc_verbs`] provider
//! traits; because an iWARP QP is bound to a TCP connection, QPs are connected by the small
//! connection manager in [`cm`] (the role `iw_cm`/`rdma_cm` play on Linux) instead of the
//! RTR/RTS attributes of RoCE.
//!
//! * [`wire`]: MPA frames, FPDUs, DDP/RDMAP headers (typed views and `Repr`s).
//! * [`negotiate`]: the RFC 6581 §9 IRD/ORD and RTR rules as pure functions.
//! * [`cm`]: connect / listen / accept / reject over TCP, MPA Request/Reply.
//! * the provider: devices, protection domains, memory regions (STag = rkey), CQs and RC QPs
//!   whose transmit and receive run on two threads per QP.
pub mod wire;
pub mod negotiate;
