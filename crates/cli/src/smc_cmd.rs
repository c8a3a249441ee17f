//! The commands that run SMC-R: `smc listen`, `smc connect`, `smc demo`, `smc bench`.
//! They plug the `smc` runtime (`SmcListener`, `SmcStream`, `Stack`) into the
//! transport-generic code of [`crate::endpoint`], [`crate::demo`] and [`crate::bench`].

use crate::bench::{self, Plan};
use crate::demo;
use crate::endpoint::{self, ConnectArgs, Inspect, ListenArgs};
use crate::net::{ConnMode, KernelTcp, Listener, ModeKind, Net, Stream};
use anyhow::{bail, Context, Result};
use smc::{Mode, SmcListener, SmcStream, Stack, StackConfig};
use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// SMC-R through one [`Stack`].
pub struct SmcNet<'a> {
    /// The stack connections are made with.
    pub stack: &'a Stack,
}

fn conn_mode(m: &Mode) -> ConnMode {
    match m {
        Mode::Smc {
            link_group,
            version,
            first_contact,
        } => ConnMode {
            kind: ModeKind::SmcR,
            link_group: Some(link_group.to_string()),
            first_contact: Some(*first_contact),
            text: format!(
                "SMC-R v{version}, link group {link_group}, {} contact",
                if *first_contact {
                    "first"
                } else {
                    "subsequent"
                }
            ),
        },
        Mode::SameHost { .. } => ConnMode {
            kind: ModeKind::SameHost,
            link_group: None,
            first_contact: None,
            text: m.to_string(),
        },
        Mode::Fallback { reason } => {
            // FallbackReason's text starts with "TCP fallback: ".
            let r = reason.to_string();
            ConnMode {
                kind: ModeKind::Fallback,
                link_group: None,
                first_contact: None,
                text: if r.starts_with("TCP fallback") {
                    r
                } else {
                    format!("TCP fallback: {r}")
                },
            }
        }
    }
}

impl Stream for SmcStream {
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        io::Read::read(&mut &*self, buf)
    }
    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        io::Write::write(&mut &*self, buf)
    }
    fn flush(&self) -> io::Result<()> {
        io::Write::flush(&mut &*self)
    }
    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        SmcStream::shutdown(self, how)
    }
    fn set_nodelay(&self, on: bool) -> io::Result<()> {
        SmcStream::set_nodelay(self, on)
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        SmcStream::set_read_timeout(self, t)
    }
    fn peer_addr(&self) -> io::Result<SocketAddr> {
        SmcStream::peer_addr(self)
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        SmcStream::local_addr(self)
    }
    fn mode(&self) -> ConnMode {
        conn_mode(&SmcStream::mode(self))
    }
}

impl Listener for SmcListener {
    type Stream = SmcStream;
    fn accept(&self) -> io::Result<(SmcStream, SocketAddr)> {
        SmcListener::accept(self)
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        SmcListener::local_addr(self)
    }
}

impl Net for SmcNet<'_> {
    type Listener = SmcListener;
    fn label(&self) -> &'static str {
        "SMC-R"
    }
    fn bind(&self, addr: SocketAddr) -> io::Result<SmcListener> {
        SmcListener::bind_with(self.stack, addr)
    }
    fn connect(&self, addr: SocketAddr) -> io::Result<SmcStream> {
        SmcStream::connect_with(self.stack, addr)
    }
}

/// `name:provider,...` of the RDMA devices a provider opened (`-` for none), sorted.
fn devices_text(devs: &[smc_verbs::Device]) -> String {
    let mut v: Vec<String> = devs
        .iter()
        .map(|d| format!("{}:{}", d.name(), d.attr().provider))
        .collect();
    v.sort();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

/// A stack's state for `--stats`: one `stats: summary` line of `key=value` pairs (stable
/// keys, for scripts), then one line per link group and per connection.
pub struct StackInspect<'a>(pub &'a Stack);

