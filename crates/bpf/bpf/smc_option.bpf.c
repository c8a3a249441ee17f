// SPDX-License-Identifier: MIT OR GPL-2.0
/*
 * smc-rs: the RFC 7609 SMC-R TCP option in SYN and SYN-ACK, from a cgroup
 * sock_ops program.
 *
 * RFC 7609 §3.1 / §3.5.1.1 (and Appendix A.1): a peer announces SMC-R with
 * the experimental option kind 254, length 6, ExID E2 D4 C3 D9 ("SMCR" in
 * EBCDIC) in its SYN (client) or SYN-ACK (server); SMC-R is used only when
 * both did. A userspace stack cannot write TCP options through the socket
 * API, so this program does it for the sockets that the smc-bpf library
 * marks in the smc_sk_state map. Every other socket is left alone: the
 * header callbacks are enabled only on marked sockets.
 *
 * Per-socket state lives in a BPF_MAP_TYPE_SK_STORAGE map (key: the socket
 * fd in userspace, the socket itself here). Userspace writes `request`
 * before connect()/listen(); this program writes `status`, which userspace
 * reads after connect()/accept(). The map has BPF_F_CLONE, so an accepted
 * socket starts with a copy of its listener's value (the mark is
 * inherited), see bpf_sk_storage_clone() in sk_clone_lock().
 *
 * Callbacks used and why:
 *  - TCP_CONNECT_CB (active): right before the SYN is built. A marked socket
 *    gets BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG so the kernel calls us to
 *    reserve (HDR_OPT_LEN_CB) and write (WRITE_HDR_OPT_CB) header options.
 *  - TCP_LISTEN_CB (passive): right after listen(). A marked listener gets
 *    the same flag (tcp_make_synack() tests the listener's flags) and
 *    TCP_SAVE_SYN, so that the SYN stays readable for SYN-ACK
 *    retransmissions and in PASSIVE_ESTABLISHED_CB.
 *  - HDR_OPT_LEN_CB / WRITE_HDR_OPT_CB: SYN of a marked client: always.
 *    SYN-ACK of a marked listener: only when the SYN carried the option
 *    (RFC 7609 §3.5.1.1: a server that can see the SYN echoes only then),
 *    never for a SYN cookie (BPF_WRITE_HDR_TCP_SYNACK_COOKIE): the kernel
 *    keeps no request socket then, so the child could never know that it
 *    echoed; both sides fall back together instead.
 *  - ACTIVE_ESTABLISHED_CB: skb is the SYN-ACK; record whether it carried
 *    the option.
 *  - PASSIVE_ESTABLISHED_CB: read the SYN (bpf_getsockopt(TCP_BPF_SYN),
 *    from the saved SYN) and record the outcome in the child's storage.
 *    No saved SYN on a socket of an armed listener means the connection
 *    was made from a SYN cookie (tcp_conn_request() does not save the SYN
 *    in cookie mode).
 *
 * Parsing: bpf_load_hdr_opt() with a 4-byte magic stops with -ENOMSG at the
 * first kind-254 option shorter than 6 bytes (bpf_search_tcp_opt(): "magic_len
 * > kind_len - 2"), e.g. the 4-byte TCP Fast Open experimental option
 * (FE 04 F9 89). So the option list is scanned here instead, following
 * tcp_parse_options(): stop at EOL or at a malformed length.
 */
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* From <netinet/tcp.h>; not available to a BPF compile. */
#define SOL_TCP 6
#define TCP_SAVE_SYN 27
#define ENOENT 2
#define ENOSPC 28

#define TCPHDR_SYN 0x02
#define TCPHDR_ACK 0x10

/* RFC 7609 Appendix A.1 */
#define SMCR_OPT_KIND 254
#define SMCR_OPT_LEN 6

/* `request` bits, written by userspace (crates/bpf/src/state.rs). */
#define SMC_REQ_ANNOUNCE (1u << 0)

