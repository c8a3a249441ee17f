//! `smc demo`'s run and report: the same verified two-way transfer and the same ping-pong
//! over SMC-R and over kernel TCP, side by side. The command (in `smc_cmd`) supplies the
//! SMC-R listener and client (two stacks in one process); this module is generic so that
//! its logic is tested without them.

use crate::bench::{fmt_rate, fmt_size};
use crate::harness::{self, Exchange, LatencySummary, Server, ServerRecord};
use crate::net::{Listener, Net};
use anyhow::{bail, Context, Result};
use std::fmt::Write;

/// What one transport did.
#[derive(Clone, Debug)]
pub struct Side {
    /// "SMC-R" or "TCP".
    pub label: String,
    /// The client's view of the exchange.
    pub exchange: Exchange,
    /// The server's record of it.
    pub server: ServerRecord,
    /// 1-byte ping-pong round trips.
    pub latency: LatencySummary,
}

impl Side {
    /// Both directions arrived complete and with the expected SHA-256.
    pub fn verified(&self) -> bool {
        self.exchange.verified && self.server.received.as_ref().is_some_and(|(_, ok)| *ok)
    }
}

/// Runs the exchange of `bytes` each way and `iters` 1-byte ping-pongs over one transport.
pub fn run_side<L, C>(
    label: &str,
    listener: L,
    client: &C,
    bytes: u64,
    iters: usize,
) -> Result<Side>
where
    L: Listener + 'static,
    L::Stream: 'static,
    C: Net,
{
    let srv = Server::start(listener)?;
    let addr = srv.addr();
    let run = || -> Result<(Exchange, LatencySummary)> {
        let x = harness::exchange(client, addr, bytes, 0x5eed)
            .with_context(|| format!("{label}: exchange"))?;
        let (_, rtts) = harness::pingpong(client, addr, 1, iters / 10 + 1, iters)
            .with_context(|| format!("{label}: ping-pong"))?;
        Ok((x, harness::summarize(&rtts)))
    };
    let r = run();
    let recs = srv.stop(client);
    let (exchange, latency) = r?;
    let Some(server) = recs.into_iter().find(|r| r.command == b'X') else {
        bail!("{label}: the server recorded no exchange");
    };
    if let Some(e) = &server.error {
        bail!("{label}: server side of the exchange failed: {e}");
    }
    Ok(Side {
        label: label.into(),
        exchange,
        server,
        latency,
    })
}

/// The demo's report.
pub fn render(smc: &Side, tcp: &Side, bytes: u64) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "client connection: {}", smc.exchange.mode);
    let _ = writeln!(o, "server connection: {}", smc.server.mode);
    let _ = writeln!(o);
    for s in [smc, tcp] {
        let secs = s.exchange.elapsed.as_secs_f64();
        let _ = writeln!(
            o,
            "{:<6} {} each way in {:.2} s, SHA-256 {} (client received {}…, server received {}…)",
            s.label,
            fmt_size(bytes),
            secs,
            if s.verified() {
                "verified both ways"
            } else {
                "MISMATCH"
            },
            &s.exchange.received.hex()[..16],
            s.server
                .received
                .as_ref()
                .map(|(m, _)| m.hex()[..16].to_string())
                .unwrap_or_default(),
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<30} {:>14} {:>14} {:>8}",
        "", smc.label, tcp.label, "ratio"
    );
    let each = |s: &Side| crate::payload::rate(bytes, s.exchange.elapsed);
    let (a, b) = (each(smc), each(tcp));
    let _ = writeln!(
        o,
        "{:<30} {:>14} {:>14} {:>7.2}×",
        "throughput, each way",
        fmt_rate(a),
        fmt_rate(b),
        if b > 0.0 { a / b } else { f64::NAN }
    );
    let (a, b) = (smc.latency.p50_us, tcp.latency.p50_us);
    let _ = writeln!(
        o,
        "{:<30} {:>14} {:>14} {:>7.2}×",
        "latency, 1 B round trip p50",
        format!("{a:.1} µs"),
        format!("{b:.1} µs"),
        if b > 0.0 { a / b } else { f64::NAN }
    );
    let _ = writeln!(
        o,
        "{:<30} {:>14} {:>14}",
        "  p99",
        format!("{:.1} µs", smc.latency.p99_us),
        format!("{:.1} µs", tcp.latency.p99_us),
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::KernelTcp;

    #[test]
    fn demo_sides_verify_and_render() {
        let l = || KernelTcp.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let a = run_side("SMC-R", l(), &KernelTcp, 2 << 20, 50).unwrap();
        let b = run_side("TCP", l(), &KernelTcp, 2 << 20, 50).unwrap();
        assert!(a.verified() && b.verified());
        let text = render(&a, &b, 2 << 20);
        assert!(text.contains("2 MiB each way"), "{text}");
        assert!(text.contains("verified both ways"), "{text}");
        assert!(text.contains("latency, 1 B round trip p50"), "{text}");
    }
}
