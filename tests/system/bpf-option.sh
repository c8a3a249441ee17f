#!/usr/bin/env bash
# System test of smc-bpf (issue 5): the RFC 7609 SMC-R TCP option written by
# the eBPF sock_ops program, seen on the wire between two network namespaces.
#
# Client and server namespaces are joined by a veth pair; tcpdump captures
# the server side and tshark decodes the SYN/SYN-ACK options. The program is
# installed under a private pin directory and attached to a private cgroup,
# so nothing else on the machine is affected; everything is removed on exit.
#
# Exit: 0 pass, 77 skip (not root, no eBPF sock_ops support, missing tools),
# anything else fail. With CI=true a missing tool is a failure, not a skip.
set -uo pipefail
cd "$(dirname "$0")/../.."

skip() {
  if [ "${CI:-}" = true ] && [ "${2:-}" != always ]; then
    echo "FAIL (CI): cannot run: $1"; exit 1
  fi
  echo "SKIP: $1"; exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, eBPF)" always
for t in ip tcpdump tshark nsenter python3 setpriv bpftool clang gcc; do
  command -v "$t" >/dev/null || skip "missing $t (run scripts/setup.sh)"
done
python3 -c 'import scapy' 2>/dev/null || skip "missing python scapy (run scripts/setup.sh)"
# No eBPF sock_ops support in this kernel or container: a skip even in CI.
FEATURES=$(bpftool feature probe kernel 2>/dev/null)
grep -q "program_type sock_ops is available" <<<"$FEATURES" \
  || skip "kernel has no eBPF sock_ops program support" always
CG_ROOT=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
[ -n "$CG_ROOT" ] || skip "no cgroup2 filesystem mounted" always

BIN=${CARGO_TARGET_DIR:-target}/release
if [ ! -x "$BIN/smc" ] || [ ! -x "$BIN/smc-bpf-probe" ]; then
  cargo build --release -q -p smc-cli -p smc-bpf --bins || { echo "FAIL: build"; exit 1; }
fi
BPF=("$BIN/smc" bpf); PROBE="$BIN/smc-bpf-probe"

ID=$$
NS_C=smcb-c-$ID; NS_S=smcb-s-$ID
PIN=/sys/fs/bpf/smc-bpf-test-$ID
CG=$CG_ROOT/smc-bpf-test-$ID
WORK=$(mktemp -d /tmp/smc-bpf-test.XXXXXX)
PCAP=$WORK/cap.pcap
PIDS=()
# `install --group` may add o+x to the bpffs mount point: restore it on exit.
BPFFS_MODE=$(stat -c %a /sys/fs/bpf 2>/dev/null)
BPFFS_WAS=$(stat -f -c %T /sys/fs/bpf 2>/dev/null)

cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  "${BPF[@]}" uninstall --pin-dir "$PIN" >/dev/null 2>&1 || rm -rf "$PIN"
  if [ -e "${HOG_PIN:-}" ]; then
    bpftool cgroup detach "$HOG_CG" sock_ops pinned "$HOG_PIN" 2>/dev/null
    rm -f "$HOG_PIN"
  fi
  ip netns del "$NS_C" 2>/dev/null
  ip netns del "$NS_S" 2>/dev/null
  local cg
  for cg in "$CG/hog" "$CG"; do
    [ -d "$cg" ] || continue
    # Move any straggler back to the root before removing the cgroup.
    while read -r p; do echo "$p" > "$CG_ROOT/cgroup.procs" 2>/dev/null; done < "$cg/cgroup.procs"
    rmdir "$cg" 2>/dev/null
  done
  # (When install mounted it, it stays mounted, with install's mode 0700.)
  if [ "$BPFFS_WAS" = bpf_fs ] && [ -n "$BPFFS_MODE" ]; then chmod "$BPFFS_MODE" /sys/fs/bpf
  elif [ "$(stat -f -c %T /sys/fs/bpf 2>/dev/null)" = bpf_fs ]; then chmod 700 /sys/fs/bpf; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
ok() { echo "ok: $*"; }