/* `status` bits, written here; decoded by crates/bpf/src/state.rs. */
#define SMC_ST_ARMED_ACTIVE (1u << 0) /* saw connect() of a marked socket */
#define SMC_ST_ARMED_LISTEN (1u << 1) /* saw listen() of a marked socket */
#define SMC_ST_SENT (1u << 2)         /* our SYN / SYN-ACK carried the option */
#define SMC_ST_PEER (1u << 3)         /* peer's SYN-ACK / SYN carried it */
#define SMC_ST_NOSPACE (1u << 4)      /* no option space left in SYN / SYN-ACK */
#define SMC_ST_COOKIE (1u << 5)       /* accepted from a SYN cookie */
#define SMC_ST_DONE (1u << 6)         /* 3-way handshake seen; bits are final */
#define SMC_ST_PASSIVE (1u << 7)      /* an accepted socket */
#define SMC_ST_ERROR (1u << 8)        /* a helper failed; see `error` */

struct smc_sk_state {
	__u32 request;
	__u32 status;
	__s32 error; /* first negative helper return value, 0 if none */
	__u32 reserved;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC | BPF_F_CLONE);
	__type(key, int);
	__type(value, struct smc_sk_state);
} smc_sk_state SEC(".maps");

/*
 * A SYN-ACK is built for a request socket, which has no sk_storage. In the
 * (unusual) case that the option did not fit into a SYN-ACK although the SYN
 * carried it, the connection's 4-tuple is remembered here so that
 * PASSIVE_ESTABLISHED_CB does not claim an echo that never went out. LRU:
 * entries of handshakes that never complete age out.
 */
struct conn_key {
	__u32 family;
	__u32 local_port;  /* host order, as in bpf_sock_ops */
	__u32 remote_port; /* network order in the low 16 bits, as in bpf_sock_ops */
	__u32 local_ip[4];
	__u32 remote_ip[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct conn_key);
	__type(value, __u32);
} smc_nospace SEC(".maps");

#define TCP_HDR_MAX 60

struct tcp_hdr_buf {
	__u8 b[64];
};

/*
 * Reads h->b[idx]. The empty asm hides from clang what it knows about idx,
 * so that it keeps the mask, which is what bounds the access for the
 * verifier (clang would otherwise drop it as redundant).
 */
static __always_inline __u64 hdr_byte(const struct tcp_hdr_buf *h, __u64 idx)
{
	asm volatile("" : "+r"(idx));
	return h->b[idx & 63];
}

/* Options follow the 20-byte fixed header: at most 40 bytes, so at most 40
 * options (each at least one byte long). */
#define TCP_OPT_MAX (TCP_HDR_MAX - 20)

/*
 * Returns 1 when the TCP header in h->b[0..hlen) carries the SMC-R option.
 * A global (non-inlined) function: the verifier checks it once on its own
 * instead of once per call site, which keeps verification small.
 *
 * The loop runs on its own counter `n`, bounded by a constant, and not on the
 * offset `i`: after `i += len` (len read from the packet) the verifier only
 * knows a range for i, and once those ranges stop changing from one iteration
 * to the next, verifiers that do not yet widen loop states (Linux 6.12) find
 * the same state twice and reject the program ("infinite loop detected"). The
 * constant counter differs in every iteration, so no two states are equal,
 * and it ends the loop after TCP_OPT_MAX rounds whatever the offsets are.
 */
__attribute__((noinline)) int smcr_option_present(const struct tcp_hdr_buf *h, __u32 hdr_len)
{
	/* 64-bit locals: no zero-extended copies whose bounds the verifier
	 * would not carry back to the original register. */
	__u64 hlen = hdr_len, i = 20;

	if (!h)
		return 0;
	if (hlen > TCP_HDR_MAX)
		hlen = TCP_HDR_MAX;
	for (int n = 0; n < TCP_OPT_MAX; n++) {
		__u64 kind, len;

		if (i >= hlen)
			break;
		kind = hdr_byte(h, i);
		if (kind == 0) /* EOL */
			break;
		if (kind == 1) { /* NOP */
			i++;
			continue;
		}
		if (i + 1 >= hlen)
			break;
		len = hdr_byte(h, i + 1);
		if (len < 2 || i + len > hlen) /* malformed: stop, as the kernel does */
			break;
		/* Appendix A.1; a kind-254 option with another ExID or another
		 * length is somebody else's experiment (RFC 6994): skip it. */
		if (kind == SMCR_OPT_KIND && len == SMCR_OPT_LEN && hdr_byte(h, i + 2) == 0xE2 &&
		    hdr_byte(h, i + 3) == 0xD4 && hdr_byte(h, i + 4) == 0xC3 &&
		    hdr_byte(h, i + 5) == 0xD9)
			return 1;
		i += len;
	}
	return 0;
}

