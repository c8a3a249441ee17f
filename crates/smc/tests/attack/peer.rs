//! The evil SMC-R peer: the rendezvous done by hand, step by step (so that a test can stop
//! at any step), as a client against a victim `SmcListener` and as a server against a
//! victim `SmcStream::connect_with`; then a [`Session`] holding an established link.
//!
//! A session has a working data path (the crate's own `conn::Conn` machine driven over the
//! attacker's raw verbs objects, so a test can check that the victim still carries its data
//! correctly) and raw access next to it: any CDC, any LLC message, any RDMA WRITE.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use smc::conn::{
    CdcRepr, Conn, ConnConfig, ConnParams, ConnStateFlags, ProducerFlags, RmbeGeometry, Snapshot,
    UpdatePolicy,
};
use smc_verbs::{AccessFlags, Device, Mr, Mtu, Provider, RdmaBuffer};
use smc_wire::clc::{AcceptConfirmRepr, AcceptV2, ClcMessage, FirstContactExt};
use smc_wire::common::{BufSize, Eid, Gid, Mac, Name32, PeerId, QpMtu, U24};
use smc_wire::llc::{AddLink, ConfirmLink, LlcMessage};

use super::clc;
use super::link::{self, CdcSink, PeerQp, RawLink};

/// Wait for each step of the rendezvous.
pub const STEP: Duration = Duration::from_secs(10);

fn err(m: impl Into<String>) -> io::Error {
    io::Error::other(m.into())
}

/// An attacker: a loopback address with its own software RNIC and a Peer ID.
#[derive(Clone)]
pub struct Attacker {
    pub ip: IpAddr,
    pub dev: Device,
    pub peer_id: PeerId,
    /// RMB element size announced (16 KiB × 2^n).
    pub rmb_size: usize,
    /// SMC-Rv2 with this UEID: the client sends a v2-only Proposal, like Linux (whose
    /// v2-only Proposals carry Peer ID 0), offering one link per link group.
    pub ueid: Option<Eid>,
}

impl Attacker {
    /// An attacker on `ip` with a random Peer ID (a new link group on every first contact).
    pub fn new(ip: IpAddr) -> Attacker {
        let dev = smc_softroce::SoftRoce::global()
            .device_for(ip)
            .expect("attacker RNIC");
        let peer_id = PeerId {
            instance: fresh_instance(),
            mac: Mac(dev.mac().0),
        };
        Attacker {
            ip,
            dev,
            peer_id,
            rmb_size: 64 * 1024,
            ueid: None,
        }
    }

    pub fn gid(&self) -> Gid {
        Gid(self.dev.gid().0)
    }
    pub fn mac(&self) -> Mac {
        Mac(self.dev.mac().0)
    }

    /// A fresh Peer ID (the victim will treat the next rendezvous as a new peer).
    pub fn renew_peer_id(&mut self) {
        self.peer_id.instance = fresh_instance();
    }

    /// The same attacker under a new Peer ID: its next rendezvous is a first contact
    /// (the harness does first contacts only).
    pub fn fresh(&self) -> Attacker {
        let mut a = self.clone();
        a.renew_peer_id();
        a
    }

    /// A raw TCP connection to the victim.
    pub fn tcp(&self, to: SocketAddr) -> io::Result<TcpStream> {
        clc::tcp_from(self.ip, to)
    }

    /// The whole client rendezvous (first contact) against a victim listener.
    pub fn connect(&self, to: SocketAddr) -> io::Result<Session> {
        let mut h = ClientHandshake::start(self, to)?;
        h.send_proposal()?;
        h.read_accept()?;
        h.send_confirm()?;
        h.finish()
    }

    /// A listener the victim's client can reach (skip policy covers the attacker address).
    pub fn listen(&self) -> io::Result<TcpListener> {
        TcpListener::bind((self.ip, 0))
    }
}

/// Our RMB (one element) and its token as the victim knows them.
pub struct OwnRmb {
    pub buf: Arc<RdmaBuffer>,
    pub mr: Mr,
    pub size: BufSize,
    pub token: u32,
}