# --- set-up: namespaces, veth, cgroup, install -------------------------------
ip netns add "$NS_C" && ip netns add "$NS_S" || { echo "FAIL: netns"; exit 1; }
ip link add vc type veth peer name vs || { echo "FAIL: veth"; exit 1; }
ip link set vc netns "$NS_C"; ip link set vs netns "$NS_S"
ip -n "$NS_C" addr add 10.231.0.1/24 dev vc
ip -n "$NS_S" addr add 10.231.0.2/24 dev vs
ip -n "$NS_C" addr add fd00:231::1/64 dev vc nodad
ip -n "$NS_S" addr add fd00:231::2/64 dev vs nodad
for n in "$NS_C" "$NS_S"; do ip -n "$n" link set lo up; done
ip -n "$NS_C" link set vc up; ip -n "$NS_S" link set vs up
# TCP Fast Open: client and server roles in both namespaces.
for n in "$NS_C" "$NS_S"; do ip netns exec "$n" sysctl -qw net.ipv4.tcp_fastopen=3; done
mkdir "$CG" || { echo "FAIL: cannot create cgroup $CG"; exit 1; }

if ! "${BPF[@]}" install --cgroup "$CG" --pin-dir "$PIN" > "$WORK/install.txt" 2>&1; then
  cat "$WORK/install.txt"; echo "FAIL: install"; exit 1
fi
grep -q "^installed: $PIN" "$WORK/install.txt" && grep -q "cgroup $CG " "$WORK/install.txt" \
  && ok "install attached to $CG" || { cat "$WORK/install.txt"; fail "install status"; }

# The space hog for the "no option space" cases: compiled and attached to a
# child cgroup here, with clang and bpftool.
HOG_CG=$CG/hog
HOG_PIN=/sys/fs/bpf/smc-bpf-hog-$ID
mkdir "$HOG_CG" || { echo "FAIL: cannot create cgroup $HOG_CG"; exit 1; }
clang -target bpf -O2 -g -Wall -I"/usr/include/$(gcc -print-multiarch)" \
  -c tests/system/bpf-space-hog.bpf.c -o "$WORK/hog.o" \
  && bpftool prog load "$WORK/hog.o" "$HOG_PIN" type sockops \
  && bpftool cgroup attach "$HOG_CG" sock_ops pinned "$HOG_PIN" multi \
  || { echo "FAIL: cannot build/attach the space hog"; exit 1; }

# Runs "$@" inside namespace $1, in the test cgroup (so the program sees it).
in_ns() {
  local ns=$1; shift
  bash -c 'echo $$ > "$0/cgroup.procs" && exec nsenter --net=/run/netns/"$1" "${@:2}"' "$CG" "$ns" "$@"
}

ip netns exec "$NS_S" tcpdump -i vs -U -s 200 -w "$PCAP" tcp >/dev/null 2>"$WORK/tcpdump.err" &
PIDS+=($!)
for _ in $(seq 50); do grep -q "listening on" "$WORK/tcpdump.err" 2>/dev/null && break; sleep 0.1; done

# run_case NAME ADDR_SERVER SERVER_ARGS CLIENT_ARGS [COUNT]
# Starts a server (in cgroup $S_CG, default $CG), runs COUNT clients (in
# $C_CG, default $CG), leaves outputs in $WORK/NAME.{srv,cli}
# and the port in $WORK/NAME.port.
run_case() {
  local name=$1 host=$2 sargs=$3 cargs=$4 count=${5:-1} listen port i
  case $host in *:*) listen="[$host]:0" ;; *) listen="$host:0" ;; esac
  # shellcheck disable=SC2086
  timeout 30 bash -c 'echo $$ > "$0/cgroup.procs" && exec nsenter --net=/run/netns/"$1" "${@:2}"' \
    "${S_CG:-$CG}" "$NS_S" "$PROBE" --pin-dir "$PIN" server --listen "$listen" --count "$count" $sargs \
    > "$WORK/$name.srv" 2>&1 &
  local sp=$!
  for _ in $(seq 100); do grep -q "^listening" "$WORK/$name.srv" 2>/dev/null && break; sleep 0.05; done
  port=$(sed -n 's/^listening port=//p' "$WORK/$name.srv")
  echo "$port" > "$WORK/$name.port"
  : > "$WORK/$name.cli"
  for i in $(seq "$count"); do
    # shellcheck disable=SC2086
    timeout 20 bash -c 'echo $$ > "$0/cgroup.procs" && exec nsenter --net=/run/netns/"$1" "${@:2}"' \
      "${C_CG:-$CG}" "$NS_C" "$PROBE" --pin-dir "$PIN" client --connect "$(fmt_addr "$host" "$port")" $cargs \
      >> "$WORK/$name.cli" 2>&1
  done
  wait "$sp"
}
fmt_addr() { case $1 in *:*) echo "[$1]:$2" ;; *) echo "$1:$2" ;; esac; }

