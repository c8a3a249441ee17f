//! Which connections try SMC-R and which stay TCP, decided per connection before the
//! rendezvous (like the Linux kernel's per-connection BPF hook, smc_hs_ctrl): allow and
//! deny lists of `ADDR[/PREFIX][:PORT]` patterns (the syntax of SMC_RS_SKIP_TCP_OPTION,
//! [`crate::tcp_option::PeerPattern`]) in the host's policy file ([`DEFAULT_POLICY_FILE`],
//! or the one [`POLICY_FILE_ENV`] names) and in [`ALLOW_ENV`] and [`DENY_ENV`].
//!
//! A connection this process opens stays TCP — no Proposal, nothing on the wire but
//! TCP — when its destination matches a deny pattern, or when an allow list is set and
//! no allow pattern matches. Deny wins over allow. The fallback reason says so
//! ("policy: ..."), and `smc ss` marks it `[policy]`. Use it for short-lived-connection
//! services (an RDMA link costs more than a few round trips save) and for peers that
//! wrongly echo the TCP option (a known cause of failed connections with Linux SMC).
//! Accepted connections are not filtered: a server answers whatever its clients
//! propose, so a client's lists decide for both ends.
//!
//! The file holds lines `allow PATTERN...` and `deny PATTERN...` (`#` starts a comment);
//! an environment variable that is set replaces the file's list of its kind (set empty,
//! it empties it), as the environment overrides the file for the UEIDs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::tcp_option::{PeerPattern, PolicyError};

/// Destinations that may try SMC-R (unset or empty: all).
pub const ALLOW_ENV: &str = "SMC_RS_ALLOW";
/// Destinations that stay TCP.
pub const DENY_ENV: &str = "SMC_RS_DENY";
/// Environment variable naming the policy file (default [`DEFAULT_POLICY_FILE`]; set
/// empty: no file).
pub const POLICY_FILE_ENV: &str = "SMC_RS_POLICY_FILE";
/// The host's policy file.
pub const DEFAULT_POLICY_FILE: &str = "/etc/smc-rs/policy";

/// Reading or parsing the policy configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum PolicyConfigError {
    /// The file exists but cannot be read.
    #[error("policy file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A line of the file is not `allow|deny PATTERN...`.
    #[error("policy file {path}, line {line}: {why}")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// An environment variable's list is malformed.
    #[error("{var}: {source}")]
    Env {
        /// The variable.
        var: &'static str,
        /// The bad pattern.
        source: PolicyError,
    },
}

/// One list and where it came from (named in fallback reasons).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct List {
    patterns: Vec<PeerPattern>,
    /// `SMC_RS_ALLOW`, `SMC_RS_DENY`, or `allow`/`deny` of a file.
    source: String,
}

/// The allow and deny lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmcPolicy {
    allow: List,
    deny: List,
}

fn patterns(s: &str) -> Result<Vec<PeerPattern>, PolicyError> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(str::parse)
        .collect()
}

impl SmcPolicy {
    /// From pattern lists (comma- or space-separated), as if from [`ALLOW_ENV`] and
    /// [`DENY_ENV`].
    pub fn new(allow: &str, deny: &str) -> Result<SmcPolicy, PolicyError> {
        Ok(SmcPolicy {
            allow: List {
                patterns: patterns(allow)?,
                source: ALLOW_ENV.into(),
            },
            deny: List {
                patterns: patterns(deny)?,
                source: DENY_ENV.into(),
            },
        })
    }

    /// The policy in effect: the file at [`default_path`] (missing: no lists), each list
    /// replaced by its environment variable when that is set. An error names the file
    /// line or the variable (the caller warns and uses no policy).
    pub fn from_env() -> Result<SmcPolicy, PolicyConfigError> {
        let file = default_path();
        SmcPolicy::resolve(
            file.as_deref(),
            smc_verbs::process::config_var(ALLOW_ENV).as_deref(),
            smc_verbs::process::config_var(DENY_ENV).as_deref(),
        )
    }

    /// [`SmcPolicy::from_env`] with its inputs passed in (testable).
    pub fn resolve(
        file: Option<&Path>,
        allow_env: Option<&str>,
        deny_env: Option<&str>,
    ) -> Result<SmcPolicy, PolicyConfigError> {
        let mut p = match file {
            Some(path) => SmcPolicy::load(path)?,
            None => SmcPolicy::default(),
        };
        for (var, value, list) in [
            (ALLOW_ENV, allow_env, &mut p.allow),
            (DENY_ENV, deny_env, &mut p.deny),
        ] {
            if let Some(v) = value {
                *list = List {
                    patterns: patterns(v)
                        .map_err(|source| PolicyConfigError::Env { var, source })?,
                    source: var.into(),
                };
            }
        }
        Ok(p)
    }

