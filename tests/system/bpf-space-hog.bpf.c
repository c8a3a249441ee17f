// SPDX-License-Identifier: MIT OR GPL-2.0
/*
 * Test helper for tests/system/bpf-option.sh: another sock_ops program that
 * takes all remaining TCP option space of every SYN and SYN-ACK of the
 * sockets in its cgroup, so none is left for the SMC-R option. Attached to a child cgroup of the one smc-bpf is attached to, it
 * runs first (descendant programs run before their ancestors'), so smc-bpf's
 * bpf_reserve_hdr_opt() then fails with -ENOSPC. The kernel fills the
 * reserved but unwritten space with NOPs.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

SEC("sockops")
int space_hog(struct bpf_sock_ops *skops)
{
	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
	case BPF_SOCK_OPS_TCP_LISTEN_CB:
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
						 BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		if (!(skops->skb_tcp_flags & 0x02)) /* SYN and SYN-ACK only */
			break;
		/* The largest multiple of 4 that fits takes all that is left
		 * (the kernel keeps the remaining space 4-byte aligned). */
#pragma unroll
		for (int len = 40; len >= 4; len -= 4)
			if (bpf_reserve_hdr_opt(skops, len, 0) == 0)
				break;
		break;
	}
	return 1;
}