# expect NAME "client-tag" "server-tag": every line of each side has that tag.
expect() {
  local name=$1 ct=$2 st=$3 got
  got=$(grep -c "^connected outcome=$ct " "$WORK/$name.cli")
  local want; want=$(grep -c "^connected" "$WORK/$name.cli")
  if [ "$want" -ge 1 ] && [ "$got" = "$want" ]; then ok "$name: client $ct"
  else fail "$name: client expected $ct:"; sed 's/^/    /' "$WORK/$name.cli"; fi
  got=$(grep -c "^accepted .* outcome=$st " "$WORK/$name.srv")
  want=$(grep -c "^accepted" "$WORK/$name.srv")
  if [ "$want" -ge 1 ] && [ "$got" = "$want" ]; then ok "$name: server $st"
  else fail "$name: server expected $st:"; sed 's/^/    /' "$WORK/$name.srv"; fi
}

# --- the cases ---------------------------------------------------------------
run_case both4   10.231.0.2     "--mark" "--mark"
run_case none4   10.231.0.2     ""       ""
run_case cli4    10.231.0.2     ""       "--mark"
run_case srv4    10.231.0.2     "--mark" ""
run_case both6   fd00:231::2    "--mark" "--mark"
run_case cli6    fd00:231::2    ""       "--mark"
run_case srv6    fd00:231::2    "--mark" ""
run_case tfo4    10.231.0.2     "--mark --fastopen" "--mark --fastopen" 2
# MD5 (RFC 2385) takes 20 bytes but drops timestamps: the option still fits.
run_case md5-4   10.231.0.2     "--mark --md5 smc-test-key --md5-peer 10.231.0.1" "--mark --md5 smc-test-key"
# No option space: the space hog (another sock_ops program, in a child
# cgroup, run before ours) leaves 4 bytes in every SYN / SYN-ACK.
S_CG=$HOG_CG C_CG=$HOG_CG run_case nospace-syn 10.231.0.2 "--mark" "--mark"
S_CG=$HOG_CG run_case nospace-synack 10.231.0.2 "--mark" "--mark"
# SYN cookies always (2): the kernel keeps no request state, so no echo.
ip netns exec "$NS_S" sysctl -qw net.ipv4.tcp_syncookies=2
run_case cookie4 10.231.0.2     "--mark" "--mark"
run_case cookie6 fd00:231::2    "--mark" "--mark"
ip netns exec "$NS_S" sysctl -qw net.ipv4.tcp_syncookies=1

expect both4 BothAnnounced BothAnnounced
expect none4 LocalNotAnnounced:NotMarked LocalNotAnnounced:NotMarked
expect cli4  PeerDidNotAnnounce LocalNotAnnounced:NotMarked
expect srv4  LocalNotAnnounced:NotMarked PeerDidNotAnnounce
expect both6 BothAnnounced BothAnnounced
expect cli6  PeerDidNotAnnounce LocalNotAnnounced:NotMarked
expect srv6  LocalNotAnnounced:NotMarked PeerDidNotAnnounce
expect tfo4  BothAnnounced BothAnnounced
expect md5-4 BothAnnounced BothAnnounced
expect nospace-syn LocalNotAnnounced:NoOptionSpace PeerDidNotAnnounce
expect nospace-synack PeerDidNotAnnounce LocalNotAnnounced:NoOptionSpace
expect cookie4 PeerDidNotAnnounce LocalNotAnnounced:SynCookie
expect cookie6 PeerDidNotAnnounce LocalNotAnnounced:SynCookie

