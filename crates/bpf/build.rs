//! Compiles the sock_ops program (bpf/smc_option.bpf.c) with clang into
//! `$OUT_DIR/smc_option.bpf.o`, which src/loader.rs embeds.
//!
//! Needs clang (BPF target) and the libbpf headers (Debian: clang, libbpf-dev,
//! linux-libc-dev; `scripts/setup.sh` installs them). `SMC_BPF_CLANG`
//! overrides the compiler.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn multiarch_include() -> Option<String> {
    // <linux/bpf.h> includes <asm/types.h>, which Debian keeps under the
    // host's multiarch directory; the BPF target does not search it.
    let out = Command::new("gcc").arg("-print-multiarch").output().ok()?;
    let triple = String::from_utf8(out.stdout).ok()?.trim().to_string();
    if triple.is_empty() {
        return None;
    }
    let dir = format!("/usr/include/{triple}");
    std::path::Path::new(&dir).is_dir().then_some(dir)
}

fn main() {
    let src = "bpf/smc_option.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=SMC_BPF_CLANG");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"))
        .join("smc_option.bpf.o");
    let clang = env::var("SMC_BPF_CLANG").unwrap_or_else(|_| "clang".to_string());

    let mut cmd = Command::new(&clang);
    cmd.args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"]);
    if let Some(dir) = multiarch_include() {
        cmd.arg(format!("-I{dir}"));
    }
    cmd.args(["-c", src, "-o"]).arg(&out);
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("smc-bpf: cannot run `{clang}` to build {src}: {e} (run scripts/setup.sh: it installs clang and libbpf-dev)")
    });
    if !status.success() {
        panic!(
            "smc-bpf: `{clang}` failed to compile {src} ({status}); see the compiler output above"
        );
    }
}
