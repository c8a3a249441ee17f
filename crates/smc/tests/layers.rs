//! The crate graph is the layer diagram (docs/architecture.md): checked with
//! `cargo tree`, normal (non-dev, non-build) dependencies only, so that a program
//! using the SMC-R runtime links no RDMA provider and no libbpf unless it chooses to, and
//! the protocol crate stays free of I/O.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Names of every package `root` links: its normal dependencies, transitively, with the
/// features a build of `root` alone activates (`cargo tree -p`, as `cargo build -p`;
/// `cargo metadata` would unify features over the whole workspace).
fn normal_closure(root: &str) -> BTreeSet<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", root])
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let names: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != root)
        .map(str::to_string)
        .collect();
    assert!(
        !names.is_empty(),
        "no dependencies listed for {root}: {text}"
    );
    names
}

const BELOW_THE_RUNTIME: &[&str] = &[
    "smc-softroce",
    "smc-iwarp",
    "smc-ibverbs",
    "smc-providers",
    "smc-bpf",
    "libbpf-rs",
    "libbpf-sys",
];

#[test]
fn the_runtime_links_no_provider_and_no_libbpf() {
    let deps = normal_closure("smc");
    assert!(
        deps.contains("smc-proto") && deps.contains("smc-verbs"),
        "{deps:?}"
    );
    for bad in BELOW_THE_RUNTIME {
        assert!(!deps.contains(*bad), "smc depends on {bad}: {deps:?}");
    }
}

#[test]
fn the_protocol_crate_links_no_io() {
    let deps = normal_closure("smc-proto");
    for bad in BELOW_THE_RUNTIME.iter().chain(&[
        "smc",
        "smc-verbs",
        "libc",
        "getrandom",
        "socket2",
        "rustix",
        "tokio",
    ]) {
        assert!(!deps.contains(*bad), "smc-proto depends on {bad}: {deps:?}");
    }
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_protocol_crate_does_no_io_threads_or_clock_reads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/src");
    let mut files = Vec::new();
    sources(&dir, &mut files);
    assert!(files.len() > 20, "found only {files:?}");
    // `Instant` as a type is fine (time is an input); reading the clock is not.
    let banned = [
        "std::net",
        "std::thread",
        "std::fs",
        "std::process",
        "libc::",
        "Instant::now",
        "SystemTime::now",
        "thread_rng",
        "rand::rng()",
    ];
    let mut hits = Vec::new();
    for f in &files {
        // Tests and the seeded simulators (feature `testing`) take an arbitrary start
        // instant; the protocol itself never reads the clock.
        let rel = f
            .strip_prefix(&dir)
            .unwrap_or(f)
            .to_string_lossy()
            .into_owned();
        if rel.contains("tests/") || rel.ends_with("tests.rs") || rel.contains("sim") {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("read");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for b in banned {
                if code.contains(b) {
                    hits.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(hits.is_empty(), "I/O in smc-proto:\n{}", hits.join("\n"));
}

/// The crate graph drawn in docs/architecture.md (its mermaid block) is the one the
/// manifests declare: every workspace crate, and exactly its normal dependencies on other
/// workspace crates (optional ones as the default features enable them). The ASCII
/// picture names every crate.
#[test]
fn the_picture_is_the_crate_graph() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--workspace",
            "--no-dedupe",
            "-e",
            "normal",
            "--depth",
            "1",
            "--prefix",
            "depth",
            "--format",
            "{p}",
        ])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    // "0name v..." starts a workspace crate, "1name v..." is one of its dependencies.
    let mut members = BTreeSet::new();
    let mut deps: Vec<(String, String)> = Vec::new();
    let mut current = String::new();
    for l in text.lines() {
        let name = |s: &str| s.split_whitespace().next().unwrap_or("").to_string();
        if let Some(rest) = l.strip_prefix('0') {
            current = name(rest);
            members.insert(current.clone());
        } else if let Some(rest) = l.strip_prefix('1') {
            deps.push((current.clone(), name(rest)));
        }
    }
    let manifest: BTreeSet<(String, String)> = deps
        .into_iter()
        .filter(|(_, to)| members.contains(to))
        .collect();

    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("read the doc");
    let mermaid = doc
        .split("```mermaid")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a mermaid block in docs/architecture.md");
    // Nodes: `id["crate-name<br/>what"]`; edges: `a --> b` or `a -.->|"label"| b`.
    let mut nodes = std::collections::BTreeMap::new();
    let mut edges = Vec::new();
    for l in mermaid.lines().map(str::trim) {
        if let Some((id, rest)) = l.split_once("[\"") {
            let name = rest.split(['<', '"']).next().unwrap_or("");
            nodes.insert(id.trim().to_string(), name.to_string());
        } else if l.contains("-->") || l.contains(".->") {
            let words: Vec<&str> = l.split_whitespace().collect();
            edges.push((words[0].to_string(), words[words.len() - 1].to_string()));
        }
    }
    let drawn: BTreeSet<(String, String)> = edges
        .iter()
        .map(|(a, b)| {
            let n = |id: &String| nodes.get(id).cloned().unwrap_or_else(|| id.clone());
            (n(a), n(b))
        })
        .collect();
    let named: BTreeSet<String> = nodes.values().cloned().collect();
    assert_eq!(named, members, "crates in the picture vs the workspace");
    let missing: Vec<_> = manifest.difference(&drawn).collect();
    let extra: Vec<_> = drawn.difference(&manifest).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/architecture.md: edges missing from the picture {missing:?}, drawn but not in the manifests {extra:?}"
    );
    let ascii = doc
        .split("The same for a terminal")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("the ASCII picture");
    // A crate name as a whole word ("smc" is part of every other name).
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    for m in &members {
        let shown = ascii.match_indices(m.as_str()).any(|(i, _)| {
            let before = ascii[..i].chars().next_back();
            let after = ascii[i + m.len()..].chars().next();
            !before.is_some_and(is_name_char) && !after.is_some_and(is_name_char)
        });
        assert!(shown, "the ASCII picture does not show {m}");
    }
}