# --- crafted SYN: another kind-254 option (TFO experimental, FE 04 F9 89)
# before ours; the server must still see ours and echo it. Sent from an
# address the client kernel does not own, so it ignores the SYN-ACK.
CMAC=$(ip -n "$NS_C" -j link show vc | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["address"])')
ip -n "$NS_S" neigh replace 10.231.0.99 lladdr "$CMAC" dev vs
craft_case() {
  local name=$1 opts=$2 port
  timeout 30 bash -c 'echo $$ > "$0/cgroup.procs" && exec nsenter --net=/run/netns/"$1" "${@:2}"' \
    "$CG" "$NS_S" "$PROBE" --pin-dir "$PIN" server --listen 10.231.0.2:0 --mark > "$WORK/$name.srv" 2>&1 &
  local sp=$!
  for _ in $(seq 100); do grep -q "^listening" "$WORK/$name.srv" 2>/dev/null && break; sleep 0.05; done
  port=$(sed -n 's/^listening port=//p' "$WORK/$name.srv")
  echo "$port" > "$WORK/$name.port"
  timeout 20 ip netns exec "$NS_C" python3 tests/system/bpf-craft-syn.py syn vc 10.231.0.99 10.231.0.2 "$port" "$opts" \
    > "$WORK/$name.cli" 2>&1
  wait "$sp"
}
# MSS, TFO-exp cookie request, SMC-R.
craft_case craft-other-first "020405b4fe04f989fe06e2d4c3d9"
# MSS, TFO-exp, SMC-R ExID with a wrong length (8): not SMC-R (AMB-04).
craft_case craft-badlen "020405b4fe04f989fe08e2d4c3d90000"
if grep -q "^synack-options=.*fe06e2d4c3d9" "$WORK/craft-other-first.cli" \
   && grep -q "^accepted .* outcome=BothAnnounced " "$WORK/craft-other-first.srv"; then
  ok "kind-254 option before ours: recognised, echoed, BothAnnounced"
else
  fail "kind-254 option before ours"; cat "$WORK/craft-other-first.cli" "$WORK/craft-other-first.srv"
fi
if grep -q "^synack-options=" "$WORK/craft-badlen.cli" \
   && ! grep -q "fe06e2d4c3d9" "$WORK/craft-badlen.cli" \
   && grep -q "^accepted .* outcome=PeerDidNotAnnounce " "$WORK/craft-badlen.srv"; then
  ok "SMC-R ExID with length 8: ignored, no echo"
else
  fail "SMC-R ExID with length 8"; cat "$WORK/craft-badlen.cli" "$WORK/craft-badlen.srv"
fi

# The client side: a crafted SYN-ACK (from an address the server kernel does
# not own) with the TFO experimental option before ours.
SMAC=$(ip -n "$NS_S" -j link show vs | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["address"])')
ip -n "$NS_C" neigh replace 10.231.0.98 lladdr "$SMAC" dev vc
craft_synack() {
  local name=$1 opts=$2
  timeout 30 ip netns exec "$NS_S" python3 tests/system/bpf-craft-syn.py synack vs 10.231.0.98 7777 "$opts" \
    > "$WORK/$name.srv" 2>&1 &
  local sp=$!
  sleep 1.5  # the sniffer starts
  timeout 20 bash -c 'echo $$ > "$0/cgroup.procs" && exec nsenter --net=/run/netns/"$1" "${@:2}"' \
    "$CG" "$NS_C" "$PROBE" --pin-dir "$PIN" client --connect 10.231.0.98:7777 --mark > "$WORK/$name.cli" 2>&1
  wait "$sp"
}
craft_synack craft-synack-other-first "020405b4fe04f989fe06e2d4c3d9"
if grep -q "^syn-options=.*fe06e2d4c3d9" "$WORK/craft-synack-other-first.srv" \
   && grep -q "^connected outcome=BothAnnounced .*server-outcome=crafted" "$WORK/craft-synack-other-first.cli"; then
  ok "SYN-ACK with a kind-254 option before ours: recognised by the client"