impl OwnRmb {
    fn new(link: &RawLink, size: usize) -> OwnRmb {
        let size = BufSize::encode(size, BufSize::LINUX_MAX_CODE);
        let buf = RdmaBuffer::new(size.bytes()).expect("RMB");
        let mr = link
            .pd
            .reg_mr(&buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .expect("RMB registration");
        OwnRmb {
            buf,
            mr,
            size,
            token: rand::random::<u32>() | 1,
        }
    }
}

/// The victim's RMB element as its Accept/Confirm named it.
#[derive(Clone, Copy, Debug)]
pub struct VictimRmb {
    pub rkey: u32,
    pub vaddr: u64,
    pub idx: u8,
    pub size: BufSize,
    /// The alert token the victim assigned (CDCs to the victim carry it).
    pub token: u32,
}

impl VictimRmb {
    fn of(r: &AcceptConfirmRepr) -> VictimRmb {
        VictimRmb {
            rkey: r.rmb_rkey,
            vaddr: r.rmb_vaddr,
            idx: r.rmbe_idx,
            size: r.rmbe_size,
            token: r.rmbe_alert_token,
        }
    }
    /// Address of the element's first byte.
    pub fn base(&self) -> u64 {
        self.vaddr
            .wrapping_add(u64::from(self.idx.saturating_sub(1)) * self.size.bytes() as u64)
    }
}

fn our_repr(att: &Attacker, link: &RawLink, rmb: &OwnRmb, first: bool) -> AcceptConfirmRepr {
    AcceptConfirmRepr {
        version: 1,
        first_contact: first,
        peer_id: att.peer_id,
        gid: att.gid(),
        mac: att.mac(),
        qpn: U24::wrapping(link.qp.qpn()),
        rmb_rkey: rmb.mr.rkey(),
        rmbe_idx: 1,
        rmbe_alert_token: rmb.token,
        rmbe_size: rmb.size,
        qp_mtu: QpMtu::from_code(link.mtu() as u8)
            .unwrap_or(QpMtu::Mtu1024)
            .code(),
        rmb_vaddr: rmb.mr.addr(),
        psn: U24::wrapping(link.psn),
        v2: None,
    }
}

fn peer_qp(r: &AcceptConfirmRepr) -> PeerQp {
    PeerQp {
        gid: r.gid,
        mac: r.mac,
        qpn: r.qpn.get(),
        psn: r.psn.get(),
        mtu: Mtu::from_enum(r.qp_mtu).unwrap_or(Mtu::Mtu1024),
    }
}

// ---------------------------------------------------------------------------------------
// Client rendezvous

/// The client side of a rendezvous, one step at a time.
pub struct ClientHandshake {
    pub att: Attacker,
    pub tcp: TcpStream,
    pub accept: Option<AcceptConfirmRepr>,
    pub link: Option<Arc<RawLink>>,
    rmb: Option<OwnRmb>,
}

impl ClientHandshake {
    pub fn start(att: &Attacker, to: SocketAddr) -> io::Result<ClientHandshake> {
        Ok(ClientHandshake {
            att: att.clone(),
            tcp: att.tcp(to)?,
            accept: None,
            link: None,
            rmb: None,
        })
    }

    pub fn send_proposal(&mut self) -> io::Result<()> {
        let a = &self.att;
        let p = match a.ueid {
            None => clc::proposal(a.peer_id, a.gid(), a.mac()),
            Some(eid) => clc::proposal_v2(a.peer_id, a.gid(), a.mac(), eid),
        };
        io::Write::write_all(&mut self.tcp, &p)
    }

    /// The victim's Accept (a Decline or anything else is an error naming it).
    pub fn read_accept(&mut self) -> io::Result<AcceptConfirmRepr> {
        match clc::read_msg(&mut self.tcp, STEP)? {
            ClcMessage::Accept(a) => {
                self.accept = Some(a.clone());
                Ok(a)
            }
            other => Err(err(format!("expected an Accept, got {other:?}"))),
        }
    }