impl Inspect for StackInspect<'_> {
    fn snapshot(&self) -> String {
        let st = self.0.stats();
        let lgrs = self.0.link_groups();
        let conns = self.0.connections();
        let mut o = String::new();
        let _ = writeln!(
            o,
            "stats: summary link-groups={} connections={} smc={} handshakes={} links={} qps={} \
             rmbs={} rmbs-in-use={} alert-tokens={} listeners={} fds={} smc-total={} \
             first-contacts={} fallbacks={} resets={} rmbs-deleted={} lgrs-ended={} links-failed={} failovers={} \
             paths-down={} same-host={} same-host-total={} same-host-violations={} provider={} devices={}",
            st.link_groups,
            conns.len(),
            st.smc_connections,
            st.handshakes,
            st.links,
            st.qps_open,
            st.rmbs,
            st.rmb_elements_in_use,
            st.alert_tokens,
            st.listeners,
            st.fds,
            st.smc_total,
            st.first_contacts,
            st.fallbacks,
            st.resets,
            st.rmbs_deleted,
            st.lgrs_ended,
            st.links_failed,
            st.failovers,
            st.paths_down,
            st.same_host_connections,
            st.same_host_total,
            st.same_host_violations,
            self.0.config().provider.name(),
            devices_text(&self.0.config().provider.devices()),
        );
        for g in &lgrs {
            let links: Vec<String> = g
                .links
                .iter()
                .map(|l| {
                    format!(
                        "{}:{} qpn={:#x} peer-qpn={} dev={} gid={} peer-gid={}",
                        l.num,
                        l.state,
                        l.qpn,
                        l.peer_qpn.map(|q| format!("{q:#x}")).unwrap_or("-".into()),
                        l.device,
                        l.gid,
                        l.peer_gid.as_deref().unwrap_or("-")
                    )
                })
                .collect();
            let _ = writeln!(
                o,
                "stats: link-group {} role={} v{} peer={} conns={} rmbs={} rmbs-in-use={} idle={} links=[{}]",
                g.id,
                g.role,
                g.version,
                g.peer,
                g.conns,
                g.rmbs,
                g.rmbs_in_use,
                g.idle,
                links.join(", ")
            );
        }
        for c in &conns {
            let _ = writeln!(
                o,
                "stats: conn {} → {} {} state={} lgr={} sent={} received={} link={} failovers={}",
                c.local,
                c.peer,
                c.mode,
                c.state,
                c.lgr.map(|l| l.to_string()).unwrap_or("-".into()),
                c.bytes_sent,
                c.bytes_received,
                c.link.map(|l| l.to_string()).unwrap_or("-".into()),
                c.failovers
            );
        }
        o
    }

    fn quiesce(&self, limit: Duration) {
        let t = Instant::now();
        while t.elapsed() < limit && !self.0.connections().is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn exit(r: Result<()>, what: &str) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smc {what}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Says once that the override policy is on (it is outside RFC 7609).
fn note_policy(quiet: bool) {
    if quiet {
        return;
    }
    if let Ok(v) = std::env::var(smc_bpf::POLICY_ENV) {
        if !v.trim().is_empty() {
            eprintln!(
                "note: {}={v}: CLC is tried without the TCP option with these peers \
                 (outside RFC 7609)",
                smc_bpf::POLICY_ENV
            );
        }
    }
}

/// Ends the stack's link groups in order (DELETE LINK) and waits for them to go, at most
/// two seconds: the peers learn at once that this process is gone (see [`crate::signal`]).
/// Connections still closing are given up to `drain` first: ending the link group would
/// abort them, and the peer would lose data it has not read yet (RFC 7609 §4.8.2).
fn terminate(stack: &Stack, drain: Duration) {
    StackInspect(stack).quiesce(drain);
    if stack.link_groups().is_empty() {
        return;
    }
    stack.terminate_link_groups();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) && !stack.link_groups().is_empty() {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The process's stack: the default one, or (with `bind`) the default configuration bound
/// to that address. Lives until the process exits, so that the signal thread may use it.
fn process_stack(
    bind: Option<IpAddr>,
    f: Option<&dyn Fn(&mut StackConfig)>,
) -> io::Result<&'static Stack> {
    match (bind, f) {
        (None, None) => Ok(Stack::global()),
        (ip, f) => {
            let mut c = StackConfig::from_env();
            if ip.is_some() {
                c.local_addr = ip;
            }
            if let Some(f) = f {
                f(&mut c);
            }
            Ok(Box::leak(Box::new(Stack::new(c)?)))
        }
    }
}

/// Signals (taken before the stack starts its threads): SIGUSR1 prints the stack's
/// state when `stats`; SIGTERM/SIGINT end its link groups, then the process.
fn start(bind: Option<IpAddr>, stats: bool, quiet: bool) -> io::Result<&'static Stack> {
    start_cfg(bind, stats, quiet, None)
}