else
  fail "SYN-ACK with a kind-254 option before ours"
  cat "$WORK/craft-synack-other-first.srv" "$WORK/craft-synack-other-first.cli"
fi
craft_synack craft-synack-other-only "020405b4fe04f989"
if grep -q "^connected outcome=PeerDidNotAnnounce .*server-outcome=crafted" "$WORK/craft-synack-other-only.cli"; then
  ok "SYN-ACK with only another kind-254 option: PeerDidNotAnnounce"
else
  fail "SYN-ACK with only another kind-254 option"
  cat "$WORK/craft-synack-other-only.srv" "$WORK/craft-synack-other-only.cli"
fi

# --- the wire: tshark decodes what tcpdump captured ------------------------
sleep 0.5
kill "${PIDS[0]}" 2>/dev/null; wait "${PIDS[0]}" 2>/dev/null; PIDS=()
tshark -r "$PCAP" -Y "tcp.flags.syn == 1" -T fields -E separator=' ' \
  -e tcp.srcport -e tcp.dstport -e tcp.flags.ack -e tcp.len -e tcp.options > "$WORK/syns.txt" 2>"$WORK/tshark.err" \
  || { cat "$WORK/tshark.err"; fail "tshark"; }
OPT=fe06e2d4c3d9
# wire NAME SYN(yes|no) SYNACK(yes|no): every SYN to / SYN-ACK from the
# case's server port carries (or lacks) FE 06 E2 D4 C3 D9.
wire() {
  local name=$1 want_syn=$2 want_sa=$3 port n_syn n_sa o_syn o_sa
  port=$(cat "$WORK/$name.port")
  n_syn=$(awk -v p="$port" '$2 == p && $3 == 0' "$WORK/syns.txt" | wc -l)
  o_syn=$(awk -v p="$port" -v o="$OPT" '$2 == p && $3 == 0 && index($5, o)' "$WORK/syns.txt" | wc -l)
  n_sa=$(awk -v p="$port" '$1 == p && $3 == 1' "$WORK/syns.txt" | wc -l)
  o_sa=$(awk -v p="$port" -v o="$OPT" '$1 == p && $3 == 1 && index($5, o)' "$WORK/syns.txt" | wc -l)
  local exp_syn=0 exp_sa=0
  [ "$want_syn" = yes ] && exp_syn=$n_syn
  [ "$want_sa" = yes ] && exp_sa=$n_sa
  if [ "$n_syn" -ge 1 ] && [ "$n_sa" -ge 1 ] && [ "$o_syn" = "$exp_syn" ] && [ "$o_sa" = "$exp_sa" ]; then
    ok "$name on the wire: SYN option=$want_syn, SYN-ACK option=$want_sa ($n_syn SYN, $n_sa SYN-ACK)"
  else
    fail "$name on the wire: want SYN=$want_syn SYN-ACK=$want_sa, got $o_syn/$n_syn SYN and $o_sa/$n_sa SYN-ACK with it"
    awk -v p="$port" '$1 == p || $2 == p' "$WORK/syns.txt" | sed 's/^/    /'
  fi
}
wire both4 yes yes
wire none4 no no
wire cli4 yes no
wire srv4 no no
wire both6 yes yes
wire cli6 yes no
wire srv6 no no
wire tfo4 yes yes
wire md5-4 yes yes
wire nospace-syn no no
wire nospace-synack yes no
wire cookie4 yes no
wire cookie6 yes no
# The second TFO connection really was Fast Open: its SYN carried data.
tport=$(cat "$WORK/tfo4.port")
if awk -v p="$tport" -v o="$OPT" '$2 == p && $3 == 0 && $4 > 0 && index($5, o)' "$WORK/syns.txt" | grep -q .; then
  ok "tfo4: a SYN with data (Fast Open) carried the option"
else
  fail "tfo4: no Fast Open SYN with data and the option"
fi