    /// Our QP connected to the victim's (RTR/RTS) and our RMB registered.
    pub fn prepare_link(&mut self) -> io::Result<()> {
        let a = self.accept.as_ref().ok_or_else(|| err("no Accept yet"))?;
        if !a.first_contact {
            return Err(err("the harness only does first contacts"));
        }
        let link = RawLink::new(&self.att.dev);
        link.connect(peer_qp(a));
        self.rmb = Some(OwnRmb::new(&link, self.att.rmb_size));
        self.link = Some(link);
        Ok(())
    }

    pub fn send_confirm(&mut self) -> io::Result<()> {
        if self.link.is_none() {
            self.prepare_link()?;
        }
        let (Some(link), Some(rmb), Some(acc)) = (&self.link, &self.rmb, &self.accept) else {
            return Err(err("no link"));
        };
        let mut r = our_repr(&self.att, link, rmb, true);
        if let Some(v2) = &acc.v2 {
            // SMC-Rv2 first contact: echo the negotiated values, list our GID.
            let f = v2.fce.unwrap_or_default();
            let mut gids = arrayvec::ArrayVec::new();
            gids.push(self.att.gid());
            r.version = 2;
            r.v2 = Some(AcceptV2 {
                eid: v2.eid,
                fce: Some(FirstContactExt {
                    v2_direct: true,
                    os_type: 2,
                    release: f.release,
                    hostname: Name32::new("attacker").unwrap_or_default(),
                    max_conns: f.max_conns,
                    max_links: f.max_links,
                    feature_mask: 0,
                    vendor_exp_options: 0,
                }),
                gid_list: Some(gids),
            });
        }
        let c = clc::accept_confirm(false, &r);
        io::Write::write_all(&mut self.tcp, &c)
    }

    /// Waits for the victim's CONFIRM LINK (answered by the link's handler) and its ADD
    /// LINK (rejected: one RNIC, no alternate path), then hands over the session.
    pub fn finish(self) -> io::Result<Session> {
        let link = self.link.clone().ok_or_else(|| err("no link"))?;
        let a = self.accept.clone().ok_or_else(|| err("no Accept"))?;
        let v2 = a.v2.is_some();
        let ty = |t: u8| if v2 { 0x20 | t } else { t };
        link.wait_llc(STEP, ty(0x01), false)
            .ok_or_else(|| err("no CONFIRM LINK from the victim"))?;
        // SMC-Rv2 with one link per link group: no ADD LINK (Linux does not wait for one).
        let max_links = a.v2.as_ref().and_then(|v| v.fce).map_or(2, |f| f.max_links);
        if max_links >= 2 {
            link.wait_llc(STEP, ty(0x02), false)
                .ok_or_else(|| err("no ADD LINK from the victim"))?;
        }
        let rmb = self.rmb.ok_or_else(|| err("no RMB"))?;
        Ok(Session::new(
            self.tcp,
            link,
            a.peer_id,
            VictimRmb::of(&a),
            rmb,
        ))
    }
}

// ---------------------------------------------------------------------------------------
// Server rendezvous

/// The server side of a rendezvous against a victim client, one step at a time.
pub struct ServerHandshake {
    pub att: Attacker,
    pub tcp: TcpStream,
    pub proposal: Option<smc_wire::clc::ProposalRepr>,
    pub confirm: Option<AcceptConfirmRepr>,
    pub link: Arc<RawLink>,
    rmb: OwnRmb,
}

impl ServerHandshake {
    /// Accepts the victim's TCP connection (QP and RMB ready, like a server at Proposal).
    pub fn accept(att: &Attacker, l: &TcpListener) -> io::Result<ServerHandshake> {
        let (tcp, _) = l.accept()?;
        tcp.set_nodelay(true)?;
        let link = RawLink::new(&att.dev);
        let rmb = OwnRmb::new(&link, att.rmb_size);
        Ok(ServerHandshake {
            att: att.clone(),
            tcp,
            proposal: None,
            confirm: None,
            link,
            rmb,
        })
    }

    pub fn read_proposal(&mut self) -> io::Result<()> {
        match clc::read_msg(&mut self.tcp, STEP)? {
            ClcMessage::Proposal(p) => {
                self.proposal = Some(p);
                Ok(())
            }
            other => Err(err(format!("expected a Proposal, got {other:?}"))),
        }
    }