/// [`start`] with a stack of its own, configured by `f` beyond the environment.
fn start_with(
    bind: Option<IpAddr>,
    stats: bool,
    quiet: bool,
    f: impl Fn(&mut StackConfig),
) -> io::Result<&'static Stack> {
    start_cfg(bind, stats, quiet, Some(&f))
}

fn start_cfg(
    bind: Option<IpAddr>,
    stats: bool,
    quiet: bool,
    f: Option<&dyn Fn(&mut StackConfig)>,
) -> io::Result<&'static Stack> {
    let signals = crate::signal::take()?;
    note_policy(quiet);
    let stack = process_stack(bind, f)?;
    crate::signal::handle(
        signals,
        move || {
            if stats {
                endpoint::print_stats(&StackInspect(stack), "SIGUSR1");
            }
        },
        move || terminate(stack, Duration::from_secs(2)),
    )?;
    Ok(stack)
}

/// `smc listen`.
pub fn listen(args: &ListenArgs) -> ExitCode {
    let r = start(None, args.stats, args.quiet)
        .map_err(anyhow::Error::from)
        .and_then(|stack| {
            let r = endpoint::listen(&SmcNet { stack }, args, &StackInspect(stack));
            terminate(stack, Duration::from_secs(30));
            r
        });
    exit(r, "listen")
}

/// `smc connect`.
pub fn connect(args: &ConnectArgs) -> ExitCode {
    let r = start(args.bind, args.stats, args.quiet)
        .map_err(anyhow::Error::from)
        .and_then(|stack| {
            let r = endpoint::connect(&SmcNet { stack }, args, &StackInspect(stack));
            terminate(stack, Duration::from_secs(30));
            r
        });
    exit(r, "connect")
}

/// Options shared by `smc demo` and `smc bench`: where the two stacks live.
#[derive(clap::Args, Debug, Clone)]
pub struct PairArgs {
    /// The server stack's (listener's) address.
    #[arg(long, default_value = "127.0.0.2")]
    pub server_ip: IpAddr,
    /// The client stack's address.
    #[arg(long, default_value = "127.0.0.1")]
    pub client_ip: IpAddr,
    /// Print both stacks' link groups, connections and counters at the end.
    #[arg(long)]
    pub stats: bool,
}

/// `smc bench --listen IP`: one bench run's measuring servers (SMC-R on `port`, TCP on
/// `port` + 1) on this process's stack, until the client stops them.
fn bench_listen(args: &BenchArgs, ip: IpAddr) -> Result<()> {
    let tcp_port = args
        .port
        .checked_add(1)
        .context("--port leaves no room for TCP's port")?;
    let stack = start_with(None, args.pair.stats, false, |c| args.path.configure(c))?;
    let l =
        SmcListener::bind_with(stack, SocketAddr::new(ip, args.port)).context("SMC listener")?;
    let tl = TcpListener::bind(SocketAddr::new(ip, tcp_port)).context("TCP listener")?;
    let smc = crate::harness::Server::start(l)?;
    let tcp = crate::harness::Server::start(tl)?;
    eprintln!(
        "smc bench: serving one run: SMC-R on {}, TCP on {}",
        smc.addr(),
        tcp.addr()
    );
    let mut errors = 0;
    for (label, recs) in [("SMC-R", smc.wait()), ("TCP", tcp.wait())] {
        for r in &recs {
            if let Some(e) = &r.error {
                errors += 1;
                eprintln!("smc bench: {label} server: {e}");
            }
        }
        eprintln!("smc bench: {label}: served {} connections", recs.len());
    }
    if args.pair.stats {
        endpoint::print_stats(&StackInspect(stack), "server stack");
    }
    terminate(stack, Duration::from_secs(2));
    if errors > 0 {
        bail!("{errors} served connection(s) failed");
    }
    Ok(())
}

/// `smc bench --connect IP`: the client side against `smc bench --listen IP`.
fn bench_connect(args: &BenchArgs, ip: IpAddr, plan: &Plan) -> Result<()> {
    let tcp_port = args
        .port
        .checked_add(1)
        .context("--port leaves no room for TCP's port")?;
    let stack = start_with(None, false, args.json, |c| args.path.configure(c))?;
    if !args.json {
        let sel = smc_providers::selection_or_auto();
        eprintln!(
            "smc bench: {} and kernel TCP to {ip} (server in another process); provider {}",
            args.path.label(),
            smc_providers::describe(sel, ip)
        );
    }
    let smc = bench::measure_remote(
        args.path.label(),
        SocketAddr::new(ip, args.port),
        &SmcNet { stack },
        plan,
        args.path.expect(),
    );
    let tcp = bench::measure_remote(
        "TCP",
        SocketAddr::new(ip, tcp_port),
        &KernelTcp,
        plan,
        ModeKind::KernelTcp,
    );
    let mut report = judge(args, smc, tcp, stack);
    report.provider = smc_providers::describe(smc_providers::selection_or_auto(), ip);
    report.remote_server = true;
    let r = finish_bench(args, report, None);
    if args.pair.stats {
        endpoint::print_stats(&StackInspect(stack), "client stack");
    }
    terminate(stack, Duration::from_secs(2));
    r
}

