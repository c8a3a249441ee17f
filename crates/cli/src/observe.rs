//! `smc ss`, `smc lgr`, `smc stats`, `smc chk`: the host's SMC sockets, link groups and
//! counters, gathered from every smc-rs process of this network namespace (each serves
//! its state on `smc-rs/<pid>`, `smc::observe`), and a connection check like smc_chk.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};
use serde_json::{json, Map, Value};
use smc::observe;

/// `smc ss`.
#[derive(ClapArgs, Debug)]
pub struct SsArgs {
    /// All sockets: listeners and connections.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Listening sockets only.
    #[arg(short = 'l', long = "listening")]
    pub listening: bool,
    /// JSON (an array of sockets) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `smc lgr`.
#[derive(ClapArgs, Debug)]
pub struct LgrArgs {
    /// JSON (an array of link groups) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `smc stats`.
#[derive(ClapArgs, Debug)]
pub struct StatsArgs {
    /// `reset`: zero the cumulative counters of every process (then print them).
    #[command(subcommand)]
    pub action: Option<StatsAction>,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The Prometheus text exposition format.
    #[arg(long, conflicts_with = "json")]
    pub prometheus: bool,
    /// Only these processes (repeatable), e.g. the one server a test drives.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
}

/// What `smc stats` does besides printing.
#[derive(Subcommand, Debug, Clone, Copy)]
pub enum StatsAction {
    /// Zero the cumulative counters (connections, fallbacks, LLC messages...) of every process.
    Reset,
}

/// `smc chk`.
#[derive(ClapArgs, Debug)]
pub struct ChkArgs {
    /// The server to try, e.g. 10.0.0.2:8000.
    pub target: SocketAddr,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Every publishing process's document (those that do not answer are skipped with a
/// note on stderr).
pub fn gather(request: &str) -> Vec<Value> {
    gather_from(request, &[])
}

/// The documents of the processes `pids` (every publisher when empty).
pub fn gather_from(request: &str, pids: &[u32]) -> Vec<Value> {
    let mut out = Vec::new();
    for pid in observe::publishers() {
        if !pids.is_empty() && !pids.contains(&pid) {
            continue;
        }
        match observe::query(pid, request, QUERY_TIMEOUT) {
            Ok(v) if v.get("error").is_none() => out.push(v),
            Ok(v) => eprintln!("smc: process {pid}: {}", v["error"]),
            Err(e) => eprintln!("smc: process {pid} did not answer: {e}"),
        }
    }
    out
}

/// The sockets of the documents, flattened (each with pid and process).
pub fn sockets(docs: &[Value], all: bool, listening: bool) -> Vec<Value> {
    let mut v = Vec::new();
    for d in docs {
        let tag = |mut s: Value| {
            s["pid"] = d["pid"].clone();
            s["process"] = d["process"].clone();
            s
        };
        if all || listening {
            for l in d["listeners"].as_array().into_iter().flatten() {
                let mut s = l.clone();
                s["state"] = json!("LISTEN");
                s["mode"] = json!("SMC");
                v.push(tag(s));
            }
        }
        if !listening {
            for key in ["connections", "fallbacks"] {
                for c in d[key].as_array().into_iter().flatten() {
                    v.push(tag(c.clone()));
                }
            }
        }
    }
    v
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The table of `smc ss`.
pub fn ss_table(socks: &[Value]) -> String {
    let mut t = format!(
        "{:<7} {:<15} {:<12} {:<22} {:<22} {:<8} {:<6} {:>10} {:>10}  {}\n",
        "PID", "PROCESS", "STATE", "LOCAL", "PEER", "MODE", "LGR", "SENT", "RECEIVED", "INFO"
    );
    for c in socks {
        let info = if c["mode"] == "TCP" {
            let code = &c["local_code"];
            let mut i = format!("{} {}", s(&code["code"]), s(&code["name"]));
            if let Some(p) = c["peer_code"].as_object() {
                i.push_str(&format!(
                    " (peer {} {})",
                    s(&p["code"].clone()),
                    s(&p["name"].clone())
                ));
            }
            if c["policy"] == true {
                i.push_str(" [policy]");
            }
            format!("{i}: {}", s(&c["reason"]))
        } else {
            c.get("detail").map(s).unwrap_or_default()
        };
        let mut process = s(&c["process"]);
        process.truncate(15);
        t.push_str(&format!(
            "{:<7} {:<15} {:<12} {:<22} {:<22} {:<8} {:<6} {:>10} {:>10}  {}\n",
            s(&c["pid"]),
            process,
            s(&c["state"]),
            s(&c["local"]),
            c.get("peer").map(s).unwrap_or_else(|| "*".into()),
            s(&c["mode"]),
            c.get("lgr").map(s).unwrap_or_else(|| "-".into()),
            c.get("bytes_sent").map(s).unwrap_or_else(|| "-".into()),
            c.get("bytes_received").map(s).unwrap_or_else(|| "-".into()),
            info.trim_end()
        ));
    }
    t
}

pub fn ss(a: &SsArgs) -> ExitCode {
    let socks = sockets(&gather("get"), a.all, a.listening);
    if a.json {
        println!("{}", Value::Array(socks));
    } else {
        print!("{}", ss_table(&socks));
    }
    ExitCode::SUCCESS
}

/// The link groups of the documents (each with pid and process).
pub fn link_groups(docs: &[Value]) -> Vec<Value> {
    let mut v = Vec::new();
    for d in docs {
        for g in d["link_groups"].as_array().into_iter().flatten() {
            let mut g = g.clone();
            g["pid"] = d["pid"].clone();
            g["process"] = d["process"].clone();
            v.push(g);
        }
    }
    v
}

pub fn lgr_text(groups: &[Value]) -> String {
    let mut t = String::new();
    for g in groups {
        t.push_str(&format!(
            "{} (pid {} {}): role {} SMC-Rv{} peer {} state {} conns {} rmbs {} ({} in use)\n",
            s(&g["id"]),
            s(&g["pid"]),
            s(&g["process"]),
            s(&g["role"]),
            s(&g["version"]),
            s(&g["peer"]),
            s(&g["state"]),
            s(&g["conns"]),
            s(&g["rmbs"]),
            s(&g["rmbs_in_use"]),
        ));
        for l in g["links"].as_array().into_iter().flatten() {
            t.push_str(&format!(
                "  link {} {:<9} device {} gid {} qp {:#x} peer qp {} peer gid {}\n",
                s(&l["num"]),
                s(&l["state"]),
                s(&l["device"]),
                s(&l["gid"]),
                l["qpn"].as_u64().unwrap_or(0),
                l["peer_qpn"]
                    .as_u64()
                    .map_or("-".into(), |q| format!("{q:#x}")),
                s(&l["peer_gid"]),
            ));
        }
    }
    t
}

pub fn lgr(a: &LgrArgs) -> ExitCode {
    let groups = link_groups(&gather("get"));
    if a.json {
        println!("{}", Value::Array(groups));
    } else if groups.is_empty() {
        println!("no link groups");
    } else {
        print!("{}", lgr_text(&groups));
    }
    ExitCode::SUCCESS
}

/// The counters of the documents summed (numbers add, fallback reasons merge by code).
pub fn sum_stats(docs: &[Value]) -> Value {
    let mut total = Map::new();
    let mut reasons: std::collections::BTreeMap<String, Value> = Default::default();
    for d in docs {
        let Some(st) = d["stats"].as_object() else {
            continue;
        };
        for (k, v) in st {
            if k == "fallback_reasons" {
                for r in v.as_array().into_iter().flatten() {
                    let code = s(&r["code"]);
                    let e = reasons.entry(code).or_insert_with(|| {
                        let mut r = r.clone();
                        r["count"] = json!(0);
                        r
                    });
                    e["count"] =
                        json!(e["count"].as_u64().unwrap_or(0) + r["count"].as_u64().unwrap_or(0));
                }
            } else if let Some(n) = v.as_u64() {
                let cur = total.get(k).and_then(Value::as_u64).unwrap_or(0);
                total.insert(k.clone(), json!(cur + n));
            } else if let Some(sizes) = v.as_object() {
                // rmb_sizes / sndbuf_sizes: size in bytes → count, merged by size.
                let e = total.entry(k.clone()).or_insert_with(|| json!({}));
                for (size, n) in sizes {
                    let cur = e[size].as_u64().unwrap_or(0);
                    e[size] = json!(cur + n.as_u64().unwrap_or(0));
                }
            }
        }
    }
    total.insert("processes".into(), json!(docs.len()));
    total.insert(
        "fallback_reasons".into(),
        Value::Array(reasons.into_values().collect()),
    );
    Value::Object(total)
}

/// The Prometheus text format of summed counters.
pub fn prometheus(total: &Value) -> String {
    let mut t = String::new();
    if let Some(m) = total.as_object() {
        for (k, v) in m {
            if let Some(n) = v.as_u64() {
                t.push_str(&format!("# TYPE smc_rs_{k} gauge\nsmc_rs_{k} {n}\n"));
            }
        }
        for k in ["rmb_sizes", "sndbuf_sizes"] {
            t.push_str(&format!("# TYPE smc_rs_{k} gauge\n"));
            for (size, n) in m.get(k).and_then(Value::as_object).into_iter().flatten() {
                t.push_str(&format!(
                    "smc_rs_{k}{{bytes=\"{size}\"}} {}\n",
                    n.as_u64().unwrap_or(0)
                ));
            }
        }
        t.push_str("# TYPE smc_rs_fallbacks_by_reason gauge\n");
        for r in m["fallback_reasons"].as_array().into_iter().flatten() {
            t.push_str(&format!(
                "smc_rs_fallbacks_by_reason{{code=\"{}\",name=\"{}\"}} {}\n",
                s(&r["code"]),
                s(&r["name"]),
                r["count"].as_u64().unwrap_or(0)
            ));
        }
    }
    t
}

pub fn stats(a: &StatsArgs) -> ExitCode {
    let request = match a.action {
        Some(StatsAction::Reset) => "reset",
        None => "get",
    };
    let total = sum_stats(&gather_from(request, &a.pids));
    if a.json {
        println!("{total}");
    } else if a.prometheus {
        print!("{}", prometheus(&total));
    } else {
        let m = total.as_object().cloned().unwrap_or_default();
        for (k, v) in &m {
            if v.is_u64() {
                println!("{k:<22} {v}");
            }
        }
        for (k, title) in [
            ("rmb_sizes", "RMB sizes"),
            ("sndbuf_sizes", "send buffer sizes"),
        ] {
            let sizes = m
                .get(k)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let mut sizes: Vec<(u64, u64)> = sizes
                .iter()
                .filter_map(|(size, n)| Some((size.parse().ok()?, n.as_u64()?)))
                .collect();
            sizes.sort_unstable();
            let list: Vec<String> = sizes
                .iter()
                .map(|(size, n)| format!("{} KiB × {n}", size / 1024))
                .collect();
            println!(
                "{:<22} {}",
                title,
                if list.is_empty() {
                    "-".into()
                } else {
                    list.join(", ")
                }
            );
        }
        println!("fallback reasons:");
        for r in m["fallback_reasons"].as_array().into_iter().flatten() {
            println!(
                "  {:>6}  {} {} ({})",
                s(&r["count"]),
                s(&r["code"]),
                s(&r["name"]),
                s(&r["text"])
            );
        }
    }
    ExitCode::SUCCESS
}

/// What to change for a connection that stayed TCP, by the reason code.
pub fn advice(code: u32, detail: Option<&str>) -> &'static str {
    use smc_wire::decline::DeclineCode as D;
    if detail.is_some_and(|d| d.starts_with("policy")) {
        return "a policy kept it on TCP: see /etc/smc-rs/policy (SMC_RS_POLICY_FILE), SMC_RS_ALLOW and SMC_RS_DENY (README, \"Policy\")";
    }
    match D(code) {
        D::PEERNOSMC => "the peer did not answer with the SMC-R TCP option: run the server under `smc run` (or an SMC-R stack), and install the eBPF option on both hosts (`smc bpf install`) or set SMC_RS_SKIP_TCP_OPTION for this destination on both",
        D::NOSMCDEV | D::NOSMCRDEV => "no RDMA device for an address of this connection: check SMC_RS_PROVIDER (`smc rdma devices`), and the warnings on the process's stderr (e.g. a RoCEv2 port that cannot be shared)",
        D::NOUEID | D::NOSEID => "configure the same user EID on both hosts (`smc ueid add NAME`)",
        D::DIFFPREFIX => "SMC-Rv1 needs both ends on one IP subnet: use addresses of one subnet or SMC-Rv2 with a common UEID",
        D::NOROUTE | D::NOINDIRECT => "SMC-Rv2 found no route between the RoCE GIDs: check the routes between the two addresses",
        D::VERSMISMAT => "the peers share no SMC version: enable v1 or v2 on both (SMC_RS_VERSIONS)",
        D::TIMEOUT_CL | D::TIMEOUT_AL => "the RDMA link did not come up: UDP 4791 between the hosts may be filtered",
        D::PEERDECL => "the peer declined: see its reason code",
        _ => "see the reason above; `SMC_LOG=debug` on both ends shows the handshake",
    }
}

pub fn chk(a: &ChkArgs) -> ExitCode {
    let t = Duration::from_secs(a.timeout.max(1));
    let stream = match smc::SmcStream::connect_timeout(&a.target, t) {
        Ok(s) => s,
        Err(e) => {
            if a.json {
                println!(
                    "{}",
                    json!({"target": a.target.to_string(), "connected": false, "error": e.to_string()})
                );
            } else {
                println!("{}: cannot connect: {e}", a.target);
            }
            return ExitCode::from(1);
        }
    };
    let local = stream.local_addr().ok();
    let mode = stream.mode();
    let doc = match &mode {
        smc::Mode::Smc {
            link_group,
            version,
            first_contact,
        } => json!({
            "target": a.target.to_string(), "local": local.map(|l| l.to_string()),
            "connected": true, "smc": true, "mode": "SMCR", "version": version,
            "lgr": link_group.to_string(), "first_contact": first_contact,
        }),
        smc::Mode::SameHost { peer_pid } => json!({
            "target": a.target.to_string(), "local": local.map(|l| l.to_string()),
            "connected": true, "smc": true, "mode": "SAMEHOST", "peer_pid": peer_pid,
        }),
        smc::Mode::Fallback { reason } => {
            let peer = reason.peer.map(|p| format!("{:#010x}", p.0));
            let code = reason.peer.unwrap_or(reason.local);
            json!({
                "target": a.target.to_string(), "local": local.map(|l| l.to_string()),
                "connected": true, "smc": false, "mode": "TCP",
                "reason": reason.to_string(),
                "local_code": format!("{:#010x}", reason.local.0),
                "local_name": reason.local.name(),
                "peer_code": peer,
                "advice": advice(code.0, reason.detail.as_deref()),
            })
        }
    };
    drop(stream);
    if a.json {
        println!("{doc}");
    } else {
        println!(
            "{} → {}: TCP connection established",
            doc["local"].as_str().unwrap_or("?"),
            a.target
        );
        if mode.is_same_host() {
            println!("SMC: yes, without RDMA ({mode})");
        } else if doc["smc"] == true {
            println!("SMC-R: yes ({mode})");
        } else {
            println!("SMC-R: no — {}", s(&doc["reason"]));
            println!("what to change: {}", s(&doc["advice"]));
        }
    }
    if doc["smc"] == true {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        json!({
            "version": 1, "pid": 42, "process": "redis-server",
            "listeners": [{"local": "127.0.0.2:6379"}],
            "connections": [{"local": "127.0.0.2:6379", "peer": "127.0.0.1:5000", "mode": "SMCR",
                "detail": "SMC-Rv1", "state": "ACTIVE", "lgr": "lgr1", "bytes_sent": 10, "bytes_received": 20}],
            "fallbacks": [{"local": "127.0.0.2:6379", "peer": "127.0.0.9:5001", "role": "server",
                "mode": "TCP", "state": "ESTABLISHED", "reason": "TCP fallback: declined: x (0x03010000)",
                "local_code": {"code": "0x03010000", "name": "PEERNOSMC", "text": "t"},
                "peer_code": null, "policy": false, "bytes_sent": 1, "bytes_received": 2}],
            "link_groups": [{"id": "lgr1", "role": "server", "version": 1, "peer": "p", "conns": 1,
                "rmbs": 1, "rmbs_in_use": 1, "state": "ACTIVE",
                "links": [{"num": 1, "state": "ACTIVE", "device": "sroce0", "gid": "::ffff:127.0.0.2", "qpn": 17, "peer_qpn": 18, "peer_gid": "g"}]}],
            "stats": {"smc_total": 3, "fallbacks": 1, "rmb_bytes": 262144, "rmb_sizes": {"262144": 1},
                "fallback_reasons": [{"code": "0x03010000", "name": "PEERNOSMC", "text": "t", "count": 1}]}
        })
    }

    #[test]
    fn ss_filters_and_tags_sockets() {
        let d = [doc()];
        let conns = sockets(&d, false, false);
        assert_eq!(conns.len(), 2);
        assert!(conns
            .iter()
            .all(|c| c["pid"] == 42 && c["process"] == "redis-server"));
        let l = sockets(&d, false, true);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0]["state"], "LISTEN");
        assert_eq!(sockets(&d, true, false).len(), 3);
        let t = ss_table(&conns);
        assert!(t.contains("SMCR") && t.contains("lgr1"), "{t}");
        assert!(t.contains("0x03010000 PEERNOSMC"), "{t}");
    }