    /// A first-contact SMC-Rv1 Accept.
    pub fn send_accept(&mut self) -> io::Result<()> {
        let a = clc::accept_confirm(true, &our_repr(&self.att, &self.link, &self.rmb, true));
        io::Write::write_all(&mut self.tcp, &a)
    }

    pub fn read_confirm(&mut self) -> io::Result<()> {
        match clc::read_msg(&mut self.tcp, STEP)? {
            ClcMessage::Confirm(c) => {
                self.link.connect(peer_qp(&c));
                self.confirm = Some(c);
                Ok(())
            }
            other => Err(err(format!("expected a Confirm, got {other:?}"))),
        }
    }

    /// Our CONFIRM LINK request (link 1); waits for the victim's response.
    pub fn confirm_link(&mut self) -> io::Result<()> {
        let l = &self.link;
        l.send_llc(&LlcMessage::ConfirmLink(ConfirmLink {
            v2: false,
            response: false,
            no_rmbe_eyecatcher: true,
            mac: l.mac(),
            gid: l.gid(),
            qpn: U24::wrapping(l.qp.qpn()),
            link_num: 1,
            link_uid: 0x00BB_0001,
            max_links: 2,
            max_conns: 255,
        }))
        .map_err(|e| err(e.to_string()))?;
        l.wait_llc(STEP, 0x01, true)
            .map(|_| ())
            .ok_or_else(|| err("no CONFIRM LINK response from the victim"))
    }

    /// An ADD LINK naming our one RNIC again: the victim rejects it (no alternate path)
    /// and its first contact is complete.
    pub fn add_link(&mut self) -> io::Result<()> {
        let l = &self.link;
        l.send_llc(&LlcMessage::AddLink(add_link_req(l, 2)))
            .map_err(|e| err(e.to_string()))?;
        l.wait_llc(STEP, 0x02, true)
            .map(|_| ())
            .ok_or_else(|| err("no ADD LINK answer from the victim"))
    }

    pub fn finish(self) -> io::Result<Session> {
        let c = self.confirm.clone().ok_or_else(|| err("no Confirm"))?;
        Ok(Session::new(
            self.tcp,
            self.link,
            c.peer_id,
            VictimRmb::of(&c),
            self.rmb,
        ))
    }

    /// Every step after the TCP accept.
    pub fn run(att: &Attacker, l: &TcpListener) -> io::Result<Session> {
        let mut h = ServerHandshake::accept(att, l)?;
        h.read_proposal()?;
        h.send_accept()?;
        h.read_confirm()?;
        h.confirm_link()?;
        h.add_link()?;
        h.finish()
    }
}

/// An ADD LINK request naming the link's own RNIC (the victim has no second one).
pub fn add_link_req(l: &RawLink, link_num: u8) -> AddLink<'static> {
    AddLink {
        v2: false,
        response: false,
        reject: false,
        reject_reason: 0,
        mac: l.mac(),
        gid: l.gid(),
        qpn: U24::wrapping(l.qp.qpn() ^ 0x55),
        link_num,
        qp_mtu: QpMtu::Mtu1024.code(),
        psn: U24::wrapping(1),
        ext: None,
    }
}

// ---------------------------------------------------------------------------------------
// Established

/// The data path of a session: the `conn` machine over the attacker's verbs objects.
pub struct DataPath {
    conn: Mutex<Conn>,
    cond: Condvar,
    link: Arc<RawLink>,
    rmb: Arc<RdmaBuffer>,
    sndbuf: Arc<RdmaBuffer>,
    sndbuf_mr: Mr,
    peer_base: u64,
    peer_rkey: u32,
    /// CDCs the victim sent that the machine rejected or that named another token.
    pub odd_cdcs: Mutex<Vec<(CdcRepr, String)>>,
}

