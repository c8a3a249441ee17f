//! `smc decode FILE`: one line per SMC message found in a pcap/pcapng capture.
//!
//! Lines look like `TIME FRAME SRC → DST KIND fields…`, with TIME relative to the first
//! frame. Decline reasons are explained in words. Malformed messages are reported with the
//! frame number, the field and the receiver action RFC 7609 Appendix C prescribes, and
//! decoding continues; only an unreadable file is an error.

use crate::capture::Capture;
use crate::extract::{Extractor, Found, Origin};
use anyhow::Result;
use smc_wire::cdc::{CdcRepr, ConnStateFlags, ProducerFlags};
use smc_wire::clc::{
    AcceptConfirmRepr, ClcMessage, DeclineRepr, OtherPathRepr, ProposalBody, ProposalRepr,
};
use smc_wire::common::{BufSize, ByteOrder};
use smc_wire::llc::{Dialect, LlcFormat, LlcMessage};
use smc_wire::{ControlMessage, Layer};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `smc decode`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Capture file (pcap or pcapng; Ethernet, raw IP or Linux SLL).
    pub file: PathBuf,
    /// Layout of v1 LLC messages where RFC 7609 and Linux differ.
    #[arg(long, value_enum, default_value_t = DialectArg::Linux)]
    pub dialect: DialectArg,
    /// Byte order of the SMC-Rv2 LLC length and ADD LINK num_rkeys (x86 Linux: le).
    #[arg(long, value_enum, default_value_t = OrderArg::Le)]
    pub v2_byte_order: OrderArg,
}

/// `--dialect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DialectArg {
    /// Linux/z/OS as deployed.
    Linux,
    /// The RFC 7609 figures.
    Rfc,
}

/// `--v2-byte-order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OrderArg {
    /// Little-endian (x86 Linux).
    Le,
    /// Big-endian (s390 Linux).
    Be,
}

impl Args {
    /// The LLC format the arguments select.
    pub fn format(&self) -> LlcFormat {
        LlcFormat {
            dialect: match self.dialect {
                DialectArg::Linux => Dialect::Linux,
                DialectArg::Rfc => Dialect::Rfc7609,
            },
            v2_byte_order: match self.v2_byte_order {
                OrderArg::Le => ByteOrder::Little,
                OrderArg::Be => ByteOrder::Big,
            },
        }
    }
}

/// Whether a SEND payload looks like SMC-R (used for SENDs on QPs not yet known to carry
/// SMC-R): at least 44 bytes and a length field that says 44 (v1 LLC, CDC) or a plausible
/// SMC-Rv2 length — the same idea as Wireshark's `smcr_infiniband` heuristic.
pub fn looks_like_smc(payload: &[u8], fmt: LlcFormat) -> bool {
    if payload.len() < smc_wire::llc::LLC_LEN {
        return false;
    }
    if payload[1] as usize == smc_wire::llc::LLC_LEN && payload[0] & 0xF0 != 0x20 {
        return true;
    }
    let v2_len = usize::from(match fmt.v2_byte_order {
        ByteOrder::Little => u16::from_le_bytes([payload[1], payload[2]]),
        ByteOrder::Big => u16::from_be_bytes([payload[1], payload[2]]),
    });
    payload[0] & 0xF0 == 0x20 && v2_len == payload.len()
}

/// Remembers which (receiver address, QP) pairs carry SMC-R, from CLC Accept/Confirm and from
/// SENDs that parsed, so that damaged messages on them are reported rather than skipped.
#[derive(Default)]
struct SmcQps(std::collections::HashSet<(std::net::IpAddr, u32)>);

/// What a decode run saw.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Frames read.
    pub frames: u64,
    /// Messages decoded, by kind (e.g. "CLC Proposal", "LLC DELETE RKEY v2 request", "CDC").
    pub counts: BTreeMap<String, usize>,
    /// Malformed messages reported.
    pub malformed: usize,
    /// RoCEv2 SENDs skipped because they are not SMC-R (unknown QP, no SMC-R shape).
    pub non_smc_sends: usize,
    /// The capture ended in a damaged record (reported, decoding stopped there).
    pub damaged: Option<String>,
}

impl Summary {
    /// Total messages decoded.
    pub fn messages(&self) -> usize {
        self.counts.values().sum()
    }
}