    #[test]
    fn ss_labels_same_host_connections() {
        let mut d = doc();
        d["connections"] = json!([{"local": "127.0.0.2:6379", "peer": "127.0.0.1:5001",
            "mode": "SAMEHOST", "detail": "same-host", "state": "ACTIVE", "lgr": null,
            "bytes_sent": 1, "bytes_received": 2}]);
        let t = ss_table(&sockets(&[d], false, false));
        let line = t.lines().find(|l| l.contains("127.0.0.1:5001")).unwrap();
        assert!(line.contains(" SAMEHOST ") && !line.contains("SMCR"), "{t}");
        assert!(line.contains(" - "), "no link group: {t}");
    }

    #[test]
    fn stats_sum_over_processes() {
        let mut b = doc();
        b["pid"] = json!(43);
        let total = sum_stats(&[doc(), b]);
        assert_eq!(total["smc_total"], 6);
        assert_eq!(total["fallbacks"], 2);
        assert_eq!(total["processes"], 2);
        assert_eq!(total["fallback_reasons"][0]["count"], 2);
        assert_eq!(total["rmb_bytes"], 524288);
        assert_eq!(total["rmb_sizes"]["262144"], 2);
        let p = prometheus(&total);
        assert!(p.contains("smc_rs_smc_total 6\n"), "{p}");
        assert!(p.contains("smc_rs_rmb_sizes{bytes=\"262144\"} 2\n"), "{p}");
        assert!(
            p.contains("smc_rs_fallbacks_by_reason{code=\"0x03010000\",name=\"PEERNOSMC\"} 2"),
            "{p}"
        );
    }

    #[test]
    fn lgr_lists_links() {
        let t = lgr_text(&link_groups(&[doc()]));
        assert!(t.contains("lgr1 (pid 42 redis-server): role server"), "{t}");
        assert!(
            t.contains("device sroce0 gid ::ffff:127.0.0.2 qp 0x11 peer qp 0x12"),
            "{t}"
        );
    }

    #[test]
    fn advice_names_what_to_change() {
        assert!(advice(0x0301_0000, None).contains("smc run"));
        assert!(advice(0x0303_0002, None).contains("RDMA device"));
        assert!(advice(0x0303_0008, None).contains("ueid"));
        assert!(advice(0x0301_0000, Some("policy: SMC_RS_DENY 10.0.0.0/8")).contains("SMC_RS_DENY"));
    }
}
