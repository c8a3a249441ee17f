#!/usr/bin/env bash
# Installs what building and testing smc-rs needs on a fresh Debian machine.
# Idempotent; quiet when everything is present. Needs root for apt-get.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have tshark   || need+=(tshark)
have clang    || need+=(clang llvm)
have bpftool  || need+=(bpftool)
have ip       || need+=(iproute2)
have tc       || need+=(iproute2)
have tcpdump  || need+=(tcpdump)
have nc       || need+=(netcat-openbsd)
# tests/system/smc-fallback.sh: a plain HTTP client against `smc listen`.
have curl     || need+=(curl)
# tests/system/smc-run.sh: unmodified programs under `smc run`.
have redis-server    || need+=(redis-server)
have redis-benchmark || need+=(redis-tools)
have iperf3   || need+=(iperf3)
# tests/system/smc-run-programs.sh: more unmodified programs under `smc run` (nginx is
# installed without starting its service: policy-rc.d or not, the test runs its own).
have nginx    || need+=(nginx)
have wrk      || need+=(wrk)
have sockperf || need+=(sockperf)
have ncat     || need+=(ncat)
have python3  || need+=(python3)
# tests/system/roce-netem.sh: loss/duplication with nftables when the kernel has no sch_netem.
have nft      || need+=(nftables)
have pkg-config || need+=(pkg-config)
[ -e /usr/include/bpf/libbpf.h ] || need+=(libbpf-dev)
[ -e /usr/include/gelf.h ]       || need+=(libelf-dev)
[ -e /usr/include/zlib.h ]       || need+=(zlib1g-dev)
# smc-bpf: build.rs compiles the sock_ops program (clang, <linux/bpf.h>,
# <bpf/bpf_helpers.h>); libbpf-sys builds its vendored libbpf with make and
# cc; the system test uses nsenter/setpriv (util-linux).
have make     || need+=(make)
have gcc      || need+=(gcc)
have nsenter  || need+=(util-linux)
[ -e /usr/include/linux/bpf.h ]  || need+=(linux-libc-dev)
# smc-ibverbs: tests/layout.rs checks its hand-declared structures against rdma-core's
# verbs.h (the provider itself loads libibverbs.so.1 at run time and needs no headers).
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)

# Linux kernel peer in QEMU (tests/kernel-peer); the VM's own packages (kernel,
# busybox, rdma-core, perftest) are downloaded by the harness into its cache.
have qemu-system-x86_64 || need+=(qemu-system-x86)
have cpio     || need+=(cpio)
have depmod   || need+=(kmod)
have xz       || need+=(xz-utils)
have zstd     || need+=(zstd)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
# RDMA_DEV=siw (tests/system/iwarp-siw.sh): Debian builds no siw, the harness compiles
# siw.ko from the kernel source (it installs the matching linux-headers itself).
[ -e /usr/src/linux-source-6.12.tar.xz ] || need+=(linux-source-6.12)
compgen -G '/usr/src/linux-headers-6.12.*-amd64' >/dev/null || need+=(linux-headers-6.12-amd64)

if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

# Independent RoCEv2 ICRC checker used by the tests (scapy's RoCE layer).
python3 -c 'import scapy' 2>/dev/null || pip install -q scapy >/dev/null 2>&1 || \
  echo "setup: warning: could not install scapy; ICRC cross-checks will be skipped" >&2

# tests/system/fuzz-smoke.sh: cargo-fuzz from crates.io (builds its targets on stable
# without a sanitizer when no nightly toolchain is installed; see scripts/fuzz.sh).
cargo fuzz --version >/dev/null 2>&1 || cargo install --locked -q cargo-fuzz >/dev/null 2>&1 || \
  echo "setup: warning: could not install cargo-fuzz; the fuzz smoke test will be skipped" >&2