/// `smc decode`: decodes to stdout, prints a summary to stderr; fails only if the file cannot
/// be read at all.
pub fn command(args: &Args) -> ExitCode {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let res = run(args, &mut out);
    let _ = out.flush();
    match res {
        Ok(s) => {
            let kinds: Vec<String> = s.counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
            eprintln!(
                "smc decode: {} frames, {} SMC messages, {} malformed, {} non-SMC SENDs{}",
                s.frames,
                s.messages(),
                s.malformed,
                s.non_smc_sends,
                if s.damaged.is_some() {
                    ", capture damaged"
                } else {
                    ""
                }
            );
            if !kinds.is_empty() {
                eprintln!("  {}", kinds.join("; "));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("smc decode: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the decoder, writing one line per message to `out`.
pub fn run(args: &Args, out: &mut dyn Write) -> Result<Summary> {
    let mut cap = Capture::open(&args.file)?;
    let fmt = args.format();
    let mut ex = Extractor::new();
    let mut summary = Summary::default();
    let mut t0: Option<Duration> = None;
    let mut qps = SmcQps::default();
    while let Some(frame) = cap.next_frame() {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                writeln!(out, "error: {e:#}")?;
                summary.damaged = Some(format!("{e:#}"));
                break;
            }
        };
        summary.frames += 1;
        let t0 = *t0.get_or_insert(frame.time);
        for found in ex.push(&frame) {
            if let Found::Send {
                origin,
                dest_qp,
                payload,
            } = &found
            {
                let key = (origin.dst.ip(), *dest_qp);
                if !qps.0.contains(&key) {
                    if !looks_like_smc(payload, fmt) {
                        summary.non_smc_sends += 1;
                        continue;
                    }
                    if ControlMessage::parse(payload, fmt).is_ok() {
                        qps.0.insert(key);
                    }
                }
            }
            if let Found::Clc { origin, bytes } = &found {
                if let Ok(ClcMessage::Accept(a) | ClcMessage::Confirm(a)) = ClcMessage::parse(bytes)
                {
                    // The sender of an Accept/Confirm owns this QP: SENDs to it are SMC-R.
                    qps.0.insert((origin.src.ip(), a.qpn.get()));
                }
            }
            let (kind, text) = describe(&found, fmt);
            let o = found.origin();
            writeln!(out, "{} {text}", prefix(o, t0))?;
            match kind {
                Some(k) => *summary.counts.entry(k).or_default() += 1,
                None => summary.malformed += 1,
            }
        }
    }
    Ok(summary)
}

fn prefix(o: &Origin, t0: Duration) -> String {
    let t = o.time.saturating_sub(t0).as_secs_f64();
    let (s, d) = if o.src.port() == 0 && o.dst.port() == 0 {
        (o.src.ip().to_string(), o.dst.ip().to_string())
    } else {
        (o.src.to_string(), o.dst.to_string())
    };
    format!("{t:11.6} {:>6} {s} → {d}", o.frame)
}

/// The summary kind (None for malformed) and the text of one line.
pub fn describe(found: &Found, fmt: LlcFormat) -> (Option<String>, String) {
    match found {
        Found::TcpOption { syn_ack, .. } => {
            let k = if *syn_ack { "SYN-ACK" } else { "SYN" };
            (
                Some(format!("TCP option ({k})")),
                format!("TCP {k} SMC-R option (kind 254, ExID E2D4C3D9)"),
            )
        }
        Found::Malformed { layer, why, .. } => (None, format!("MALFORMED {layer}: {why}")),
        Found::Clc { bytes, .. } => match ClcMessage::parse(bytes) {
            Ok(m) => {
                let (k, t) = clc_line(&m);
                (Some(k), t)
            }
            Err(e) => (
                None,
                format!(
                    "MALFORMED CLC ({} bytes): {e} → {:?}",
                    bytes.len(),
                    e.action(Layer::Clc)
                ),
            ),
        },
        Found::Send {
            dest_qp, payload, ..
        } => match ControlMessage::parse(payload, fmt) {
            Ok(ControlMessage::Cdc(c)) => (
                Some("CDC".into()),
                format!("QP {dest_qp:#08x} {}", cdc_line(&c)),
            ),
            Ok(ControlMessage::Llc(m)) => {
                let (k, t) = llc_line(&m);
                (Some(k), format!("QP {dest_qp:#08x} {t}"))
            }
            Err(e) => {
                let layer = ControlMessage::layer_of(payload);
                (
                    None,
                    format!(
                        "QP {dest_qp:#08x} MALFORMED {} ({} bytes): {e} → {:?}",
                        if layer == Layer::Cdc { "CDC" } else { "LLC" },
                        payload.len(),
                        e.action(layer)
                    ),
                )
            }
        },
    }
}

fn size(b: BufSize) -> String {
    let n = b.bytes();
    if n >= 1 << 20 {
        format!("{}MiB", n >> 20)
    } else {
        format!("{}KiB", n >> 10)
    }
}

fn os_name(t: u8) -> &'static str {
    match t {
        1 => "z/OS",
        2 => "Linux",
        3 => "AIX",
        _ => "unknown-OS",
    }
}

fn clc_line(m: &ClcMessage) -> (String, String) {
    match m {
        ClcMessage::Proposal(p) => ("CLC Proposal".into(), proposal_line(p)),
        ClcMessage::Accept(a) => ("CLC Accept".into(), accept_line("Accept", a)),
        ClcMessage::Confirm(a) => ("CLC Confirm".into(), accept_line("Confirm", a)),
        ClcMessage::Decline(d) => ("CLC Decline".into(), decline_line(d)),
        ClcMessage::OtherPath(o) => (
            format!("CLC {} (SMC-D)", o.msg_type().name()),
            other_line(o),
        ),
        ClcMessage::SameHostAccept(a) => (
            "CLC same-host Accept".into(),
            format!(
                "CLC same-host Accept (smc-rs, type 0x81) stack={:016x} nonce={:016x}",
                a.stack_id, a.nonce
            ),
        ),
    }
}

fn proposal_line(p: &ProposalRepr) -> String {
    let offers = if p.version >= 2 {
        format!("offers v1={} v2={}", p.typev1.name(), p.typev2.name())
    } else {
        format!("offers {}", p.typev1.name())
    };
    let mut s = format!(
        "CLC Proposal v{} {offers} peer={} gid={} mac={}",
        p.version, p.peer_id, p.gid, p.mac
    );
    let (ip, v2) = match &p.body {
        ProposalBody::V1 { ip, .. } => (Some(ip), None),
        ProposalBody::V2 { ip, v2, .. } => (ip.as_ref(), v2.as_ref()),
    };
    if let Some(ip) = ip {
        if ip.ipv6_prefixes.is_empty() {
            let _ = write!(s, " subnet={}/{}", ip.subnet, ip.prefix_len);
        } else {
            let list: Vec<String> = ip
                .ipv6_prefixes
                .iter()
                .map(|p| format!("{}/{}", p.prefix, p.len))
                .collect();
            let _ = write!(s, " prefixes=[{}]", list.join(","));
        }
    }
    let smcd = match &p.body {
        ProposalBody::V1 {
            area: smc_wire::clc::V1Area::Smcd(a),
            ..
        }
        | ProposalBody::V2 { smcd: a, .. } => Some(a),
        _ => None,
    };
    if let Some(o) = smcd.and_then(smc_wire::clc::SameHostOffer::from_smcd_area) {
        let _ = write!(
            s,
            " same-host-offer(stack={:016x} nonce={:016x})",
            o.stack_id, o.nonce
        );
    }
    if let Some(v2) = v2 {
        let eids: Vec<String> = v2.eids.iter().map(|e| e.to_string()).collect();
        let _ = write!(
            s,
            " eids=[{}] roce_gid={} release={} max_conns={} max_links={} features={:#06x}",
            eids.join(","),
            v2.roce_gid,
            v2.release,
            v2.max_conns,
            v2.max_links,
            v2.feature_mask
        );
        if v2.seid {
            s.push_str(" seid");
        }
        if let Some(d) = &v2.smcd {
            let _ = write!(
                s,
                " smcd(seid={} ism_gids={})",
                d.system_eid,
                d.ism_gids.len()
            );
        }
    }
    s
}

fn accept_line(name: &str, a: &AcceptConfirmRepr) -> String {
    let mtu = match a.mtu() {
        Ok(m) => m.bytes().to_string(),
        Err(_) => format!("reserved({})", a.qp_mtu),
    };
    let mut s = format!(
        "CLC {name} v{}{} peer={} gid={} mac={} qpn={} rkey={:#x} rmbe_idx={} token={:#x} rmbe={} mtu={} vaddr={:#x} psn={}",
        a.version,
        if a.first_contact { " first-contact" } else { "" },
        a.peer_id,
        a.gid,
        a.mac,
        a.qpn,
        a.rmb_rkey,
        a.rmbe_idx,
        a.rmbe_alert_token,
        size(a.rmbe_size),
        mtu,
        a.rmb_vaddr,
        a.psn
    );
    if let Some(v2) = &a.v2 {
        let _ = write!(s, " eid={}", v2.eid);
        if let Some(f) = &v2.fce {
            let _ = write!(
                s,
                " host={} os={} release={}{} max_conns={} max_links={} features={:#06x}",
                f.hostname,
                os_name(f.os_type),
                f.release,
                if f.v2_direct { " direct" } else { " indirect" },
                f.max_conns,
                f.max_links,
                f.feature_mask
            );
        }
        if let Some(g) = &v2.gid_list {
            let list: Vec<String> = g.iter().map(|g| g.to_string()).collect();
            let _ = write!(s, " gids=[{}]", list.join(","));
        }
    }
    s
}

fn decline_line(d: &DeclineRepr) -> String {
    let reason = match (d.diagnosis.name(), d.diagnosis.explain()) {
        (Some(n), Some(e)) => format!("{:#010x} {n}: {e}", d.diagnosis.0),
        _ => format!("{:#010x} (unknown code)", d.diagnosis.0),
    };
    let mut s = format!(
        "CLC Decline v{} peer={} reason={reason}",
        d.version, d.peer_id
    );
    if d.out_of_sync {
        s.push_str(" out-of-sync");
    }
    if d.os_type != 0 {
        let _ = write!(s, " os={}", os_name(d.os_type));
    }
    s
}

fn other_line(o: &OtherPathRepr) -> String {
    format!(
        "CLC {} (SMC-D, not SMC-R) v{}{} ism_gid={:#018x} dmb_token={:#018x} dmbe={} link_id={:#x}",
        o.msg_type().name(),
        o.version(),
        if o.first_contact() {
            " first-contact"
        } else {
            ""
        },
        o.ism_gid(),
        o.dmb_token(),
        size(o.dmbe_size()),
        o.link_id()
    )
}

fn llc_line(m: &LlcMessage) -> (String, String) {
    let kind = format!(
        "LLC {}{} {}",
        m.msg_type().name(),
        if m.is_v2() { " v2" } else { "" },
        if m.is_response() {
            "response"
        } else {
            "request"
        }
    );
    let detail = match m {
        LlcMessage::ConfirmLink(c) => format!(
            "mac={} gid={} qpn={} link={} link_uid={:#010x} max_links={} max_conns={}{}",
            c.mac,
            c.gid,
            c.qpn,
            c.link_num,
            c.link_uid,
            c.max_links,
            c.max_conns,
            if c.no_rmbe_eyecatcher {
                " no-rmbe-eyecatcher"
            } else {
                ""
            }
        ),
        LlcMessage::AddLink(a) => {
            let mut s = format!(
                "{}mac={} gid={} qpn={} link={} mtu={} psn={}",
                if a.reject && !a.v2 {
                    format!("REJECT(reason {}) ", a.reject_reason)
                } else if a.reject {
                    "REJECT ".to_string()
                } else {
                    String::new()
                },
                a.mac,
                a.gid,
                a.qpn,
                a.link_num,
                a.mtu().map_or_else(
                    |_| format!("reserved({})", a.qp_mtu),
                    |m| m.bytes().to_string()
                ),
                a.psn
            );
            if let Some(e) = &a.ext {
                let rts: Vec<String> = e
                    .rtokens
                    .iter()
                    .map(|r| {
                        format!(
                            "{:#x}->{:#x}@{:#x}",
                            r.rmb_key, r.rmb_key_new, r.rmb_vaddr_new
                        )
                    })
                    .collect();
                let _ = write!(
                    s,
                    " target_gid={}{} rtokens=[{}]",
                    e.client_target_gid,
                    if e.v2_direct { " direct" } else { "" },
                    rts.join(",")
                );
            }
            s
        }
        LlcMessage::AddLinkCont(c) => format!(
            "link={} num_rkeys={} rtokens=[{:#x}->{:#x}@{:#x},{:#x}->{:#x}@{:#x}]",
            c.link_num,
            c.num_rkeys,
            c.rtokens[0].rmb_key,
            c.rtokens[0].rmb_key_new,
            c.rtokens[0].rmb_vaddr_new,
            c.rtokens[1].rmb_key,
            c.rtokens[1].rmb_key_new,
            c.rtokens[1].rmb_vaddr_new
        ),
        LlcMessage::DeleteLink(d) => format!(
            "link={} reason={}{}{}",
            d.link_num,
            d.reason,
            if d.all { " all" } else { "" },
            if d.orderly { " orderly" } else { "" }
        ),
        LlcMessage::ReqAddLink(r) => {
            let g: Vec<String> = r.gids.iter().map(|g| g.to_string()).collect();
            let mut s = format!("gids=[{}]", g.join(","));
            if r.other_flags != 0 {
                let _ = write!(s, " flags={:#04x}", r.other_flags);
            }
            s
        }
        LlcMessage::ConfirmRkey(c) => {
            let mut s = format!(
                "{}{}num_tokens={} rkey={:#x} vaddr={:#x}",
                if c.negative { "NEGATIVE " } else { "" },
                if c.retry { "RETRY " } else { "" },
                c.num_tokens,
                c.rkey,
                c.vaddr
            );
            for o in c.others.iter().take(usize::from(c.num_tokens).min(2)) {
                let _ = write!(s, " link{}:{:#x}@{:#x}", o.link_num, o.rkey, o.vaddr);
            }
            s
        }
        LlcMessage::ConfirmRkeyCont(c) => {
            let mut s = format!(
                "{}num_left={}",
                if c.negative { "NEGATIVE " } else { "" },
                c.num_left
            );
            for o in c.others.iter().take(usize::from(c.num_left).min(3)) {
                let _ = write!(s, " link{}:{:#x}@{:#x}", o.link_num, o.rkey, o.vaddr);
            }
            s
        }
        LlcMessage::DeleteRkey(d) => {
            let k: Vec<String> = d.rkeys().iter().map(|k| format!("{k:#x}")).collect();
            format!(
                "{}rkeys=[{}] err_mask={:#04x}",
                if d.negative { "NEGATIVE " } else { "" },
                k.join(","),
                d.err_mask
            )
        }
        LlcMessage::DeleteRkeyV2(d) => {
            let k: Vec<String> = d.rkeys.iter().map(|k| format!("{k:#x}")).collect();
            format!(
                "{}rkeys=[{}] invalid={}",
                if d.negative { "NEGATIVE " } else { "" },
                k.join(","),
                d.num_inval_rkeys
            )
        }
        LlcMessage::TestLink(t) => {
            let hex: String = t.user_data.iter().map(|b| format!("{b:02x}")).collect();
            format!("user_data={hex}")
        }
    };
    (kind.clone(), format!("{kind} {detail}"))
}

fn cdc_line(c: &CdcRepr) -> String {
    let mut flags = Vec::new();
    for (f, n) in [
        (ProducerFlags::WRITE_BLOCKED, "write-blocked"),
        (ProducerFlags::URG_PENDING, "urg-pending"),
        (ProducerFlags::URG_PRESENT, "urg-present"),
        (ProducerFlags::CONS_UPDATE_REQ, "cons-update-req"),
        (ProducerFlags::FAILOVER_VALIDATION, "failover-validation"),
    ] {
        if c.prod_flags.contains(f) {
            flags.push(n);
        }
    }
    for (f, n) in [
        (ConnStateFlags::PEER_DONE_WRITING, "done-writing"),
        (ConnStateFlags::PEER_CONN_CLOSED, "closed"),
        (ConnStateFlags::PEER_CONN_ABORT, "abort"),
    ] {
        if c.conn_flags.contains(f) {
            flags.push(n);
        }
    }
    let mut s = format!(
        "CDC seq={} token={:#x} prod={}:{:#x} cons={}:{:#x}",
        c.seqno, c.token, c.prod.wrap, c.prod.count, c.cons.wrap, c.cons.count
    );
    if !flags.is_empty() {
        let _ = write!(s, " flags={}", flags.join(","));
    }
    s
}