/// Two stacks in this process, client and server, each with its own software RNIC
/// device (UDP 4791 on its address), with CLC allowed between them by the explicit
/// policy (no eBPF needed; outside RFC 7609, see README "TCP option").
fn stack_pair(p: &PairArgs) -> Result<(Stack, Stack)> {
    stack_pair_with(p, |_| {})
}

/// [`stack_pair`] with a change to both stacks' configuration.
fn stack_pair_with(p: &PairArgs, f: impl Fn(&mut StackConfig)) -> Result<(Stack, Stack)> {
    let policy: smc_bpf::SkipOptionPolicy =
        format!("{},{}", pattern(p.server_ip), pattern(p.client_ip))
            .parse()
            .context("policy")?;
    let mut sc = StackConfig::from_env();
    // The pair shows and measures SMC-R over the RNIC (`smc bench --path same-host`
    // turns the shared-memory path back on through `f`).
    sc.same_host = false;
    f(&mut sc);
    sc.skip_tcp_option = policy.clone();
    sc.tcp_option = None;
    let mut cc = sc.clone();
    cc.local_addr = Some(p.client_ip);
    let server = Stack::new(sc).context("server stack")?;
    let client = Stack::new(cc).context("client stack")?;
    Ok((server, client))
}

/// NOSMCDEV between our own two stacks nearly always means that their RNIC devices
/// could not open UDP 4791 on their addresses (another SMC-R process has it).
fn hint(m: &ConnMode) -> &'static str {
    if m.text.contains("0x03030000") {
        " — is another SMC-R process using UDP port 4791 on these addresses? \
         Try other loopback addresses: --server-ip 127.0.9.2 --client-ip 127.0.9.1"
    } else {
        ""
    }
}

fn pattern(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}/32:*"),
        IpAddr::V6(a) => format!("[{a}/128]:*"),
    }
}

/// `smc demo` options.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Bytes to move each way (e.g. 256M, 1G).
    #[arg(long, default_value = "256M")]
    pub bytes: String,
    /// 1-byte ping-pongs for the latency line.
    #[arg(long, default_value_t = 2000)]
    pub iters: usize,
    #[command(flatten)]
    pub pair: PairArgs,
}

/// `smc demo`.
pub fn demo(args: &DemoArgs) -> ExitCode {
    exit(run_demo(args), "demo")
}

