//! Which connections try SMC-R and which stay TCP, decided per connection before the
//! rendezvous (like the Linux kernel's per-connection BPF hook, smc_hs_ctrl): allow and
//! deny lists of `ADDR[/PREFIX][:PORT]` patterns (the syntax of SMC_RS_SKIP_TCP_OPTION,
//! [`crate::tcp_option::PeerPattern`]) in [`ALLOW_ENV`] and [`DENY_ENV`].
//!
//! A connection this process opens stays TCP — no Proposal, nothing on the wire but
//! TCP — when its destination matches a deny pattern, or when an allow list is set and
//! no allow pattern matches. Deny wins over allow. The fallback reason says so
//! ("policy: ..."), and `smc ss` marks it `[policy]`. Use it for short-lived-connection
//! services (an RDMA link costs more than a few round trips save) and for peers that
//! wrongly echo the TCP option (a known cause of failed connections with Linux SMC).
//! Accepted connections are not filtered: a server answers whatever its clients
//! propose, so a client's lists decide for both ends.

use std::net::SocketAddr;

use crate::tcp_option::{PeerPattern, PolicyError};

/// Destinations that may try SMC-R (unset or empty: all).
pub const ALLOW_ENV: &str = "SMC_RS_ALLOW";
/// Destinations that stay TCP.
pub const DENY_ENV: &str = "SMC_RS_DENY";

/// The allow and deny lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmcPolicy {
    allow: Vec<PeerPattern>,
    deny: Vec<PeerPattern>,
}

fn patterns(s: &str) -> Result<Vec<PeerPattern>, PolicyError> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(str::parse)
        .collect()
}

impl SmcPolicy {
    /// From pattern lists (comma- or space-separated).
    pub fn new(allow: &str, deny: &str) -> Result<SmcPolicy, PolicyError> {
        Ok(SmcPolicy {
            allow: patterns(allow)?,
            deny: patterns(deny)?,
        })
    }

    /// From [`ALLOW_ENV`] and [`DENY_ENV`]; a malformed list is an error (the caller
    /// warns and uses none).
    pub fn from_env() -> Result<SmcPolicy, PolicyError> {
        let get = |k| std::env::var(k).unwrap_or_default();
        SmcPolicy::new(&get(ALLOW_ENV), &get(DENY_ENV))
    }

    /// `Some(reason)` when a connection to `dest` must stay TCP.
    pub fn keeps_tcp(&self, dest: SocketAddr) -> Option<String> {
        if let Some(p) = self.deny.iter().find(|p| p.matches(dest)) {
            return Some(format!("policy: {dest} matches {DENY_ENV} pattern {p}"));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|p| p.matches(dest)) {
            return Some(format!("policy: {dest} matches no {ALLOW_ENV} pattern"));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn deny_wins_and_allow_restricts() {
        let none = SmcPolicy::default();
        assert_eq!(none.keeps_tcp(a("10.0.0.1:80")), None);
        let p = SmcPolicy::new("10.0.0.0/8:*", "10.1.0.0/16:* *:6379").unwrap();
        assert_eq!(p.keeps_tcp(a("10.2.3.4:80")), None);
        let r = p.keeps_tcp(a("10.1.2.3:80")).unwrap();
        assert!(r.starts_with("policy: ") && r.contains(DENY_ENV), "{r}");
        assert!(p.keeps_tcp(a("10.2.3.4:6379")).unwrap().contains(DENY_ENV));
        let r = p.keeps_tcp(a("192.168.1.1:80")).unwrap();
        assert!(r.contains(ALLOW_ENV), "{r}");
        let only_deny = SmcPolicy::new("", "*:443").unwrap();
        assert_eq!(only_deny.keeps_tcp(a("[fd00::1]:80")), None);
        assert!(only_deny.keeps_tcp(a("[fd00::1]:443")).is_some());
        assert!(SmcPolicy::new("10.0.0.0/99", "").is_err());
    }
}
