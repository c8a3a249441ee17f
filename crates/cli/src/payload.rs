//! Verifiable bulk data: a seeded pseudo-random byte stream whose every byte depends on
//! its offset (so a lost, duplicated or reordered piece changes the SHA-256, and the
//! stream does not depend on how it is cut into writes), plus senders and receivers that
//! hash what they move.

use crate::net::Stream;
use sha2::{Digest, Sha256};
use std::io;
use std::time::{Duration, Instant};

/// Write size for bulk transfers (issue 4: "bulk throughput (64 KiB writes)").
pub const CHUNK: usize = 64 * 1024;

/// splitmix64 (Steele, Lea, Flood 2014): a bijective 64-bit mixer, cheap enough to
/// generate gigabytes; not cryptographic, which does not matter for test data.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The stream of seed `seed`: byte `o` is byte `o % 8` (little-endian) of
/// `mix(seed ^ mix(o / 8))`.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    seed: u64,
}

impl Pattern {
    /// The stream for `seed`.
    pub fn new(seed: u64) -> Self {
        Pattern { seed }
    }

    fn word(&self, index: u64) -> [u8; 8] {
        mix(self.seed ^ mix(index)).to_le_bytes()
    }

    /// Fills `buf` with the stream's bytes from `offset` on.
    pub fn fill(&self, offset: u64, buf: &mut [u8]) {
        let mut pos = 0usize;
        let mut off = offset;
        // Unaligned head, byte by byte.
        while pos < buf.len() && !off.is_multiple_of(8) {
            buf[pos] = self.word(off / 8)[(off % 8) as usize];
            pos += 1;
            off += 1;
        }
        let mut words = buf[pos..].chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.word(off / 8));
            off += 8;
        }
        for b in words.into_remainder() {
            *b = self.word(off / 8)[(off % 8) as usize];
            off += 1;
        }
    }

    /// SHA-256 of the first `len` bytes, without sending them.
    pub fn sha256(&self, len: u64) -> [u8; 32] {
        let mut h = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(CHUNK as u64) as usize;
            self.fill(off, &mut buf[..n]);
            h.update(&buf[..n]);
            off += n as u64;
        }
        h.finalize().into()
    }
}

/// What one direction of a transfer moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    /// Bytes.
    pub bytes: u64,
    /// SHA-256 of those bytes.
    pub sha256: [u8; 32],
    /// From the first byte written/read to the last.
    pub elapsed: Duration,
}

impl Moved {
    /// The hash in lower-case hex.
    pub fn hex(&self) -> String {
        hex(&self.sha256)
    }
    /// Bytes per second over `elapsed`.
    pub fn rate(&self) -> f64 {
        rate(self.bytes, self.elapsed)
    }
}

/// Bytes per second.
pub fn rate(bytes: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 {
        bytes as f64 / s
    } else {
        0.0
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}

/// Writes `len` bytes of `pattern` in [`CHUNK`]-sized writes, hashing them.
pub fn send_pattern<S: Stream>(s: &S, pattern: Pattern, len: u64) -> io::Result<Moved> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let start = Instant::now();
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(CHUNK as u64) as usize;
        pattern.fill(off, &mut buf[..n]);
        h.update(&buf[..n]);
        write_all(s, &buf[..n])?;
        off += n as u64;
    }
    Ok(Moved {
        bytes: len,
        sha256: h.finalize().into(),
        elapsed: start.elapsed(),
    })
}

/// Reads to end of stream, hashing. The clock starts at the first byte.
pub fn recv_hash<S: Stream>(s: &S) -> io::Result<Moved> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut bytes = 0u64;
    let mut start = None;
    loop {
        let n = read_retry(s, &mut buf)?;
        if n == 0 {
            break;
        }
        start.get_or_insert_with(Instant::now);
        h.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(Moved {
        bytes,
        sha256: h.finalize().into(),
        elapsed: start.map(|t| t.elapsed()).unwrap_or_default(),
    })
}

/// Copies everything read back to the same stream until end of stream, then half-closes.
/// Returns what was echoed (count and SHA-256: the listener's own check of what arrived).
pub fn echo<S: Stream>(s: &S) -> io::Result<Moved> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut bytes = 0u64;
    let start = Instant::now();
    loop {
        let n = read_retry(s, &mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        write_all(s, &buf[..n])?;
        bytes += n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    Ok(Moved {
        bytes,
        sha256: h.finalize().into(),
        elapsed: start.elapsed(),
    })
}

/// `read` that retries on `Interrupted`.
pub fn read_retry<S: Stream>(s: &S, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match s.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// `Write::write_all` for a shared stream.
pub fn write_all<S: Stream>(s: &S, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match s.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `Read::read_exact` for a shared stream.
pub fn read_exact<S: Stream>(s: &S, mut buf: &mut [u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match read_retry(s, buf)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => buf = &mut buf[n..],
        }
    }
    Ok(())
}

/// Parses sizes like `1073741824`, `64K`, `256M`, `1G`, `1GiB` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        _ => return Err(format!("bad size unit in {s:?} (K, M, G)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} too large"))
}

/// Parses a SHA-256 given in hex.
pub fn parse_sha256(s: &str) -> Result<[u8; 32], String> {
    let s = s.trim();
    if s.len() != 64 {
        return Err(format!("SHA-256 must be 64 hex digits, got {}", s.len()));
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("bad hex in SHA-256 {s:?}"))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{KernelTcp, Net};

    #[test]
    fn pattern_is_independent_of_cutting() {
        let p = Pattern::new(7);
        let mut whole = vec![0u8; 1000];
        p.fill(0, &mut whole);
        for cut in [1usize, 3, 8, 13, 999] {
            let mut parts = vec![0u8; 1000];
            let (a, b) = parts.split_at_mut(cut);
            p.fill(0, a);
            p.fill(cut as u64, b);
            assert_eq!(parts, whole, "cut at {cut}");
        }
        // Different seeds and different offsets give different bytes.
        let mut other = vec![0u8; 1000];
        Pattern::new(8).fill(0, &mut other);
        assert_ne!(other, whole);
        let mut shifted = vec![0u8; 1000];
        p.fill(8, &mut shifted);
        assert_ne!(shifted, whole);
    }

    #[test]
    fn sizes_and_hashes_parse() {
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("12"), Ok(12));
        assert!(parse_size("1T").is_err());
        assert!(parse_size("x").is_err());
        let h = Pattern::new(1).sha256(100);
        assert_eq!(parse_sha256(&hex(&h)), Ok(h));
        assert!(parse_sha256("abc").is_err());
    }

    #[test]
    fn echo_over_tcp_returns_the_hash_sent() {
        let l = KernelTcp.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            echo(&s).unwrap()
        });
        let c = KernelTcp.connect(addr).unwrap();
        let len = 3 * CHUNK as u64 + 5;
        let (sent, got) = std::thread::scope(|sc| {
            let r = sc.spawn(|| recv_hash(&c).unwrap());
            let sent = send_pattern(&c, Pattern::new(42), len).unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            (sent, r.join().unwrap())
        });
        let echoed = server.join().unwrap();
        assert_eq!(echoed.bytes, len);
        assert_eq!(echoed.sha256, sent.sha256);
        assert_eq!(sent.bytes, len);
        assert_eq!(got.bytes, len);
        assert_eq!(got.sha256, sent.sha256);
        assert_eq!(sent.sha256, Pattern::new(42).sha256(len));
    }
}