# --- Unavailable: not installed / map not readable ---------------------------
in_ns "$NS_C" "$PROBE" --pin-dir "/sys/fs/bpf/smc-bpf-none-$ID" client --connect 10.231.0.2:9 --mark \
  > "$WORK/notinst.txt" 2>&1
if grep -q '^option-unavailable reason="SMC-R option unavailable: eBPF program not installed' "$WORK/notinst.txt"; then
  ok "not installed: Unavailable (\"SMC-R option unavailable: ...\")"
else fail "not installed"; cat "$WORK/notinst.txt"; fi

# An unprivileged user cannot open the root-only map: Unavailable, plain TCP.
cp "$PROBE" "$WORK/probe" && chmod 755 "$WORK" "$WORK/probe"
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
run_case_nobody() {
  local name=$1
  timeout 30 bash -c 'echo $$ > "$0/cgroup.procs" && exec nsenter --net=/run/netns/"$1" "${@:2}"' \
    "$CG" "$NS_S" "$PROBE" --pin-dir "$PIN" server --listen 10.231.0.2:0 --mark > "$WORK/$name.srv" 2>&1 &
  local sp=$!
  for _ in $(seq 100); do grep -q "^listening" "$WORK/$name.srv" 2>/dev/null && break; sleep 0.05; done
  local port; port=$(sed -n 's/^listening port=//p' "$WORK/$name.srv")
  timeout 20 bash -c 'echo $$ > "$0/cgroup.procs" && exec nsenter --net=/run/netns/"$1" "${@:2}"' \
    "$CG" "$NS_C" setpriv --reuid=nobody --regid=nogroup --clear-groups \
    "$WORK/probe" --pin-dir "$PIN" client --connect "10.231.0.2:$port" --mark > "$WORK/$name.cli" 2>&1
  wait "$sp"
}
run_case_nobody perm-denied
if grep -q '^option-unavailable reason="SMC-R option unavailable: ' "$WORK/perm-denied.cli" \
   && grep -q "^connected outcome=Unavailable " "$WORK/perm-denied.cli" \
   && grep -q "^accepted .* outcome=PeerDidNotAnnounce " "$WORK/perm-denied.srv"; then
  ok "map not readable (nobody, root-only map): Unavailable, peer falls back"
else fail "map not readable"; cat "$WORK/perm-denied.cli" "$WORK/perm-denied.srv"; fi

# With --group the same user may mark: both sides announce.
"${BPF[@]}" install --cgroup "$CG" --pin-dir "$PIN" --group nogroup > "$WORK/install2.txt" 2>&1 \
  || { cat "$WORK/install2.txt"; fail "install --group"; }
grep -q "map: .*0660 uid 0 group nogroup" "$WORK/install2.txt" || fail "map permissions for the group"
run_case_nobody perm-group
if grep -q "^connected outcome=BothAnnounced " "$WORK/perm-group.cli" \
   && grep -q "^accepted .* outcome=BothAnnounced " "$WORK/perm-group.srv"; then
  ok "install --group nogroup: unprivileged client marks and announces"
else fail "install --group"; cat "$WORK/perm-group.cli" "$WORK/perm-group.srv"; fi

# --- status / uninstall ------------------------------------------------------
"${BPF[@]}" status --pin-dir "$PIN" > "$WORK/status.txt" 2>&1 && grep -q "attached:  link id" "$WORK/status.txt" \
  && ok "status reports the attachment" || { fail "status"; cat "$WORK/status.txt"; }
"${BPF[@]}" uninstall --pin-dir "$PIN" >/dev/null 2>&1 && [ ! -e "$PIN" ] || fail "uninstall"
"${BPF[@]}" uninstall --pin-dir "$PIN" >/dev/null 2>&1 || fail "uninstall is not idempotent"
if bpftool cgroup show "$CG" 2>/dev/null | grep -q smc_sockops; then fail "program still attached after uninstall"
else ok "uninstall detached and unpinned (twice)"; fi
"${BPF[@]}" status --pin-dir "$PIN" | grep -q "^not installed" || fail "status after uninstall"

if [ "$FAILS" -gt 0 ]; then echo "bpf-option: $FAILS check(s) failed"; exit 1; fi
echo "bpf-option: all checks passed"
