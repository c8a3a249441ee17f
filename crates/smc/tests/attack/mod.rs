//! The attacker harness of the malicious-peer suite (`tests/malicious.rs`, issue 10) and of
//! the `attacker` example that `tests/system/smc-malicious.sh` runs against the `smc`
//! binary.
//!
//! - [`clc`]: CLC over a raw TCP socket — well-formed messages from `smc-wire`, and raw
//!   bytes for everything malformed.
//! - [`link`]: [`link::RawLink`], one link as the attacker holds it: its own PD/CQ/QP on
//!   the attacker's software RNIC, arbitrary SENDs (CDC or LLC, any length) and RDMA WRITEs
//!   (any address, any rkey), a log of what the victim sent, and automatic answers to the
//!   LLC requests a live peer must answer (each can be switched off).
//! - [`peer`]: the evil peer's rendezvous, step by step, as a client
//!   ([`peer::ClientHandshake`]) and as a server ([`peer::ServerHandshake`]), and the
//!   established [`peer::Session`] with a working data path beside the raw access.
//! - [`roce`]: forged RoCEv2 packets (valid ICRC) from a UDP socket on another address.
//! - `scene` (tests only): a victim stack carrying honest, hash-verified transfers while
//!   the attack runs, and the checks that everything is back to its baseline afterwards.
//!
//! Adding an attack: build the scene (`Scene::server_victim` / `Scene::client_victim`),
//! start honest transfers, get a session or a raw socket from an [`peer::Attacker`], do the
//! damage, assert the outcome for the attacked connection, and end with `scene.finish()`.

#![allow(dead_code)]

pub mod clc;
pub mod link;
pub mod peer;
pub mod roce;
#[cfg(test)]
pub mod scene;

/// Deterministic pseudo-random bytes (the same generator as `tests/common`).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
