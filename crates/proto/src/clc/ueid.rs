//! User EIDs (UEIDs): the configuration SMC-Rv2 needs before it can be used at all.
//!
//! SMCv2 (IBM "SMC Version 2", Linux `smc_clc.c`) only lets two hosts talk SMC-Rv2 when
//! they share an Enterprise ID: the client offers its user EIDs in the Proposal's v2
//! extension, the server picks the first one it also has and echoes it in the Accept
//! (linux-smc.md §2.12). Without any UEID a Linux client does not offer v2 at all, and a
//! Linux server declines a v2-only Proposal.
//!
//! Rules, as Linux enforces them (`smc_clc_ueid_valid`, `smc_clc_ueid_add`):
//! - a UEID is at most 32 characters, blank-padded to 32 bytes on the wire;
//! - the first character is A-Z or 0-9, the others A-Z, 0-9, `.` or `-`; no blanks
//!   inside, no lower case;
//! - a host holds at most [`MAX_LOCAL_UEIDS`] (4, `SMC_MAX_UEID`); duplicates are refused.
//!
//! Sources of configuration (read by the `smc` crate's `ueid_file` module, for the
//! `smc ueid add|del|show` command and the runtime): a file, one UEID per line, `#`
//! comments and blank lines ignored ([`UeidTable::parse_file`],
//! [`UeidTable::to_file_text`]); an environment variable, comma- or blank-separated
//! ([`UeidTable::parse_list`]).

use std::fmt;
use std::path::{Path, PathBuf};

use smc_wire::common::Eid;

/// Most user EIDs one host holds (Linux `SMC_MAX_UEID`).
pub const MAX_LOCAL_UEIDS: usize = 4;

/// A bad UEID or a table operation that cannot be done.
#[derive(Debug, thiserror::Error)]
pub enum UeidError {
    /// The text is not a valid user EID.
    #[error("invalid UEID `{text}`: {why}")]
    Invalid {
        /// The offending text.
        text: String,
        /// Which rule it breaks.
        why: &'static str,
    },
    /// The table already holds this UEID.
    #[error("UEID `{0}` is already configured")]
    Exists(String),
    /// The table is full.
    #[error("at most {MAX_LOCAL_UEIDS} UEIDs can be configured")]
    Full,
    /// The UEID is not in the table.
    #[error("UEID `{0}` is not configured")]
    NotFound(String),
    /// A line of the file is not a valid UEID.
    #[error("UEID file {path}, line {line}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        source: Box<UeidError>,
    },
}

/// One validated user EID (32 bytes, blank-padded).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ueid(Eid);

impl Ueid {
    /// Validates `text` by Linux's rules (see the module docs). Surrounding blanks are
    /// ignored; nothing else is changed (in particular lower case is refused, not
    /// converted: the peer compares the 32 bytes exactly).
    pub fn new(text: &str) -> Result<Ueid, UeidError> {
        let t = text.trim_matches(|c: char| c == ' ' || c == '\t');
        let bad = |why| UeidError::Invalid {
            text: text.to_string(),
            why,
        };
        if t.is_empty() {
            return Err(bad("empty"));
        }
        if t.len() > Eid::LEN {
            return Err(bad("longer than 32 characters"));
        }
        if t.chars().any(|c| c.is_ascii_lowercase()) {
            return Err(bad("lower case letters are not allowed (use A-Z)"));
        }
        let name = Eid::new(t).ok_or_else(|| bad("longer than 32 characters"))?;
        if !name.is_valid_ueid() {
            let first = t.as_bytes()[0];
            return Err(if !(first.is_ascii_uppercase() || first.is_ascii_digit()) {
                bad("the first character must be A-Z or 0-9")
            } else {
                bad("only A-Z, 0-9, '.' and '-' are allowed, without blanks")
            });
        }
        Ok(Ueid(name))
    }

    /// Accepts a 32-byte wire field if it satisfies the rules (e.g. from a peer).
    pub fn from_wire(eid: Eid) -> Option<Ueid> {
        eid.is_valid_ueid().then_some(Ueid(eid))
    }

    /// The 32-byte blank-padded field.
    pub fn eid(&self) -> Eid {
        self.0
    }
}

impl fmt::Display for Ueid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Ueid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ueid({})", self.0)
    }
}

impl std::str::FromStr for Ueid {
    type Err = UeidError;
    fn from_str(s: &str) -> Result<Ueid, UeidError> {
        Ueid::new(s)
    }
}

/// The host's user EIDs, in the order they are offered in a Proposal (Linux offers its
/// table in insertion order, and a Linux server takes the first offered EID it knows).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UeidTable {
    ueids: Vec<Ueid>,
}

impl UeidTable {
    /// An empty table (SMC-Rv2 disabled).
    pub fn new() -> UeidTable {
        UeidTable::default()
    }

    /// Adds one UEID at the end.
    pub fn add(&mut self, ueid: Ueid) -> Result<(), UeidError> {
        if self.ueids.contains(&ueid) {
            return Err(UeidError::Exists(ueid.to_string()));
        }
        if self.ueids.len() >= MAX_LOCAL_UEIDS {
            return Err(UeidError::Full);
        }
        self.ueids.push(ueid);
        Ok(())
    }

    /// Removes one UEID.
    pub fn remove(&mut self, ueid: &Ueid) -> Result<(), UeidError> {
        let before = self.ueids.len();
        self.ueids.retain(|u| u != ueid);
        if self.ueids.len() == before {
            return Err(UeidError::NotFound(ueid.to_string()));
        }
        Ok(())
    }

