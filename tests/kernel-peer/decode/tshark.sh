#!/usr/bin/env bash
# tshark with what SMC-R captures need (part of smc-rs tests/kernel-peer):
#   * smc_v2_llc.lua, our dissector for SMC-Rv2 LLC messages (smcv2llc.*),
#   * the RPC-over-RDMA heuristic off (it claims SMC-Rv2 LLC as malformed),
#   * TCP heuristics first, so CLC messages are found on any port,
#   * GSM over IP off (it owns TCP port 5000 and calls fallback TCP payload malformed).
# Every argument goes to tshark, e.g.
#   tests/kernel-peer/decode/tshark.sh -r run.pcap -Y 'smc || smcv2llc'
#   tests/kernel-peer/decode/tshark.sh -r run.pcap -Y 'smcv2llc.type == 0x27' -V -O smcv2llc
# tshark does not check RoCEv2 ICRCs: use icrc_check.py for that.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec tshark -X "lua_script:$here/smc_v2_llc.lua" --disable-heuristic rpcrdma_infiniband --disable-protocol gsm_ipa \
	-o tcp.try_heuristic_first:TRUE "$@"