impl DataPath {
    fn lock(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Posts what the machine wants sent.
    fn drive(&self, c: &mut Conn) {
        let now = Instant::now();
        if c.poll_timeout().is_some_and(|t| t <= now) {
            c.on_timeout(now);
        }
        while let Some(t) = c.poll_transmit(now) {
            let writes: Vec<(u64, smc_verbs::Sge)> = t
                .writes()
                .iter()
                .map(|w| {
                    (
                        self.peer_base + u64::from(w.dst_off),
                        self.sndbuf_mr.sge(w.src_off as usize, w.len),
                    )
                })
                .collect();
            let cdc = t.cdc.to_bytes();
            if self
                .link
                .post_transmit(&writes, self.peer_rkey, &cdc, t.cdc.seqno)
                .is_err()
            {
                c.on_cdc_send_failed(t.cdc.seqno);
                c.kill(smc::conn::AbortReason::LinkLost);
                break;
            }
        }
        let _ = c.take_events();
        self.cond.notify_all();
    }
}

impl CdcSink for DataPath {
    fn on_cdc(&self, bytes: &[u8; 44]) {
        let Ok(m) = CdcRepr::parse_bytes(bytes) else {
            return;
        };
        let mut c = self.lock();
        let rmb = &self.rmb;
        let out = c.handle_cdc(&m, Instant::now(), |off| {
            let mut b = [0u8; 1];
            if rmb.contains(off as usize, 1) {
                rmb.read(off as usize, &mut b);
            }
            b[0]
        });
        if !matches!(out, smc::conn::CdcOutcome::Accepted) {
            self.odd_cdcs.lock().unwrap().push((m, format!("{out:?}")));
        }
        self.drive(&mut c);
    }

    fn on_cdc_sent(&self, seq: u16, ok: bool) {
        let mut c = self.lock();
        if ok {
            c.on_cdc_sent(seq);
        } else {
            c.on_cdc_send_failed(seq);
            c.kill(smc::conn::AbortReason::LinkLost);
        }
        self.drive(&mut c);
    }
}

/// An established SMC-R connection held by the attacker.
pub struct Session {
    pub tcp: TcpStream,
    pub link: Arc<RawLink>,
    /// The victim's Peer ID (from its Accept / Confirm).
    pub victim_peer_id: PeerId,
    pub victim_rmb: VictimRmb,
    pub own: OwnRmb,
    pub data: Arc<DataPath>,
}

impl Session {
    fn new(
        tcp: TcpStream,
        link: Arc<RawLink>,
        victim_peer_id: PeerId,
        victim_rmb: VictimRmb,
        own: OwnRmb,
    ) -> Session {
        let local = RmbeGeometry::linux(own.size.bytes() as u32).expect("geometry");
        let peer = RmbeGeometry::linux(victim_rmb.size.bytes() as u32).expect("geometry");
        let sndbuf = RdmaBuffer::new(256 * 1024).expect("sndbuf");
        let sndbuf_mr = link
            .pd
            .reg_mr(&sndbuf, AccessFlags::LOCAL_WRITE)
            .expect("sndbuf registration");
        let params = ConnParams::new(
            local,
            peer,
            sndbuf.len() as u32,
            own.token,
            victim_rmb.token,
        );
        let conn = Conn::new(
            params,
            ConnConfig {
                update_policy: UpdatePolicy::linux(),
                ..ConnConfig::default()
            },
        )
        .expect("conn machine");
        let data = Arc::new(DataPath {
            conn: Mutex::new(conn),
            cond: Condvar::new(),
            link: link.clone(),
            rmb: own.buf.clone(),
            sndbuf,
            sndbuf_mr,
            peer_base: victim_rmb.base(),
            peer_rkey: victim_rmb.rkey,
            odd_cdcs: Mutex::new(Vec::new()),
        });
        let sink: Arc<dyn CdcSink> = data.clone();
        link.set_sink(Arc::downgrade(&sink));
        Session {
            tcp,
            link,
            victim_peer_id,
            victim_rmb,
            own,
            data,
        }
    }

    fn conn_error(c: &Conn) -> Option<io::Error> {
        c.error()
            .map(|e| io::Error::new(e.io_kind(), format!("attacker's connection: {e}")))
    }