    /// Removes every UEID.
    pub fn clear(&mut self) {
        self.ueids.clear();
    }

    /// The UEIDs in offer order.
    pub fn iter(&self) -> impl Iterator<Item = &Ueid> {
        self.ueids.iter()
    }

    /// Number of UEIDs.
    pub fn len(&self) -> usize {
        self.ueids.len()
    }

    /// True when no UEID is configured (SMC-Rv2 cannot be used).
    pub fn is_empty(&self) -> bool {
        self.ueids.is_empty()
    }

    /// Whether the table holds this 32-byte EID (exact byte comparison, as Linux's
    /// `smc_clc_match_eid`).
    pub fn contains_eid(&self, eid: &Eid) -> bool {
        self.ueids.iter().any(|u| &u.0 == eid)
    }

    /// The first of `offered` that this table also holds (the server's choice, Linux
    /// `smc_clc_match_eid`: peer order wins).
    pub fn first_common<'a>(&self, offered: impl IntoIterator<Item = &'a Eid>) -> Option<Eid> {
        offered.into_iter().find(|e| self.contains_eid(e)).copied()
    }

    /// Parses a list separated by commas, blanks or newlines (the syntax of `SMC_RS_UEID`,
    /// `smc::ueid_file::UEID_ENV`).
    pub fn parse_list(text: &str) -> Result<UeidTable, UeidError> {
        let mut t = UeidTable::new();
        for item in text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
        {
            t.add(Ueid::new(item)?)?;
        }
        Ok(t)
    }

    /// Parses the file format: one UEID per line, `#` starts a comment, blank lines are
    /// skipped. `path` is only used in error messages.
    pub fn parse_file(text: &str, path: &Path) -> Result<UeidTable, UeidError> {
        let mut t = UeidTable::new();
        for (i, line) in text.lines().enumerate() {
            let content = line.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let wrap = |e: UeidError| UeidError::File {
                path: path.to_path_buf(),
                line: i + 1,
                source: Box::new(e),
            };
            t.add(Ueid::new(content).map_err(wrap)?).map_err(wrap)?;
        }
        Ok(t)
    }

    /// Renders the file format (with a header comment).
    pub fn to_file_text(&self) -> String {
        let mut s = String::from("# smc-rs user EIDs (SMC-Rv2), one per line; see `smc ueid`\n");
        for u in &self.ueids {
            s.push_str(&u.to_string());
            s.push('\n');
        }
        s
    }
}

impl<'a> IntoIterator for &'a UeidTable {
    type Item = &'a Ueid;
    type IntoIter = std::slice::Iter<'a, Ueid>;
    fn into_iter(self) -> Self::IntoIter {
        self.ueids.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_validity_rules() {
        assert!(Ueid::new("SMC-PEER-TEST").is_ok());
        assert!(
            Ueid::new("  IBM.EID-1 ").is_ok(),
            "surrounding blanks are padding"
        );
        assert_eq!(
            Ueid::new("SMC-PEER-TEST").unwrap().eid().0[13..],
            [b' '; 19],
            "blank-padded to 32 bytes"
        );
        assert!(Ueid::new(&"A".repeat(32)).is_ok());
        for bad in [
            "",
            "   ",
            "smc-lower",
            "-LEADING",
            ".LEADING",
            "IN SIDE",
            "UNDER_SCORE",
            "SL/ASH",
            "ÄÖ",
        ] {
            assert!(
                matches!(Ueid::new(bad), Err(UeidError::Invalid { .. })),
                "{bad:?}"
            );
        }
        assert!(Ueid::new(&"A".repeat(33)).is_err());
        let e = Ueid::new("smc").unwrap_err().to_string();
        assert!(e.contains("lower case"), "{e}");
    }

    #[test]
    fn table_add_remove_limits() {
        let mut t = UeidTable::new();
        for n in ["A1", "B2", "C3", "D4"] {
            t.add(n.parse().unwrap()).unwrap();
        }
        assert!(matches!(t.add("E5".parse().unwrap()), Err(UeidError::Full)));
        assert!(matches!(
            t.add("A1".parse().unwrap()),
            Err(UeidError::Exists(_))
        ));
        t.remove(&"B2".parse().unwrap()).unwrap();
        assert!(matches!(
            t.remove(&"B2".parse().unwrap()),
            Err(UeidError::NotFound(_))
        ));
        let names: Vec<String> = t.iter().map(|u| u.to_string()).collect();
        assert_eq!(names, ["A1", "C3", "D4"], "insertion order kept");
        t.clear();
        assert!(t.is_empty());
    }

    #[test]
    fn first_common_follows_the_peer_order() {
        let t = UeidTable::parse_list("X,Y").unwrap();
        let offered = [
            Eid::new("Z").unwrap(),
            Eid::new("Y").unwrap(),
            Eid::new("X").unwrap(),
        ];
        assert_eq!(t.first_common(offered.iter()), Some(Eid::new("Y").unwrap()));
        assert_eq!(t.first_common([Eid::new("Q").unwrap()].iter()), None);
        // Exact 32-byte comparison: NUL padding is a different EID.
        let mut nul = Eid::new("X").unwrap();
        nul.0[1..].fill(0);
        assert!(!t.contains_eid(&nul));
    }
}