/* Did the SYN of this connection carry the option? 1 yes, 0 no, <0 error
 * (-ENOENT: the SYN is not available, i.e. not saved). */
static __always_inline int syn_has_option(struct bpf_sock_ops *skops)
{
	struct tcp_hdr_buf hdr = {};
	int n;

	n = bpf_getsockopt(skops, SOL_TCP, TCP_BPF_SYN, hdr.b, TCP_HDR_MAX);
	if (n < 0)
		return n;
	return smcr_option_present(&hdr, (__u32)n);
}

/* Did the packet under skops->skb_data (a received header) carry it? */
static __always_inline int skb_has_option(struct bpf_sock_ops *skops)
{
	__u8 *data = (__u8 *)(long)skops->skb_data;
	__u8 *end = (__u8 *)(long)skops->skb_data_end;
	struct tcp_hdr_buf hdr = {};
	__u32 n = 0;

#pragma unroll
	for (int k = 0; k < TCP_HDR_MAX; k++) {
		if (data + k + 1 > end)
			break;
		hdr.b[k] = data[k];
		n = k + 1;
	}
	if (n < 20)
		return 0;
	return smcr_option_present(&hdr, n);
}

static __always_inline void note_error(struct smc_sk_state *st, long err)
{
	st->status |= SMC_ST_ERROR;
	if (!st->error)
		st->error = (__s32)err;
}

static __always_inline void conn_key_of(struct bpf_sock_ops *skops, struct conn_key *k)
{
	k->family = skops->family;
	k->local_port = skops->local_port;
	k->remote_port = skops->remote_port;
	if (skops->family == 2 /* AF_INET */) {
		k->local_ip[0] = skops->local_ip4;
		k->remote_ip[0] = skops->remote_ip4;
	} else {
		k->local_ip[0] = skops->local_ip6[0];
		k->local_ip[1] = skops->local_ip6[1];
		k->local_ip[2] = skops->local_ip6[2];
		k->local_ip[3] = skops->local_ip6[3];
		k->remote_ip[0] = skops->remote_ip6[0];
		k->remote_ip[1] = skops->remote_ip6[1];
		k->remote_ip[2] = skops->remote_ip6[2];
		k->remote_ip[3] = skops->remote_ip6[3];
	}
}

static __always_inline struct smc_sk_state *marked_state(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct smc_sk_state *st;

	if (!sk)
		return 0;
	st = bpf_sk_storage_get(&smc_sk_state, sk, 0, 0);
	if (!st || !(st->request & SMC_REQ_ANNOUNCE))
		return 0;
	return st;
}

static __always_inline void enable_hdr_cb(struct bpf_sock_ops *skops, struct smc_sk_state *st)
{
	long err = bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
							    BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
	if (err)
		note_error(st, err);
}

/* Header writing is only needed during the handshake: stop the per-packet
 * callbacks once the connection is established. */
static __always_inline void disable_hdr_cb(struct bpf_sock_ops *skops)
{
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags &
						 ~BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
}

static const __u8 smcr_option[SMCR_OPT_LEN] = {SMCR_OPT_KIND, SMCR_OPT_LEN, 0xE2, 0xD4, 0xC3, 0xD9};

/* HDR_OPT_LEN_CB and WRITE_HDR_OPT_CB: is this packet one we announce in? */
static __always_inline int wants_option(struct bpf_sock_ops *skops, int *is_synack)
{
	__u32 flags = skops->skb_tcp_flags;

	*is_synack = 0;
	if (!(flags & TCPHDR_SYN)) {
		/* A data/ACK segment of a socket that still has our flag (a
		 * TCP Fast Open child keeps it until it is established, as its
		 * SYN-ACK may be retransmitted; children inherit the listener's
		 * flags). */
		if (skops->is_fullsock && skops->state == BPF_TCP_ESTABLISHED)
			disable_hdr_cb(skops);
		return 0;
	}
	if (flags & TCPHDR_ACK) {
		/* SYN-ACK, built for a request socket of a listener on which
		 * only this program enabled the callback (TCP_LISTEN_CB). */
		*is_synack = 1;
		if (skops->args[0] & BPF_WRITE_HDR_TCP_SYNACK_COOKIE)
			return 0;
		return syn_has_option(skops) == 1;
	}
	/* SYN of a connecting socket: announce only when it is marked. */
	return marked_state(skops) != 0;
}