    /// Loads a policy file; a missing file is no policy.
    pub fn load(path: &Path) -> Result<SmcPolicy, PolicyConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SmcPolicy::default()),
            Err(source) => {
                return Err(PolicyConfigError::Io {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        SmcPolicy::parse_file(&text, path)
    }

    /// Parses the text of a policy file (`path` names it in errors and reasons).
    pub fn parse_file(text: &str, path: &Path) -> Result<SmcPolicy, PolicyConfigError> {
        let mut p = SmcPolicy::default();
        for (i, line) in text.lines().enumerate() {
            let bad = |why: String| PolicyConfigError::Line {
                path: path.to_path_buf(),
                line: i + 1,
                why,
            };
            let line = line.split('#').next().unwrap_or("").trim();
            let Some((kind, rest)) = line
                .split_once(char::is_whitespace)
                .or((!line.is_empty()).then_some((line, "")))
            else {
                continue;
            };
            let list = match kind {
                "allow" => &mut p.allow,
                "deny" => &mut p.deny,
                other => return Err(bad(format!("`{other}`: expected `allow` or `deny`"))),
            };
            let mut pats = patterns(rest).map_err(|e| bad(e.to_string()))?;
            if pats.is_empty() {
                return Err(bad(format!("`{kind}` without a pattern")));
            }
            list.patterns.append(&mut pats);
            list.source = format!("`{kind}` of {}", path.display());
        }
        Ok(p)
    }

    /// `Some(reason)` when a connection to `dest` must stay TCP.
    pub fn keeps_tcp(&self, dest: SocketAddr) -> Option<String> {
        if let Some(p) = self.deny.patterns.iter().find(|p| p.matches(dest)) {
            return Some(format!(
                "policy: {dest} matches {} pattern {p}",
                self.deny.source
            ));
        }
        if !self.allow.patterns.is_empty() && !self.allow.patterns.iter().any(|p| p.matches(dest)) {
            return Some(format!(
                "policy: {dest} matches no {} pattern",
                self.allow.source
            ));
        }
        None
    }

    /// No list: every destination tries SMC-R.
    pub fn is_empty(&self) -> bool {
        self.allow.patterns.is_empty() && self.deny.patterns.is_empty()
    }
}

/// The policy file in effect: [`POLICY_FILE_ENV`] if set (empty: none), else
/// [`DEFAULT_POLICY_FILE`].
pub fn default_path() -> Option<PathBuf> {
    match smc_verbs::process::config_var(POLICY_FILE_ENV) {
        Some(p) if p.is_empty() => None,
        Some(p) => Some(PathBuf::from(p)),
        None => Some(PathBuf::from(DEFAULT_POLICY_FILE)),
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

    #[test]
    fn file_and_environment() {
        let path = Path::new("/etc/smc-rs/policy");
        let text = "# keep redis on TCP\ndeny 10.0.0.0/8:6379   # trailing\n\nallow 10.0.0.0/8:* ,192.168.0.0/16:*\nallow [fd00::/8]:*\n";
        let p = SmcPolicy::parse_file(text, path).unwrap();
        let r = p.keeps_tcp(a("10.1.2.3:6379")).unwrap();
        assert!(r.contains("`deny` of /etc/smc-rs/policy"), "{r}");
        assert_eq!(p.keeps_tcp(a("192.168.3.4:80")), None);
        assert_eq!(p.keeps_tcp(a("[fd00::1]:80")), None);
        let r = p.keeps_tcp(a("172.16.0.1:80")).unwrap();
        assert!(r.contains("no `allow` of /etc/smc-rs/policy"), "{r}");
        for (bad, line) in [
            ("deny\n", 1),
            ("# c\npermit 10.0.0.0/8\n", 2),
            ("allow 10.0.0.0/99\n", 1),
        ] {
            match SmcPolicy::parse_file(bad, path) {
                Err(PolicyConfigError::Line { line: l, .. }) => assert_eq!(l, line, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        // A set variable replaces the file's list of its kind; set empty, it empties it.
        let dir = std::env::temp_dir().join(format!("smc-rs-policy-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("policy");
        std::fs::write(&f, text).unwrap();
        let p = SmcPolicy::resolve(Some(&f), Some(""), None).unwrap();
        assert_eq!(p.keeps_tcp(a("172.16.0.1:80")), None);
        assert!(p.keeps_tcp(a("10.1.2.3:6379")).is_some());
        let p = SmcPolicy::resolve(Some(&f), None, Some("*:443")).unwrap();
        assert_eq!(p.keeps_tcp(a("10.1.2.3:6379")), None);
        assert!(p.keeps_tcp(a("10.1.2.3:443")).unwrap().contains(DENY_ENV));
        assert!(matches!(
            SmcPolicy::resolve(Some(&f), Some("x/1"), None),
            Err(PolicyConfigError::Env { var: ALLOW_ENV, .. })
        ));
        assert!(SmcPolicy::resolve(Some(&dir.join("missing")), None, None)
            .unwrap()
            .is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