fn run_demo(args: &DemoArgs) -> Result<()> {
    let bytes = crate::payload::parse_size(&args.bytes).map_err(anyhow::Error::msg)?;
    let (server, client) = stack_pair(&args.pair)?;
    println!(
        "smc demo: SMC-R between two stacks in this process (client {} → server {}; provider {}), \
         then the same over kernel TCP",
        args.pair.client_ip,
        args.pair.server_ip,
        smc_providers::describe(smc_providers::selection_or_auto(), args.pair.client_ip)
    );
    let l = SmcListener::bind_with(&server, SocketAddr::new(args.pair.server_ip, 0))
        .context("SMC-R listener")?;
    let smc = demo::run_side("SMC-R", l, &SmcNet { stack: &client }, bytes, args.iters)?;
    let groups = server.link_groups();
    let tl = TcpListener::bind(SocketAddr::new(args.pair.server_ip, 0))?;
    let tcp = demo::run_side("TCP", tl, &KernelTcp, bytes, args.iters)?;
    print!("{}", demo::render(&smc, &tcp, bytes));
    for g in &groups {
        println!(
            "link group {} (server side): SMC-Rv{}, peer {}, {} link(s): {}",
            g.id,
            g.version,
            g.peer,
            g.links.len(),
            g.links
                .iter()
                .map(|l| format!(
                    "QP {:#x} ↔ {} on {}",
                    l.qpn,
                    l.peer_qpn.map(|q| format!("{q:#x}")).unwrap_or("-".into()),
                    l.device
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if args.pair.stats {
        endpoint::print_stats(&StackInspect(&server), "server stack");
        endpoint::print_stats(&StackInspect(&client), "client stack");
    }
    if !smc.verified() || !tcp.verified() {
        bail!("data verification failed");
    }
    if !smc.exchange.mode.is_smc() || !smc.server.mode.is_smc() {
        bail!(
            "the SMC connection is not SMC-R: {}{}",
            smc.exchange.mode,
            hint(&smc.exchange.mode)
        );
    }
    Ok(())
}

/// `smc bench` options.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Bulk transfer size (64 KiB writes).
    #[arg(long, default_value = "256M")]
    pub bytes: String,
    /// Timed ping-pongs per message size.
    #[arg(long, default_value_t = 5000)]
    pub iters: usize,
    /// Ping-pong message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "1,1024")]
    pub sizes: Vec<u32>,
    /// Connections opened and closed in sequence for the connection rate.
    #[arg(long, default_value_t = 500)]
    pub conns: usize,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Two processes, like `iperf3 -s`: serve one bench run on this address (SMC-R on
    /// `--port`, kernel TCP on `--port` + 1) with this process's stack, then exit.
    #[arg(long, value_name = "IP", conflicts_with = "connect")]
    pub listen: Option<IpAddr>,
    /// Two processes, like `iperf3 -c`: measure against `smc bench --listen IP` running
    /// elsewhere (another namespace or host), then stop it.
    #[arg(long, value_name = "IP")]
    pub connect: Option<IpAddr>,
    /// The SMC-R port of `--listen`/`--connect` (kernel TCP: the next one).
    #[arg(long, default_value_t = 5301)]
    pub port: u16,
    /// Which SMC path to measure beside TCP: `rdma` (SMC-R over the RNIC) or
    /// `same-host` (smc-rs's shared-memory path between stacks on this host, judged by
    /// the targets of issue 14). With `--listen`/`--connect` both sides must say it.
    #[arg(long, value_enum, default_value = "rdma")]
    pub path: BenchPath,
    #[command(flatten)]
    pub pair: PairArgs,
}

/// The SMC path `smc bench` measures.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchPath {
    /// SMC-R over the RDMA provider.
    Rdma,
    /// The same-host path (shared memory).
    SameHost,
}

impl BenchPath {
    fn label(self) -> &'static str {
        match self {
            BenchPath::Rdma => "SMC-R",
            BenchPath::SameHost => "same-host",
        }
    }
    fn expect(self) -> ModeKind {
        match self {
            BenchPath::Rdma => ModeKind::SmcR,
            BenchPath::SameHost => ModeKind::SameHost,
        }
    }
    fn goals(self) -> bench::Goals {
        match self {
            BenchPath::Rdma => bench::Goals::SMC_R,
            BenchPath::SameHost => bench::Goals::SAME_HOST,
        }
    }
    fn configure(self, c: &mut StackConfig) {
        // The RDMA path is measured between two local stacks: no shared memory.
        c.same_host = self == BenchPath::SameHost;
    }
}

/// `smc bench`.
pub fn bench(args: &BenchArgs) -> ExitCode {
    exit(run_bench(args), "bench")
}

/// Both sides against the path's goals; on the same-host path also against what one
/// thread copies at the RMB size, measured now (same machine, same run).
fn judge(
    args: &BenchArgs,
    smc: bench::TransportReport,
    tcp: bench::TransportReport,
    stack: &Stack,
) -> bench::Report {
    let goals = args.path.goals();
    let mut report = bench::compare_with(smc, tcp, goals);
    if let Some(share) = goals.memcpy_share {
        let rmb = stack.config().same_host_rmb_size;
        bench::judge_memcpy(&mut report, bench::memcpy_rate(rmb), share);
    }
    report
}

fn run_bench(args: &BenchArgs) -> Result<()> {
    let plan = Plan {
        bulk_bytes: crate::payload::parse_size(&args.bytes).map_err(anyhow::Error::msg)?,
        iters: args.iters,
        warmup: (args.iters / 10).clamp(1, 500),
        sizes: args.sizes.clone(),
        conns: args.conns,
    };
    if let Some(ip) = args.listen {
        return bench_listen(args, ip);
    }
    if let Some(ip) = args.connect {
        return bench_connect(args, ip, &plan);
    }
    let (server, client) = stack_pair_with(&args.pair, |c| args.path.configure(c))?;
    if !args.json {
        let sel = smc_providers::selection_or_auto();
        eprintln!(
            "smc bench: {} ({} → {}) vs kernel TCP loopback; provider {}",
            args.path.label(),
            args.pair.client_ip,
            args.pair.server_ip,
            smc_providers::describe(sel, args.pair.client_ip)
        );
    }
    let l = SmcListener::bind_with(&server, SocketAddr::new(args.pair.server_ip, 0))
        .context("SMC listener")?;
    let smc = bench::measure(
        args.path.label(),
        l,
        &SmcNet { stack: &client },
        &plan,
        args.path.expect(),
    )
    .context(args.path.label())?;
    let tl = TcpListener::bind(SocketAddr::new(args.pair.server_ip, 0))?;
    let tcp = bench::measure("TCP", tl, &KernelTcp, &plan, ModeKind::KernelTcp).context("TCP")?;
    let mut report = judge(args, smc, tcp, &client);
    report.provider =
        smc_providers::describe(smc_providers::selection_or_auto(), args.pair.client_ip);
    finish_bench(args, report, Some((&server, &client)))
}

/// Prints the report (and with `--stats` the stacks); fails if a measurement failed or
/// the SMC-R side fell back to TCP.
fn finish_bench(
    args: &BenchArgs,
    report: bench::Report,
    stacks: Option<(&Stack, &Stack)>,
) -> Result<()> {
    if !report.smc.all_expected_mode {
        eprintln!(
            "smc bench: WARNING: SMC-R connections fell back to TCP ({}){}",
            report.smc.mode,
            if report.smc.mode.contains("0x03030000") {
                " — is another SMC-R process using UDP port 4791 on these addresses? \
                 Try --server-ip 127.0.9.2 --client-ip 127.0.9.1"
            } else {
                ""
            }
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", bench::render(&report));
    }
    if let (true, Some((server, client))) = (args.pair.stats, stacks) {
        endpoint::print_stats(&StackInspect(server), "server stack");
        endpoint::print_stats(&StackInspect(client), "client stack");
    }
    // The targets are reported, not asserted; a measurement that failed is an error.
    let failed = report.smc.errors.len() + report.tcp.errors.len();
    if failed > 0 {
        bail!("{failed} measurement(s) failed (see the report)");
    }
    if !report.smc.all_expected_mode {
        bail!("the SMC-R side fell back to TCP");
    }
    Ok(())
}

/// `smc scale`'s view of the process's stack.
struct StackGauge(&'static Stack);

impl crate::scale::Gauge for StackGauge {
    fn connections(&self) -> usize {
        let s = self.0.stats();
        s.smc_connections + s.handshakes
    }
    fn link_groups(&self) -> usize {
        self.0.stats().link_groups
    }
    fn buffers_per_conn(&self) -> usize {
        let c = self.0.config();
        // The RMB element is rounded up to 16 KiB × 2^n (RFC 7609 A.2.3).
        c.rmb_size.max(16 * 1024).next_power_of_two() + c.sndbuf_size
    }
}

/// `smc scale`: many connections (see [`crate::scale`]).
pub fn scale(args: &crate::scale::ScaleArgs) -> ExitCode {
    exit(run_scale(args), "scale")
}

fn run_scale(args: &crate::scale::ScaleArgs) -> Result<()> {
    if let Some(ip) = args.listen {
        let stack = start(None, args.stats, false)?;
        let l = SmcListener::bind_with(stack, SocketAddr::new(ip, args.port))
            .context("SMC-R listener")?;
        let tl = crate::scale::tcp_listener(SocketAddr::new(ip, args.port.wrapping_add(1)))
            .context("TCP listener")?;
        eprintln!(
            "listening on {} (TCP {})",
            l.local_addr()?,
            tl.local_addr()?
        );
        let tcp = std::thread::Builder::new()
            .name("scale-tcp".into())
            .spawn(move || crate::scale::serve(tl))?;
        let r = crate::scale::serve(l);
        let _ = tcp.join();
        if args.stats {
            endpoint::print_stats(&StackInspect(stack), "at exit");
        }
        return r;
    }
    let Some(ip) = args.connect else {
        anyhow::bail!("--listen IP or --connect IP");
    };
    let stack = start(args.bind, false, true)?;
    let r = crate::scale::run_client(
        &SmcNet { stack },
        &StackGauge(stack),
        &crate::scale::BoundTcp(args.bind),
        args,
        ip,
    );
    terminate(stack, Duration::from_secs(30));
    r
}