    /// Writes through the data path (blocks on the window, up to `t` per step).
    pub fn write_all(&self, mut data: &[u8], t: Duration) -> io::Result<()> {
        let d = &self.data;
        let mut c = d.lock();
        let mut deadline = Instant::now() + t;
        while !data.is_empty() {
            if let Some(e) = Self::conn_error(&c) {
                return Err(e);
            }
            let regions = c
                .tx_space()
                .map_err(|e| io::Error::new(e.io_kind(), e.to_string()))?;
            let mut n = 0usize;
            for r in regions.as_slice() {
                let k = (r.len as usize).min(data.len() - n);
                if k == 0 {
                    break;
                }
                d.sndbuf.write(r.off as usize, &data[n..n + k]);
                n += k;
            }
            if n > 0 {
                c.tx_commit(n as u32, false)
                    .map_err(|e| io::Error::new(e.io_kind(), e.to_string()))?;
                data = &data[n..];
                d.drive(&mut c);
                deadline = Instant::now() + t;
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "write stalled"));
            }
            c = d.cond.wait_timeout(c, Duration::from_millis(20)).unwrap().0;
            d.drive(&mut c);
        }
        Ok(())
    }

    /// Reads what the victim wrote (0 at its end of stream; waits up to `t`).
    pub fn read(&self, buf: &mut [u8], t: Duration) -> io::Result<usize> {
        let d = &self.data;
        let mut c = d.lock();
        let deadline = Instant::now() + t;
        loop {
            let regions = c.rx_available();
            if !regions.is_empty() {
                let mut n = 0usize;
                for r in regions.as_slice() {
                    let k = (r.len as usize).min(buf.len() - n);
                    if k == 0 {
                        break;
                    }
                    d.rmb.read(r.off as usize, &mut buf[n..n + k]);
                    n += k;
                }
                c.rx_consume(n as u32)
                    .map_err(|e| io::Error::new(e.io_kind(), e.to_string()))?;
                d.drive(&mut c);
                return Ok(n);
            }
            if let Some(e) = Self::conn_error(&c) {
                return Err(e);
            }
            if c.rx_eof() {
                return Ok(0);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "read stalled"));
            }
            c = d.cond.wait_timeout(c, Duration::from_millis(20)).unwrap().0;
            d.drive(&mut c);
        }
    }

    /// Reads exactly `buf.len()` bytes.
    pub fn read_exact(&self, buf: &mut [u8], t: Duration) -> io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            let n = self.read(&mut buf[got..], t)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "victim closed",
                ));
            }
            got += n;
        }
        Ok(())
    }

    /// Sends `len` pattern bytes to an echoing victim and checks they come back intact.
    pub fn echo_check(&self, seed: u64, len: usize) -> io::Result<()> {
        let data = super::pattern(seed, len);
        let mut back = vec![0u8; len];
        let mut sent = 0;
        let mut got = 0;
        // Interleave writing and reading so that a small window cannot deadlock.
        while got < len {
            if sent < len {
                let k = (len - sent).min(16 * 1024);
                self.write_all(&data[sent..sent + k], Duration::from_secs(10))?;
                sent += k;
            }
            while got < sent {
                let n = self.read(&mut back[got..sent], Duration::from_secs(10))?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "victim closed",
                    ));
                }
                got += n;
            }
        }
        if back != data {
            let at = back.iter().zip(&data).position(|(a, b)| a != b);
            return Err(err(format!(
                "echo differs from what was sent (first at {at:?})"
            )));
        }
        Ok(())
    }

    /// Cursor bookkeeping of our side.
    pub fn snapshot(&self) -> Snapshot {
        self.data.lock().snapshot()
    }

    /// Whether our side of the connection saw an error (the victim aborted it, or the
    /// link broke).
    pub fn error(&self) -> Option<String> {
        self.data.lock().error().map(|e| e.to_string())
    }

    /// Waits until our side sees an error or end of stream from the victim.
    pub fn wait_ended(&self, t: Duration) -> bool {
        let d = &self.data;
        let end = Instant::now() + t;
        let mut c = d.lock();
        loop {
            if c.error().is_some() || c.rx_eof() || self.link.failed.load(Ordering::SeqCst) {
                return true;
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            c = d
                .cond
                .wait_timeout(c, (end - now).min(Duration::from_millis(20)))
                .unwrap()
                .0;
        }
    }

    /// A raw CDC to the victim: starts from what our side last sent (seqno, token,
    /// cursors), then `f` changes anything.
    pub fn raw_cdc(&self, f: impl FnOnce(&mut CdcRepr)) -> Result<(), smc_verbs::VerbsError> {
        let s = self.snapshot();
        let mut m = CdcRepr {
            seqno: s.tx_seq,
            token: self.victim_rmb.token,
            prod: s.tx_prod,
            cons: s.rx_cons_sent,
            prod_flags: ProducerFlags::empty(),
            conn_flags: ConnStateFlags::empty(),
        };
        f(&mut m);
        self.link.send(&m.to_bytes())
    }

    /// Geometry of the victim's RMB element.
    pub fn victim_geometry(&self) -> RmbeGeometry {
        RmbeGeometry::linux(self.victim_rmb.size.bytes() as u32).expect("geometry")
    }

    /// Sends `msg` as fast as the link takes it for `dur` (at most `max` times); every
    /// `cdc_every` messages (0: never) also a no-op CDC of our connection, so that the
    /// victim drives the connection (and wants send slots) in the middle of the flood.
    /// Returns how many went out.
    pub fn flood(&self, msg: &[u8], dur: Duration, max: u64, cdc_every: u64) -> u64 {
        let end = Instant::now() + dur;
        let mut n = 0u64;
        while Instant::now() < end && n < max {
            if self.link.try_send(msg) {
                n += 1;
                if cdc_every > 0 && n.is_multiple_of(cdc_every) {
                    let _ = self.raw_cdc(|_| {});
                }
            } else if self.link.failed.load(Ordering::SeqCst) {
                break;
            } else {
                std::thread::yield_now();
            }
        }
        n
    }

    /// The slow start of a flood of requests the victim answers, with our receives held
    /// (see [`RawLink::hold_receives`]): its answers stay in its send queue (RNR), so
    /// request by request its queue fills; a no-op CDC of our connection before each
    /// request makes the victim drive that connection (wanting send slots) at every step,
    /// up to the moment the queue is full. Returns the requests sent.
    pub fn clog(&self, msg: &[u8], first: u64, steps: u64) -> u64 {
        let mut n = 0;
        for _ in 0..first {
            if self.link.send(msg).is_err() {
                return n;
            }
            n += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
        for _ in 0..steps {
            if self.link.failed.load(Ordering::SeqCst) {
                break;
            }
            // One request at a time, with time for the victim's event thread to answer it
            // before the next CDC, so that no answer overtakes a step.
            let _ = self.raw_cdc(|_| {});
            std::thread::sleep(Duration::from_millis(2));
            if self.link.send(msg).is_err() {
                break;
            }
            n += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        n
    }

    /// Ends the attacker's link group the orderly way (DELETE LINK, all links).
    pub fn goodbye(&self) {
        let v2 = self.link.v2.load(Ordering::SeqCst);
        let _ = self
            .link
            .send_llc(&LlcMessage::DeleteLink(smc_wire::llc::DeleteLink {
                v2,
                response: false,
                all: true,
                orderly: true,
                link_num: 0,
                reason: smc_wire::llc::DeleteLinkReason::OP_INIT_TERM,
            }));
        let _ = self.link.quiesce(Duration::from_secs(2));
    }

    /// Orderly close of our side (CDC with C, then the TCP FIN).
    pub fn close(&self) {
        let mut c = self.data.lock();
        c.close(Instant::now());
        self.data.drive(&mut c);
        drop(c);
        let _ = self.tcp.shutdown(std::net::Shutdown::Both);
    }
}

/// The victim's link number of link 1 as its CONFIRM LINK named it.
pub fn link_num(l: &link::RawLink) -> u8 {
    l.link_num.load(Ordering::SeqCst) as u8
}

/// A Peer ID instance number no attacker of this process had before: random ones
/// collided now and then (1 in ~70 for 32 renewals), and a victim that still had a link
/// group with the earlier one made the next rendezvous a subsequent contact, which this
/// first-contact-only harness cannot do (the test then failed on a CONFIRM RKEY).
fn fresh_instance() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    // Odd numbers from a random start: 32,768 of them before one comes back.
    let _ = NEXT.compare_exchange(
        0,
        rand::random::<u16>() | 1,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    NEXT.fetch_add(2, Ordering::Relaxed) | 1
}
