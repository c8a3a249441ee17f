//! Stack-wide rendezvous configuration: versions, SMCv2.1 limits, identity fields of the
//! first-contact extension, timers and the policies where RFC 7609 and Linux differ.

use std::time::Duration;

use smc_wire::common::{BufSize, HostName};

use super::ueid::UeidTable;

/// Lowest `max_conns` SMCv2.1 accepts (Linux `SMC_CONN_PER_LGR_MIN`).
pub const MIN_CONNS_PER_LGR: u8 = 16;
/// Highest `max_conns` (Linux `SMC_CONN_PER_LGR_MAX`).
pub const MAX_CONNS_PER_LGR: u8 = 255;
/// Lowest `max_links` (Linux `SMC_LINKS_ADD_LNK_MIN`).
pub const MIN_LINKS_PER_LGR: u8 = 1;
/// Highest `max_links` a Linux client accepts in an Accept (`SMC_LINKS_ADD_LNK_MAX`).
pub const LINUX_MAX_LINKS_PER_LGR: u8 = 2;
/// The SMCv2 release we implement: 1 = v2.1 (Linux `SMC_RELEASE`).
pub const RELEASE_V2_1: u8 = 1;
/// OS type "Linux" in the first-contact extension and the v2 Decline.
pub const OS_TYPE_LINUX: u8 = 2;

/// How a client lays out a Proposal that offers SMC-Rv1 only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ProposalLayout {
    /// What every current Linux sends: header version 2, the 40-byte SMC-D/v2 area and
    /// `iparea_offset` 40, `typev2` = none (linux-smc.md §1.3). Linux and RFC-conformant
    /// servers (which must honour `iparea_offset`, RFC 7609 A.2.2) both accept it.
    #[default]
    Linux,
    /// RFC 7609 A.2.2 literally: header version 1, `iparea_offset` 0 (52 bytes for IPv4).
    Rfc7609,
}

/// What a peer does when its wait for the first link's CONFIRM LINK ends without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FirstLinkTimeout {
    /// RFC 7609 C.7: break the TCP connection (RST) and clean up the link.
    #[default]
    Reset,
    /// Linux (`smcr_*_conf_first_link`): wait [`ClcConfig::decline_grace`] more for a
    /// Decline from the peer, then Decline with TIMEOUT_CL and fall back — but only while
    /// this side may still Decline (its own CONFIRM LINK not yet sent, RFC 7609 C.2);
    /// otherwise reset.
    DeclineAfterGrace,
}

/// What a first-contact peer does when no ADD LINK outcome arrives after the first link
/// came up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AddLinkTimeout {
    /// Linux (`smcr_clnt_conf_first_link`): wait [`ClcConfig::decline_grace`] more for a
    /// Decline, then carry on with one link.
    #[default]
    ContinueSingleLink,
    /// RFC 7609 C.7.1 (CHECKLIST AMB-20 for no reply at all): reset the TCP connection.
    Reset,
}

/// SMC-Rv2 settings (IBM "SMC Version 2" + v2.1 as implemented by Linux).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V2Config {
    /// User EIDs; an empty table disables SMC-Rv2 on both roles (a client does not offer
    /// it, a server declines it), as in Linux.
    pub ueids: UeidTable,
    /// SMCv2 release offered / accepted at most (1 = v2.1).
    pub release: u8,
    /// Connections per link group we allow (Linux `net.smc.smcr_max_conns_per_lgr`).
    pub max_conns: u8,
    /// Links per link group we allow (Linux `net.smc.smcr_max_links_per_lgr`).
    pub max_links: u8,
    /// Feature mask offered (Linux `SMC_FEATURE_MASK` = 0x0001, emulated ISM).
    pub feature_mask: u16,
}

impl Default for V2Config {
    fn default() -> Self {
        V2Config {
            ueids: UeidTable::new(),
            release: RELEASE_V2_1,
            max_conns: MAX_CONNS_PER_LGR,
            max_links: LINUX_MAX_LINKS_PER_LGR,
            feature_mask: 0x0001,
        }
    }
}

