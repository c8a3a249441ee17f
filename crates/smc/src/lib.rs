//! `smc`: the SMC-R core (RFC 7609) — rendezvous, link groups, LLC, the CDC data path,
//! urgent data, termination and TCP fallback, behind a `std::net`-shaped API.
//!
//! See `docs/core-design.md` for the module map and the threading model.

pub mod clc;
pub mod conn;
pub mod llc;
