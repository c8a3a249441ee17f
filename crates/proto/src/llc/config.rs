//! How a link group speaks LLC: its timers (RFC 7609 C.7) and configuration.

use super::*;

/// Timer values (RFC 7609 C.7; Linux values from linux-smc.md §2.6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlcTimers {
    /// Server: wait for the first CONFIRM LINK response (Linux: 2 s).
    pub first_confirm_server: Duration,
    /// Client: wait for the first CONFIRM LINK request (Linux: 4 s).
    pub first_confirm_client: Duration,
    /// Any other reply (Linux `SMC_LLC_WAIT_TIME`: 2 s).
    pub reply: Duration,
    /// CONFIRM LINK on an added link (Linux `SMC_LLC_WAIT_FIRST_TIME`: 5 s).
    pub new_link_confirm: Duration,
    /// Client: wait for the server's ADD LINK after first contact (Linux: 2 s).
    pub add_link_wait: Duration,
    /// Client: wait for the server's DELETE LINK after asking for one (CDL-5). Longer than
    /// any exchange the server may finish first (it queues the request, §3.5.5.3). Server:
    /// wait for the DELETE LINK response of a single link (SDL-6), for the same reason.
    pub delete_link_wait: Duration,
    /// Server: retry a failed link addition after this long (C.8); `None`: only on a
    /// stimulus (client request, new device).
    pub add_link_retry: Option<Duration>,
    /// Send TEST LINK after a link received nothing this long (Linux `smcr_testlink_time`
    /// 30 s); `None` disables keepalive.
    pub test_link_interval: Option<Duration>,
    /// Keep an idle link group this long after [`LinkGroup::set_idle`] (Linux: server 600 s,
    /// client 610 s); `None` keeps it.
    pub linger: Option<Duration>,
    /// A peer's TCP FIN on a connection without its SMC-R close flags yet asks for a TEST
    /// LINK unless the link hears from the peer within this long
    /// ([`LinkGroup::probe_link_deferred`]; smc-rs, Linux does not probe).
    pub fin_probe_grace: Duration,
}

impl LlcTimers {
    /// Linux's values for a role.
    pub fn linux(role: Role) -> LlcTimers {
        LlcTimers {
            first_confirm_server: Duration::from_secs(2),
            first_confirm_client: Duration::from_secs(4),
            reply: Duration::from_secs(2),
            new_link_confirm: Duration::from_secs(5),
            add_link_wait: Duration::from_secs(2),
            delete_link_wait: Duration::from_secs(10),
            add_link_retry: Some(Duration::from_secs(60)),
            test_link_interval: Some(Duration::from_secs(30)),
            linger: Some(Duration::from_secs(match role {
                Role::Server => 600,
                Role::Client => 610,
            })),
            // The close flags a FIN overtook come within microseconds unless the RNIC
            // retransmits; a process that died is found this much later.
            fin_probe_grace: Duration::from_millis(100),
        }
    }
}

/// How a link group speaks LLC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlcConfig {
    /// Our role.
    pub role: Role,
    /// SMC-R version.
    pub version: Version,
    /// Wire layout and v2 byte order.
    pub format: LlcFormat,
    /// RMBEs start with the RFC's 4-byte eye catcher. `false` is Linux's layout, announced
    /// with CONFIRM LINK flag 0x03 (Linux requires it; needs the Linux dialect or v2).
    pub rmbe_eyecatcher: bool,
    /// Most symmetric links (RFC 7609 §2.2.2: 2..=8; v2.1 may negotiate 1). The server
    /// offers it in CONFIRM LINK; the client answers with the smaller of both.
    pub max_links: u8,
    /// v2.1 / Linux dialect: most connections per link group (CONFIRM LINK byte 35).
    pub max_conns: u8,
    /// Link-group identifier: our link user IDs are `lgr_id << 8 | link number` (as Linux).
    pub lgr_id: u32,
    /// v2: the peer is reachable without a gateway (ADD LINK v2 extension flag).
    pub v2_direct: bool,
    /// Linux behaviour where RFC 7609 and Linux differ:
    /// * a client CONFIRM RKEY during the server's ADD/DELETE LINK is answered positively
    ///   (RFC §3.5.5.3.1: negatively, with the retry flag);
    /// * on first contact, an unanswered ADD LINK or a missing ADD LINK leaves a one-link
    ///   link group (RFC C.7.1: reset), AMB-20;
    /// * a missing RToken for a link in an ADD LINK v2 extension is logged, not fatal;
    /// * TEST LINK user data is all zero (RFC: REC nonce);
    /// * `max_links` is capped at 2 (Linux: `SMC_LINKS_ADD_LNK_MAX`), so no CONFIRM RKEY
    ///   CONTINUATION is ever needed.
    pub linux_compat: bool,
    /// Negative CONFIRM RKEY responses with the retry flag retried automatically.
    pub rkey_retries: u8,
    /// Timer values.
    pub timers: LlcTimers,
}

