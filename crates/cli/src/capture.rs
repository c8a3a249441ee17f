//! Reading pcap and pcapng files into numbered, timestamped link-layer frames.

use anyhow::{bail, Context, Result};
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::DataLink;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::time::Duration;

/// Link-layer framing of a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    /// Ethernet II.
    Ethernet,
    /// Raw IPv4/IPv6.
    RawIp,
    /// Linux cooked capture (SLL).
    LinuxSll,
    /// Anything else (frames are skipped).
    Other(u32),
}

impl From<DataLink> for LinkType {
    fn from(d: DataLink) -> Self {
        match d {
            DataLink::ETHERNET => LinkType::Ethernet,
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => LinkType::RawIp,
            DataLink::LINUX_SLL => LinkType::LinuxSll,
            other => LinkType::Other(u32::from(other)),
        }
    }
}

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// 1-based frame number, as Wireshark counts.
    pub number: u64,
    /// Capture timestamp.
    pub time: Duration,
    /// Link-layer type.
    pub link: LinkType,
    /// Frame bytes.
    pub data: Vec<u8>,
}

enum Inner {
    Pcap(PcapReader<BufReader<File>>),
    PcapNg(PcapNgReader<BufReader<File>>),
}

/// Iterates over the frames of a pcap or pcapng file.
pub struct Capture {
    inner: Inner,
    next_number: u64,
    link: LinkType,
    /// pcapng: link type per interface, in order of the interface description blocks.
    ng_links: Vec<LinkType>,
    failed: bool,
}

impl Capture {
    /// Opens a capture, detecting pcap vs pcapng by magic number.
    pub fn open(path: &Path) -> Result<Capture> {
        let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut magic = [0u8; 4];
        f.read_exact(&mut magic)
            .with_context(|| format!("{}: too short for a capture file", path.display()))?;
        f.seek(SeekFrom::Start(0))?;
        let r = BufReader::new(f);
        let (inner, link) = match magic {
            [0x0a, 0x0d, 0x0d, 0x0a] => {
                let r = PcapNgReader::new(r)
                    .with_context(|| format!("{}: bad pcapng header", path.display()))?;
                (Inner::PcapNg(r), LinkType::Other(u32::MAX))
            }
            [0xd4, 0xc3, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0xc3, 0xd4]
            | [0x4d, 0x3c, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0x3c, 0x4d] => {
                let r = PcapReader::new(r)
                    .with_context(|| format!("{}: bad pcap header", path.display()))?;
                let link = LinkType::from(r.header().datalink);
                (Inner::Pcap(r), link)
            }
            _ => bail!("{}: not a pcap or pcapng file", path.display()),
        };
        Ok(Capture {
            inner,
            next_number: 1,
            link,
            ng_links: Vec::new(),
            failed: false,
        })
    }

    /// The next frame; `Some(Err)` once if the file is damaged part-way, then `None`.
    pub fn next_frame(&mut self) -> Option<Result<Frame>> {
        if self.failed {
            return None;
        }
        let number = self.next_number;
        let res = match &mut self.inner {
            Inner::Pcap(r) => match r.next_packet()? {
                Ok(p) => Ok(Frame {
                    number,
                    time: p.timestamp,
                    link: self.link,
                    data: p.data.into_owned(),
                }),
                Err(e) => Err(e.into()),
            },
            Inner::PcapNg(r) => loop {
                // Blocks borrow the reader, so copy what we need out of them first.
                let (iface, time, data) = match r.next_block()? {
                    Ok(Block::InterfaceDescription(i)) => {
                        self.ng_links.push(i.linktype.into());
                        continue;
                    }
                    Ok(Block::EnhancedPacket(p)) => {
                        (p.interface_id as usize, p.timestamp, p.data.into_owned())
                    }
                    Ok(Block::SimplePacket(p)) => (0, Duration::ZERO, p.data.into_owned()),
                    Ok(_) => continue,
                    Err(e) => break Err(e.into()),
                };
                let link = self
                    .ng_links
                    .get(iface)
                    .copied()
                    .unwrap_or(LinkType::Other(u32::MAX));
                break Ok(Frame {
                    number,
                    time,
                    link,
                    data,
                });
            },
        };
        match &res {
            Ok(_) => self.next_number += 1,
            Err(_) => self.failed = true,
        }
        Some(
            res.map_err(|e: anyhow::Error| e.context(format!("capture damaged at frame {number}"))),
        )
    }
}