SEC("sockops")
int smc_sockops(struct bpf_sock_ops *skops)
{
	struct smc_sk_state *st;
	int is_synack, one = 1;
	long err;

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		st = marked_state(skops);
		if (st) {
			st->status = SMC_ST_ARMED_ACTIVE;
			st->error = 0;
			enable_hdr_cb(skops, st);
		}
		break;

	case BPF_SOCK_OPS_TCP_LISTEN_CB:
		st = marked_state(skops);
		if (st) {
			st->status = SMC_ST_ARMED_LISTEN;
			st->error = 0;
			err = bpf_setsockopt(skops, SOL_TCP, TCP_SAVE_SYN, &one, sizeof(one));
			if (err)
				note_error(st, err);
			else
				enable_hdr_cb(skops, st);
		}
		break;

	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		if (!wants_option(skops, &is_synack))
			break;
		err = bpf_reserve_hdr_opt(skops, SMCR_OPT_LEN, 0);
		if (is_synack) {
			struct conn_key k = {};
			__u32 v = 1;

			conn_key_of(skops, &k);
			if (err)
				bpf_map_update_elem(&smc_nospace, &k, &v, BPF_ANY);
			else
				bpf_map_delete_elem(&smc_nospace, &k);
		} else {
			st = marked_state(skops);
			if (st) {
				if (err == -ENOSPC)
					st->status |= SMC_ST_NOSPACE;
				else if (err)
					note_error(st, err);
				else
					st->status &= ~SMC_ST_NOSPACE;
			}
		}
		break;

	case BPF_SOCK_OPS_WRITE_HDR_OPT_CB:
		if (!wants_option(skops, &is_synack))
			break;
		/* The space all programs reserved is one pool: when our own
		 * reservation failed, another program's unused space could
		 * still take the option. Write only what we reserved, so that
		 * what goes out matches what was recorded above. */
		if (is_synack) {
			struct conn_key k = {};

			conn_key_of(skops, &k);
			if (bpf_map_lookup_elem(&smc_nospace, &k))
				break;
			bpf_store_hdr_opt(skops, smcr_option, SMCR_OPT_LEN, 0);
		} else {
			st = marked_state(skops);
			if (!st || (st->status & SMC_ST_NOSPACE))
				break;
			err = bpf_store_hdr_opt(skops, smcr_option, SMCR_OPT_LEN, 0);
			if (!err)
				st->status |= SMC_ST_SENT;
			else
				note_error(st, err);
		}
		break;

	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		st = marked_state(skops);
		if (!st)
			break;
		if (st->status & SMC_ST_ARMED_ACTIVE) {
			/* skb is the SYN-ACK that concluded the handshake. */
			if (skb_has_option(skops))
				st->status |= SMC_ST_PEER;
			disable_hdr_cb(skops);
		}
		st->status |= SMC_ST_DONE;
		break;

	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		/* The child's storage is a clone of the listener's. */
		st = marked_state(skops);
		if (!st)
			break;
		if (st->status & SMC_ST_ARMED_LISTEN) {
			int r = syn_has_option(skops);

			st->status = SMC_ST_ARMED_LISTEN;
			st->error = 0;
			if (r == -ENOENT) {
				/* SYN not saved: made from a SYN cookie, the
				 * SYN-ACK carried no option. */
				st->status |= SMC_ST_COOKIE;
			} else if (r < 0) {
				note_error(st, r);
			} else if (r == 1) {
				struct conn_key k = {};

				st->status |= SMC_ST_PEER;
				conn_key_of(skops, &k);
				if (bpf_map_lookup_elem(&smc_nospace, &k)) {
					st->status |= SMC_ST_NOSPACE;
					bpf_map_delete_elem(&smc_nospace, &k);
				} else {
					st->status |= SMC_ST_SENT;
				}
			}
			/* A TCP Fast Open child is "established" on its SYN
			 * (tcp_fastopen_create_child(); skb is then the SYN),
			 * before its SYN-ACK is written under this socket's
			 * flags: keep them until it is ESTABLISHED
			 * (wants_option()). Otherwise skb is the final ACK. */
			if (!(skops->skb_tcp_flags & TCPHDR_SYN))
				disable_hdr_cb(skops);
		} else {
			st->status = 0;
		}
		st->status |= SMC_ST_PASSIVE | SMC_ST_DONE;
		break;
	}
	return 1;
}