impl LlcConfig {
    /// What Linux does and expects: its layout, x86 byte order, no RMBE eye catcher,
    /// `max_links` 2, `max_conns` 255 (v2), Linux timers.
    pub fn linux(role: Role, version: Version) -> LlcConfig {
        LlcConfig {
            role,
            version,
            format: LlcFormat::LINUX_X86,
            rmbe_eyecatcher: false,
            max_links: 2,
            max_conns: if version == Version::V2 { 255 } else { 0 },
            lgr_id: 1,
            v2_direct: true,
            linux_compat: true,
            rkey_retries: 3,
            timers: LlcTimers::linux(role),
        }
    }

    /// RFC 7609 as written: v1, the figures' layout, RMBE eye catcher, up to 4 links.
    pub fn rfc(role: Role) -> LlcConfig {
        LlcConfig {
            role,
            version: Version::V1,
            format: LlcFormat::RFC7609,
            rmbe_eyecatcher: true,
            max_links: 4,
            max_conns: 0,
            lgr_id: 1,
            v2_direct: true,
            linux_compat: false,
            rkey_retries: 3,
            timers: LlcTimers::linux(role),
        }
    }

    /// Checks the combination.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let linux_layout = self.version == Version::V2 || self.format.dialect == Dialect::Linux;
        if !self.rmbe_eyecatcher && !linux_layout {
            return Err(ConfigError::EyecatcherFlagNeedsLinuxLayout);
        }
        let min = if self.version == Version::V2 { 1 } else { 2 };
        if !(min..=8).contains(&self.max_links) {
            return Err(ConfigError::MaxLinks(self.max_links));
        }
        if self.lgr_id > 0x00FF_FFFF {
            return Err(ConfigError::LgrId(self.lgr_id));
        }
        if self.max_conns != 0 && !linux_layout {
            return Err(ConfigError::MaxConnsNeedsLinuxLayout);
        }
        Ok(())
    }

    pub(super) fn linux_layout(&self) -> bool {
        self.version == Version::V2 || self.format.dialect == Dialect::Linux
    }
}

/// A configuration the machine cannot run with.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ConfigError {
    /// Flag 0x03 exists only in the Linux CONFIRM LINK layout.
    #[error("an RMBE without eye catcher needs the Linux dialect or SMC-Rv2")]
    EyecatcherFlagNeedsLinuxLayout,
    /// `max_conns` exists only in the Linux CONFIRM LINK layout.
    #[error("max_conns needs the Linux dialect or SMC-Rv2")]
    MaxConnsNeedsLinuxLayout,
    /// RFC 7609 §2.2.2: 2..=8 (v2.1: 1..=8).
    #[error("max_links {0} out of range")]
    MaxLinks(u8),
    /// Link user IDs carry 24 bits of it.
    #[error("lgr_id {0:#x} does not fit in 24 bits")]
    LgrId(u32),
    /// The first link's device is not in the device list.
    #[error("first link device {0:?} is not among the devices")]
    UnknownDevice(DeviceId),
}
