//! CLC Decline diagnosis codes ("Peer Diagnosis Information", RFC 7609 A.2.5).
//!
//! The RFC leaves the 4 bytes to each implementation (AMB-16); Linux's `SMC_CLC_DECL_*` values
//! are the de-facto vocabulary (linux-smc.md §1.7), so we send and explain those.

use core::fmt;

/// A Decline diagnosis code (u32, big-endian on the wire). Unknown codes are kept as is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeclineCode(pub u32);

macro_rules! codes {
    ($( $konst:ident = $val:literal, $name:literal, $explain:literal; )*) => {
        impl DeclineCode {
            $(
                #[doc = $explain]
                pub const $konst: DeclineCode = DeclineCode($val);
            )*
            /// Every code Linux defines, in numeric order.
            pub const ALL: &'static [DeclineCode] = &[$(DeclineCode($val)),*];

            /// Linux's short name (`SMC_CLC_DECL_<name>`), or `None` for an unknown code.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($val => Some($name),)*
                    _ => None,
                }
            }
            /// One-line human explanation, or `None` for an unknown code.
            pub fn explain(self) -> Option<&'static str> {
                match self.0 {
                    $($val => Some($explain),)*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    MEM = 0x0101_0000, "MEM", "insufficient memory resources on the peer";
    TIMEOUT_CL = 0x0201_0000, "TIMEOUT_CL", "timeout waiting for the CONFIRM LINK message";
    TIMEOUT_AL = 0x0202_0000, "TIMEOUT_AL", "timeout waiting for the ADD LINK message";
    CNFERR = 0x0300_0000, "CNFERR", "configuration error (e.g. no IP prefix available for the interface)";
    PEERNOSMC = 0x0301_0000, "PEERNOSMC", "peer did not indicate SMC (no TCP option) or offered nothing usable";
    IPSEC = 0x0302_0000, "IPSEC", "the connection uses IPsec, which SMC cannot carry";
    NOSMCDEV = 0x0303_0000, "NOSMCDEV", "no usable SMC device (neither SMC-R nor SMC-D) for this connection, or no matching EID";
    NOSMCDDEV = 0x0303_0001, "NOSMCDDEV", "no SMC-D device found";
    NOSMCRDEV = 0x0303_0002, "NOSMCRDEV", "no SMC-R (RoCE) device found";
    NOISM2SUPP = 0x0303_0003, "NOISM2SUPP", "no ISM device with SMC-Dv2 support";
    NOV2EXT = 0x0303_0004, "NOV2EXT", "peer sent no SMCv2 extension in the Proposal";
    NOV2DEXT = 0x0303_0005, "NOV2DEXT", "peer sent no SMC-Dv2 extension in the Proposal";
    NOSEID = 0x0303_0006, "NOSEID", "peer sent no system EID (SEID)";
    NOSMCD2DEV = 0x0303_0007, "NOSMCD2DEV", "no SMC-Dv2 device found";
    NOUEID = 0x0303_0008, "NOUEID", "no common user EID configured on both hosts";
    RELEASEERR = 0x0303_0009, "RELEASEERR", "SMCv2 release negotiation failed (v2.1)";
    MAXCONNERR = 0x0303_000a, "MAXCONNERR", "max_conns negotiation failed (below 16 connections per link group)";
    MAXLINKERR = 0x0303_000b, "MAXLINKERR", "max_links negotiation failed (fewer than 1 link per link group)";
    MODEUNSUPP = 0x0304_0000, "MODEUNSUPP", "SMC modes do not match (SMC-R vs SMC-D)";
    RMBE_EC = 0x0305_0000, "RMBE_EC", "peer uses an RMBE eye catcher, which Linux does not support";
    OPTUNSUPP = 0x0306_0000, "OPTUNSUPP", "a socket option SMC does not support (e.g. TCP fast open) is in use";
    DIFFPREFIX = 0x0307_0000, "DIFFPREFIX", "the peers are not on the same IP subnet/prefix (SMC-Rv1)";
    GETVLANERR = 0x0308_0000, "GETVLANERR", "cannot determine the VLAN of the IP device";
    ISMVLANERR = 0x0309_0000, "ISMVLANERR", "cannot register the VLAN on the ISM device";
    NOACTLINK = 0x030a_0000, "NOACTLINK", "no active SMC-R link in the link group";
    NOSRVLINK = 0x030b_0000, "NOSRVLINK", "the SMC-R link named by the server was not found by the client";
    VERSMISMAT = 0x030c_0000, "VERSMISMAT", "SMC version mismatch";
    MAX_DMB = 0x030d_0000, "MAX_DMB", "SMC-D DMB limit reached";
    NOROUTE = 0x030e_0000, "NOROUTE", "SMC-Rv2: no route to the peer's RoCE GID";
    NOINDIRECT = 0x030f_0000, "NOINDIRECT", "SMC-Rv2: direct/indirect (gateway) mismatch";
    SYNCERR = 0x0400_0000, "SYNCERR", "link groups are out of sync (sent with the out-of-sync flag)";
    PEERDECL = 0x0500_0000, "PEERDECL", "the peer declined during the handshake (local code)";
    INTERR = 0x0999_0000, "INTERR", "internal error on the peer";
    ERR_RTOK = 0x0999_0001, "ERR_RTOK", "internal error: rtoken handling failed";
    ERR_RDYLNK = 0x0999_0002, "ERR_RDYLNK", "internal error: readying the RDMA link failed";
    ERR_REGBUF = 0x0999_0003, "ERR_REGBUF", "internal error: buffer registration or CONFIRM RKEY failed";
}

impl fmt::Display for DeclineCode {
    /// `0x03030008 NOUEID (no common user EID configured on both hosts)`, or just the hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)?;
        if let (Some(n), Some(e)) = (self.name(), self.explain()) {
            write!(f, " {n} ({e})")?;
        }
        Ok(())
    }
}

impl fmt::Debug for DeclineCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "DeclineCode({:#010x} {n})", self.0),
            None => write!(f, "DeclineCode({:#010x})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_name_and_explanation() {
        assert_eq!(DeclineCode::ALL.len(), 36);
        for c in DeclineCode::ALL {
            assert!(c.name().is_some() && c.explain().is_some(), "{c:?}");
        }
        let mut sorted = DeclineCode::ALL.to_vec();
        sorted.sort_by_key(|c| c.0);
        sorted.dedup();
        assert_eq!(sorted.len(), DeclineCode::ALL.len(), "no duplicate values");
    }

    #[test]
    fn display() {
        assert_eq!(
            DeclineCode(0x0303_0008).to_string(),
            "0x03030008 NOUEID (no common user EID configured on both hosts)"
        );
        assert_eq!(DeclineCode(0x1234_5678).to_string(), "0x12345678");
        assert_eq!(DeclineCode::NOSMCDEV.name(), Some("NOSMCDEV"));
    }
}
