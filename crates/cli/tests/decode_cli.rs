//! `smc decode` as a user runs it: on the Linux capture (counts match tshark's census, no
//! errors), on deliberately corrupted captures (malformed messages reported with frame number
//! and field, decoding keeps going, exit 0), on pcapng, and on unreadable files (exit ≠ 0).

use pcap_file::pcap::{PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
use pcap_file::pcapng::{Block, PcapNgWriter};
use pcap_file::DataLink;
use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/pcaps")
        .join(name)
}

/// A temporary file removed when dropped (also when the test fails).
struct Tmp(PathBuf);

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl std::ops::Deref for Tmp {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

fn tmp(name: &str) -> Tmp {
    Tmp(std::env::temp_dir().join(format!("smc-decode-{}-{name}", std::process::id())))
}

fn decode(path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_smc"))
        .arg("decode")
        .arg(path)
        .output()
        .expect("run smc")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn count(out: &str, needle: &str) -> usize {
    out.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn decodes_the_linux_capture_like_tshark_counts_it() {
    let o = decode(&fixture("k612-pair.pcap"));
    assert!(o.status.success());
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 138, "one line per SMC message");
    assert_eq!(count(&out, "MALFORMED"), 0);
    // tshark census (k612-pair.census.txt): 6 ExID, 3 of each CLC type, 77 CDC, 46 LLC v2.
    assert_eq!(count(&out, "SMC-R option"), 6);
    assert_eq!(count(&out, "CLC Proposal v2"), 3);
    assert_eq!(count(&out, "CLC Accept v2"), 3);
    assert_eq!(count(&out, "CLC Confirm v2"), 3);
    assert_eq!(count(&out, " CDC seq="), 77);
    assert_eq!(count(&out, "LLC DELETE LINK v2 request"), 16);
    assert_eq!(count(&out, "LLC DELETE RKEY v2"), 12);
    assert_eq!(count(&out, "LLC CONFIRM RKEY v2"), 8);
    assert_eq!(count(&out, "LLC TEST LINK v2"), 6);
    assert_eq!(count(&out, "LLC CONFIRM LINK v2"), 2);
    assert_eq!(count(&out, "LLC ADD LINK v2"), 2);
    // Key fields, frame numbers and directions as tshark shows them.
    assert!(
        out.contains("    11 10.99.0.2:47298 → 10.99.0.1:5000 CLC Proposal v2 offers v1=none v2=R")
    );
    assert!(out.contains("eids=[SMC-PEER-TEST] roce_gid=::ffff:10.99.0.2"));
    assert!(out.contains("qpn=0x000011 rkey=0x362 rmbe_idx=1 token=0x1 rmbe=64KiB mtu=1024"));
    assert!(out.contains("host=smc-server os=Linux release=1 direct"));
    assert!(out.contains("reason=0x00020000 OP_INIT_TERM all"));
    assert!(out.contains("rtokens=[0x362->0x54f@0xff22f8b0837a0000]"));
    let first = out.lines().next().unwrap();
    assert!(first.starts_with("   2.097842      8 10.99.0.2:47298 → 10.99.0.1:5000 TCP SYN"));
}

#[test]
fn no_false_positives_on_plain_rdma_traffic() {
    // ibv_rc_pingpong / perftest between two Linux rxe peers: SENDs, but no SMC.
    let o = decode(&fixture("verbs-pair.pcap"));
    assert!(o.status.success());
    assert_eq!(stdout(&o), "");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("0 SMC messages, 0 malformed, 500 non-SMC SENDs"),
        "{err}"
    );
}

/// Rewrites a capture, letting `edit` change the bytes of selected frames (1-based).
fn rewrite(src: &Path, dst: &Path, mut edit: impl FnMut(u64, &mut Vec<u8>)) {
    let mut r = PcapReader::new(File::open(src).unwrap()).unwrap();
    let mut w = PcapWriter::with_header(File::create(dst).unwrap(), r.header()).unwrap();
    let mut n = 0;
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        n += 1;
        let mut data = p.data.into_owned();
        edit(n, &mut data);
        w.write_packet(&PcapPacket::new(p.timestamp, data.len() as u32, &data))
            .unwrap();
    }
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle in frame")
}

