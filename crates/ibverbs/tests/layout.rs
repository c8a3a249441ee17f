//! The hand-declared libibverbs structures (`src/ffi.rs`) against the installed
//! `<infiniband/verbs.h>`: a C program prints every size and offset the provider relies
//! on, and each must equal the Rust declaration. rdma-core's headers come from Debian's
//! libibverbs-dev (installed by scripts/setup.sh); they are needed only for this test,
//! never to build the provider.

use std::path::Path;
use std::process::Command;

#[test]
fn ffi_layout_matches_verbs_h() {
    let header = Path::new("/usr/include/infiniband/verbs.h");
    if !header.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} is missing: scripts/setup.sh installs libibverbs-dev",
            header.display()
        );
        eprintln!(
            "SKIP: {} missing (apt-get install libibverbs-dev)",
            header.display()
        );
        return;
    }
    let facts = smc_ibverbs::ffi::layout_facts();
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for (expr, _) in &facts {
        c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("smc-ibverbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "compiling the layout probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let got: Vec<usize> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(got.len(), facts.len());
    let bad: Vec<String> = facts
        .iter()
        .zip(&got)
        .filter(|((_, rust), c)| rust != *c)
        .map(|((e, rust), c)| format!("{e}: Rust {rust}, C {c}"))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
}

#[test]
fn loads_libibverbs_when_installed_and_reports_a_missing_one() {
    // The real library loads where rdma-core is installed (setup.sh installs it).
    let have = [
        "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
        "/usr/lib64/libibverbs.so.1",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    if have {
        let api = smc_ibverbs::ffi::Api::load("libibverbs.so.1");
        assert!(api.is_ok(), "{:?}", api.err());
    }
    let e = smc_ibverbs::ffi::Api::load("/nonexistent/libibverbs.so.1")
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("cannot load /nonexistent/libibverbs.so.1"),
        "{e}"
    );
    // A library that is not libibverbs lacks its symbols.
    if Path::new("/lib/x86_64-linux-gnu/libm.so.6").exists() {
        let e = smc_ibverbs::ffi::Api::load("libm.so.6").err().unwrap();
        assert!(
            e.to_string().contains("has no symbol ibv_get_device_list"),
            "{e}"
        );
    }
}