/// Stack-wide rendezvous configuration (one per stack; machines copy what they need).
#[derive(Clone, Debug)]
pub struct ClcConfig {
    /// Offer (client) / accept (server) SMC-Rv1 (RFC 7609).
    pub v1: bool,
    /// Offer / accept SMC-Rv2 (also needs UEIDs in [`V2Config::ueids`]).
    pub v2: bool,
    /// SMC-Rv2 settings.
    pub v2_config: V2Config,
    /// Layout of a v1-only Proposal.
    pub proposal_layout: ProposalLayout,
    /// Host name for the first-contact extension (blank-padded; Linux: `uname -n`).
    pub hostname: HostName,
    /// OS type for the first-contact extension and v2 Declines (4 bits; 2 = Linux).
    pub os_type: u8,
    /// Largest compressed RMBE size code accepted from the peer (CHECKLIST AMB-09, I-05):
    /// [`BufSize::LINUX_MAX_CODE`] (15, 512 MiB, Linux ≥ 6.11) or
    /// [`BufSize::RFC_MAX_CODE`] (5, 512 KiB). Larger codes are declined as a reserved
    /// enumerated value.
    pub max_peer_rmbe_code: u8,
    /// Wait for each expected CLC message (RFC 7609 C.5; Linux `CLC_WAIT_TIME` 6 s).
    /// (Every wait is capped at one hour.)
    /// Expiry resets the TCP connection: no fallback.
    pub clc_timeout: Duration,
    /// Bound on a CONFIRM RKEY exchange the machine asked for (the llc machine has its
    /// own 2 s timer; this one only guarantees the rendezvous never hangs).
    pub rkey_timeout: Duration,
    /// Server: wait for the runtime's same-host exchange ([`super::ServerSameHost::Later`],
    /// the Unix-socket exchange with the client's stack, which runs off the event
    /// thread); on expiry the offer is not taken and the rendezvous goes on with SMC-R.
    pub same_host_timeout: Duration,
    /// Client: wait for the server's CONFIRM LINK after the Confirm (Linux 4 s,
    /// 2 × `SMC_LLC_WAIT_TIME`).
    pub client_confirm_link_timeout: Duration,
    /// Server: wait for the client's CONFIRM LINK response after the Confirm was
    /// processed (Linux 2 s, `SMC_LLC_WAIT_TIME`).
    pub server_confirm_link_timeout: Duration,
    /// Wait for the outcome of the ADD LINK attempt after the first link came up (Linux
    /// 2 s on the client).
    pub add_link_timeout: Duration,
    /// Extra wait for a peer's Decline after an LLC wait expired (Linux
    /// `CLC_WAIT_TIME_SHORT`, 1 s).
    pub decline_grace: Duration,
    /// CONFIRM LINK wait expiry policy.
    pub first_link_timeout: FirstLinkTimeout,
    /// ADD LINK wait expiry policy.
    pub add_link_timeout_action: AddLinkTimeout,
}

impl Default for ClcConfig {
    fn default() -> Self {
        ClcConfig {
            v1: true,
            v2: true,
            v2_config: V2Config::default(),
            proposal_layout: ProposalLayout::Linux,
            hostname: HostName::default(),
            os_type: OS_TYPE_LINUX,
            max_peer_rmbe_code: BufSize::LINUX_MAX_CODE,
            clc_timeout: Duration::from_secs(6),
            rkey_timeout: Duration::from_secs(3),
            same_host_timeout: Duration::from_secs(1),
            client_confirm_link_timeout: Duration::from_secs(4),
            server_confirm_link_timeout: Duration::from_secs(2),
            add_link_timeout: Duration::from_secs(2),
            decline_grace: Duration::from_secs(1),
            first_link_timeout: FirstLinkTimeout::Reset,
            add_link_timeout_action: AddLinkTimeout::ContinueSingleLink,
        }
    }
}

impl ClcConfig {
    /// Whether SMC-Rv2 can be offered or accepted at all.
    pub fn v2_usable(&self) -> bool {
        self.v2 && !self.v2_config.ueids.is_empty()
    }

    /// The longest time any one rendezvous can take from its start until it ends in
    /// `Smc`, `Fallback` or `Reset`, whatever the peer and the runtime do (sum of every
    /// wait a role can go through).
    pub fn max_rendezvous_time(&self) -> Duration {
        let cap = |d: Duration| d.min(super::core::MAX_WAIT);
        let llc = cap(self.client_confirm_link_timeout).max(cap(self.server_confirm_link_timeout));
        cap(self.clc_timeout)
            .saturating_mul(2)
            .saturating_add(cap(self.rkey_timeout))
            .saturating_add(cap(self.same_host_timeout))
            .saturating_add(llc)
            .saturating_add(cap(self.add_link_timeout))
            .saturating_add(cap(self.decline_grace).saturating_mul(2))
    }
}