#[test]
fn reports_corruption_with_frame_and_field_and_keeps_going() {
    let path = tmp("corrupt.pcap");
    const ROCE_PAYLOAD: usize = 14 + 20 + 8 + 12; // Ethernet, IPv4, UDP, BTH
    rewrite(&fixture("k612-pair.pcap"), &path, |n, d| match n {
        // Proposal: eid_cnt 1 → 9 (v2 extension at CLC offset 80).
        11 => {
            let clc = find(d, &[0xe2, 0xd4, 0xc3, 0xd9, 0x01]);
            d[clc + 80] = 9;
        }
        // CONFIRM LINK v2 request: type 0x21 → 0x2a (undefined mandatory opcode).
        17 => d[ROCE_PAYLOAD] = 0x2a,
        // First CDC: length byte 44 → 48.
        26 => d[ROCE_PAYLOAD + 1] = 48,
        // Second connection's Accept: trailer eye catcher damaged.
        59 => {
            let clc = find(d, &[0xe2, 0xd4, 0xc3, 0xd9, 0x02]);
            d[clc + 107] = 0;
        }
        _ => {}
    });
    let o = decode(&path);
    assert!(
        o.status.success(),
        "malformed input is not a command failure"
    );
    let out = stdout(&o);
    let bad: Vec<&str> = out.lines().filter(|l| l.contains("MALFORMED")).collect();
    assert_eq!(bad.len(), 4, "{bad:#?}");
    assert!(bad[0].contains("    11 ") && bad[0].contains("eid_cnt = 9 out of range"));
    assert!(bad[0].contains("ProtocolErrorReset"));
    assert!(bad[1].contains("    17 ") && bad[1].contains("unknown LLC message type 0x2a"));
    assert!(bad[1].contains("LinkDown"));
    assert!(bad[2].contains("    26 ") && bad[2].contains("CDC message: length 48, expected 44"));
    assert!(bad[2].contains("Discard"));
    assert!(bad[3].contains("    59 ") && bad[3].contains("bad trailer eye catcher"));
    // Everything else still decodes: 138 lines in all.
    assert_eq!(out.lines().count(), 138);
    assert_eq!(count(&out, " CDC seq="), 76);
}

#[test]
fn truncated_capture_reports_and_stops() {
    let src = std::fs::read(fixture("smc_clc.pcap")).unwrap();
    let path = tmp("truncated.pcap");
    std::fs::write(&*path, &src[..src.len() - 10]).unwrap();
    let o = decode(&path);
    assert!(o.status.success());
    let out = stdout(&o);
    assert!(out.contains("error: capture damaged at frame 11"), "{out}");
    assert_eq!(count(&out, "CLC "), 4, "frames before the damage decoded");
}

#[test]
fn unreadable_files_fail() {
    let o = decode(Path::new("/nonexistent/x.pcap"));
    assert!(!o.status.success());
    let path = tmp("garbage.pcap");
    std::fs::write(&*path, b"this is not a capture").unwrap();
    let o = decode(&path);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a pcap or pcapng file"));
}

#[test]
fn pcapng_works_too() {
    let path = tmp("clc.pcapng");
    let mut r = PcapReader::new(File::open(fixture("smc_clc.pcap")).unwrap()).unwrap();
    let mut w = PcapNgWriter::new(File::create(&*path).unwrap()).unwrap();
    w.write_block(&Block::InterfaceDescription(
        InterfaceDescriptionBlock::new(DataLink::ETHERNET, 65535),
    ))
    .unwrap();
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        let epb = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: p.timestamp,
            original_len: p.data.len() as u32,
            data: Cow::Owned(p.data.into_owned()),
            options: vec![],
        };
        w.write_block(&Block::EnhancedPacket(epb)).unwrap();
    }
    drop(w);
    let ng = stdout(&decode(&path));
    let classic = stdout(&decode(&fixture("smc_clc.pcap")));
    assert_eq!(ng, classic);
    assert_eq!(ng.lines().count(), 9);
    assert!(ng.contains("reason=0x03030000 NOSMCDEV"));
}
