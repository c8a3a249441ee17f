/*
 * kpeer - the in-VM half of the smc-rs kernel-peer harness (tests/kernel-peer).
 *
 * Built on the host with `gcc -static` and put into the VM's initramfs. It
 * drives the Linux kernel's own SMC-R stack (AF_SMC sockets), inspects it
 * (sock_diag for AF_SMC, the SMC_GEN_NETLINK generic netlink family) and sets
 * up what SMC-Rv2 needs (an rxe device via RDMA netlink, a User EID).
 *
 * Every result is one line on stdout: "KPEER <event> key=value ...", values
 * never contain blanks. The host side (lib/verdict.py) parses these lines;
 * README.md documents them. Human-oriented chatter goes to stderr.
 *
 * Commands (arguments are key=value words):
 *   kpeer rxe-add name=rxe0 netdev=eth0 [type=rxe|siw]  create a soft-RoCE (or siw) device
 *   kpeer rxe-del name=rxe0                 delete it again (`rdma link delete`); the
 *                                           kernel returns only when no process has the
 *                                           device open any more
 *   kpeer ueid-add ueid=NAME                add a User EID (SMC-Rv2 needs one)
 *   kpeer ueid-list
 *   kpeer diag                              one line per AF_SMC socket
 *   kpeer lgr                               SMC-R link groups and links
 *   kpeer stats                             SMC statistics and fallback counters
 *   kpeer serve port=P scen=S [bufsize=B] [ctlfd=N] [iotimeout=S] [vm=NAME]
 *           AF_SMC server; one child per connection; stops on a "stop" line on
 *           ctlfd (the control serial port)
 *   kpeer client host=IP port=P scen=S [sizes=a,b] [conns=N] [hold=S]
 *           [bufsize=B] [iotimeout=S] [vm=NAME]
 *   kpeer waitctl ctlfd=N word=W [timeout=S] block until a line W arrives
 *                                           (exit 3 on "abort")
 *   kpeer readctl ctlfd=N [timeout=S]       print the next control line
 *   kpeer pattern seed=S off=O len=N        the data pattern, in hex
 *
 * Scenarios (both halves live here; README.md describes the wire-level
 * script a non-kernel peer has to follow): echo, multi, urg, srvhalf, abort.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/genetlink.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/smc.h>
#include <linux/smc_diag.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_netlink.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#ifndef AF_SMC
#define AF_SMC 43
#endif
#define SMCPROTO_SMC 0

static const char *g_vm = "vm";
static int g_iotimeout = 30; /* seconds without progress before a connection fails */

/* ------------------------------------------------------------------ output */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Replace anything that would break "key=value" parsing on the host. */
static void sanitize(char *s)
{
	for (; *s; s++)
		if (*s <= ' ' || *s == '=' || *s > '~')
			*s = '_';
}

/* One result line, written with a single write() so that lines from forked
 * children never interleave. */
static void out(const char *event, const char *fmt, ...)
{
	char line[2048];
	int n;
	va_list ap;

	n = snprintf(line, sizeof(line), "KPEER %s vm=%s ", event, g_vm);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - n - 2, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	if (write(1, line, n) < 0)
		perror("write");
}

/* ------------------------------------------------------------- arguments */

static const char *arg(int argc, char **argv, const char *key, const char *def)
{
	size_t kl = strlen(key);

	for (int i = 0; i < argc; i++)
		if (!strncmp(argv[i], key, kl) && argv[i][kl] == '=')
			return argv[i] + kl + 1;
	return def;
}

/* "4096", "64k", "1M", "100m" -> bytes; -1 on garbage */
static long long parse_size(const char *s)
{
	char *end;
	long long v = strtoll(s, &end, 10);

	if (end == s || v < 0)
		return -1;
	switch (*end) {
	case 0:
		return v;
	case 'k': case 'K':
		v <<= 10;
		break;
	case 'm': case 'M':
		v <<= 20;
		break;
	case 'g': case 'G':
		v <<= 30;
		break;
	default:
		return -1;
	}
	return end[1] ? -1 : v;
}

static long argnum(int argc, char **argv, const char *key, long def)
{
	const char *v = arg(argc, argv, key, NULL);
	long long n;

	if (!v)
		return def;
	n = parse_size(v);
	if (n < 0) {
		fprintf(stderr, "kpeer: bad number %s=%s\n", key, v);
		exit(2);
	}
	return (long)n;
}

/* ---------------------------------------------------------- data pattern */
/*
 * The byte at stream offset i of a connection with seed s is byte (i % 8)
 * (little-endian) of mix64((s + 1) * 0x9e3779b97f4a7c15 + i / 8), where mix64
 * is the splitmix64 finaliser. It never repeats within a run, so a chunk
 * written to the wrong place of an RMB (or into another connection's RMB) is
 * detected. peers/tcp_peer.py has the same function in Python.
 */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static void pat_fill(unsigned char *b, size_t n, uint64_t seed, uint64_t off)
{
	uint64_t base = (seed + 1) * 0x9e3779b97f4a7c15ULL;

	for (size_t i = 0; i < n;) {
		uint64_t o = off + i;
		uint64_t w = mix64(base + (o >> 3));
		for (unsigned k = o & 7; k < 8 && i < n; k++, i++)
			b[i] = (unsigned char)(w >> (8 * k));
	}
}

static uint64_t pat_check(const unsigned char *b, size_t n, uint64_t seed, uint64_t off)
{
	static unsigned char ref[65536];
	uint64_t bad = 0;

	while (n) {
		size_t c = n < sizeof(ref) ? n : sizeof(ref);
		pat_fill(ref, c, seed, off);
		for (size_t i = 0; i < c; i++)
			bad += b[i] != ref[i];
		b += c;
		off += c;
		n -= c;
	}
	return bad;
}

/* FNV-1a 64 over everything a server received, for cross-checking by a peer. */
static uint64_t fnv(uint64_t h, const unsigned char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}
#define FNV_INIT 0xcbf29ce484222325ULL

/* --------------------------------------------------------------- netlink */

struct nlbuf {
	struct nlmsghdr nlh;
	char data[1024];
};

static void nl_put(struct nlmsghdr *h, int type, const void *d, int len)
{
	struct nlattr *a = (struct nlattr *)((char *)h + NLMSG_ALIGN(h->nlmsg_len));

	a->nla_type = type;
	a->nla_len = NLA_HDRLEN + len;
	memcpy((char *)a + NLA_HDRLEN, d, len);
	h->nlmsg_len = NLMSG_ALIGN(h->nlmsg_len) + NLA_ALIGN(a->nla_len);
}

static int nl_open(int proto)
{
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, proto);

	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		perror("netlink socket");
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

typedef void (*nl_cb)(struct nlmsghdr *h, void *ctx);

/* Send one request and read replies until DONE / ERROR (or the ACK of a
 * non-dump request). Returns 0, or a negative errno reported by the kernel. */
static int nl_talk(int fd, struct nlmsghdr *req, nl_cb cb, void *ctx)
{
	static char buf[65536];
	int dump = req->nlmsg_flags & NLM_F_DUMP;

	if (send(fd, req, req->nlmsg_len, 0) < 0)
		return -errno;
	for (;;) {
		int n = recv(fd, buf, sizeof(buf), 0);
		struct nlmsghdr *h;

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EPIPE;
		for (h = (struct nlmsghdr *)buf; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_type == NLMSG_DONE)
				return 0;
			if (h->nlmsg_type == NLMSG_ERROR) {
				struct nlmsgerr *e = NLMSG_DATA(h);
				return e->error;
			}
			if (cb)
				cb(h, ctx);
			if (!dump)
				return 0;
		}
	}
}

/* Iterate attributes in [p, p+len). */
#define for_each_attr(a, p, len)                                                   \
	for (struct nlattr *a = (struct nlattr *)(p);                               \
	     (char *)a + NLA_HDRLEN <= (char *)(p) + (len) && a->nla_len >= NLA_HDRLEN && \
	     (char *)a + a->nla_len <= (char *)(p) + (len);                          \
	     a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len)))

#define ATTR_DATA(a) ((void *)((char *)(a) + NLA_HDRLEN))
#define ATTR_LEN(a) ((int)(a)->nla_len - NLA_HDRLEN)

static void family_cb(struct nlmsghdr *h, void *ctx)
{
	char *p = (char *)NLMSG_DATA(h) + GENL_HDRLEN;
	int len = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);

	for_each_attr(a, p, len)
		if ((a->nla_type & NLA_TYPE_MASK) == CTRL_ATTR_FAMILY_ID && ATTR_LEN(a) >= 2)
			*(int *)ctx = *(uint16_t *)ATTR_DATA(a);
}

static int genl_family(int fd, const char *name)
{
	struct nlbuf r;
	struct genlmsghdr *g = NLMSG_DATA(&r.nlh);
	int id = -1;

	memset(&r, 0, sizeof(r));
	r.nlh.nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN);
	r.nlh.nlmsg_type = GENL_ID_CTRL;
	r.nlh.nlmsg_flags = NLM_F_REQUEST;
	r.nlh.nlmsg_seq = 1;
	g->cmd = CTRL_CMD_GETFAMILY;
	g->version = 1;
	nl_put(&r.nlh, CTRL_ATTR_FAMILY_NAME, name, strlen(name) + 1);
	if (nl_talk(fd, &r.nlh, family_cb, &id) < 0)
		return -1;
	return id;
}

/* Prepare a request of the SMC_GEN_NETLINK family; returns the socket. */
static int smc_genl_req(struct nlbuf *r, int cmd, int flags)
{
	int fd = nl_open(NETLINK_GENERIC), fam;
	struct genlmsghdr *g = NLMSG_DATA(&r->nlh);

	if (fd < 0)
		return -1;
	fam = genl_family(fd, SMC_GENL_FAMILY_NAME);
	if (fam < 0) {
		fprintf(stderr, "kpeer: generic netlink family %s not found (smc loaded?)\n",
			SMC_GENL_FAMILY_NAME);
		close(fd);
		return -1;
	}
	memset(r, 0, sizeof(*r));
	r->nlh.nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN);
	r->nlh.nlmsg_type = fam;
	r->nlh.nlmsg_flags = NLM_F_REQUEST | flags;
	r->nlh.nlmsg_seq = 2;
	g->cmd = cmd;
	g->version = SMC_GENL_FAMILY_VERSION;
	return fd;
}

/* ------------------------------------------------------------- rxe + UEID */

static int cmd_rxe_add(int argc, char **argv)
{
	const char *name = arg(argc, argv, "name", "rxe0");
	const char *ndev = arg(argc, argv, "netdev", "eth0");
	const char *type = arg(argc, argv, "type", "rxe");
	struct nlbuf r;
	int fd = nl_open(NETLINK_RDMA), rc;

	if (fd < 0)
		return 1;
	memset(&r, 0, sizeof(r));
	r.nlh.nlmsg_len = NLMSG_LENGTH(0);
	r.nlh.nlmsg_type = RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_NEWLINK);
	r.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
	r.nlh.nlmsg_seq = 3;
	nl_put(&r.nlh, RDMA_NLDEV_ATTR_DEV_NAME, name, strlen(name) + 1);
	nl_put(&r.nlh, RDMA_NLDEV_ATTR_LINK_TYPE, type, strlen(type) + 1);
	nl_put(&r.nlh, RDMA_NLDEV_ATTR_NDEV_NAME, ndev, strlen(ndev) + 1);
	rc = nl_talk(fd, &r.nlh, NULL, NULL);
	close(fd);
	if (rc < 0) {
		fprintf(stderr, "kpeer: rxe-add %s (%s) on %s: %s\n", name, type, ndev, strerror(-rc));
		return 1;
	}
	return 0;
}

struct dev_lookup {
	const char *name;
	int index;
};

static void dev_index_cb(struct nlmsghdr *h, void *ctx)
{
	struct dev_lookup *l = ctx;
	int len = h->nlmsg_len - NLMSG_LENGTH(0), index = -1, match = 0;

	for_each_attr(a, NLMSG_DATA(h), len) {
		int t = a->nla_type & NLA_TYPE_MASK;

		if (t == RDMA_NLDEV_ATTR_DEV_INDEX && ATTR_LEN(a) >= 4)
			index = *(uint32_t *)ATTR_DATA(a);
		if (t == RDMA_NLDEV_ATTR_DEV_NAME && ATTR_LEN(a) > 0 &&
		    !strncmp(ATTR_DATA(a), l->name, ATTR_LEN(a)) && strlen(l->name) < (size_t)ATTR_LEN(a))
			match = 1;
	}
	if (match)
		l->index = index;
}

static int cmd_rxe_del(int argc, char **argv)
{
	struct dev_lookup l = { .name = arg(argc, argv, "name", "rxe0"), .index = -1 };
	struct nlbuf r;
	uint32_t index;
	int fd = nl_open(NETLINK_RDMA), rc;

	if (fd < 0)
		return 1;
	memset(&r, 0, sizeof(r));
	r.nlh.nlmsg_len = NLMSG_LENGTH(0);
	r.nlh.nlmsg_type = RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_GET);
	r.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	r.nlh.nlmsg_seq = 4;
	rc = nl_talk(fd, &r.nlh, dev_index_cb, &l);
	if (rc < 0 || l.index < 0) {
		fprintf(stderr, "kpeer: rxe-del: no RDMA device %s (%s)\n", l.name, rc < 0 ? strerror(-rc) : "not listed");
		close(fd);
		return 1;
	}
	memset(&r, 0, sizeof(r));
	r.nlh.nlmsg_len = NLMSG_LENGTH(0);
	r.nlh.nlmsg_type = RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_DELLINK);
	r.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
	r.nlh.nlmsg_seq = 5;
	index = l.index;
	nl_put(&r.nlh, RDMA_NLDEV_ATTR_DEV_INDEX, &index, sizeof(index));
	rc = nl_talk(fd, &r.nlh, NULL, NULL);
	close(fd);
	if (rc < 0) {
		fprintf(stderr, "kpeer: rxe-del %s (index %u): %s\n", l.name, index, strerror(-rc));
		return 1;
	}
	return 0;
}

static int cmd_ueid_add(int argc, char **argv)
{
	const char *ueid = arg(argc, argv, "ueid", NULL);
	char e[SMC_MAX_EID_LEN + 1];
	struct nlbuf r;
	size_t l;
	int fd, rc;

	if (!ueid || !*ueid || strlen(ueid) > SMC_MAX_EID_LEN) {
		fprintf(stderr, "kpeer: ueid-add needs ueid=NAME (1..32 chars)\n");
		return 2;
	}
	/* The kernel keeps EIDs as 32 blank-padded bytes; it expects the
	 * attribute in that form, NUL-terminated. */
	l = strlen(ueid);
	memset(e, ' ', SMC_MAX_EID_LEN);
	memcpy(e, ueid, l);
	e[SMC_MAX_EID_LEN] = 0;
	fd = smc_genl_req(&r, SMC_NETLINK_ADD_UEID, NLM_F_ACK);
	if (fd < 0)
		return 1;
	nl_put(&r.nlh, SMC_NLA_EID_TABLE_ENTRY, e, sizeof(e));
	rc = nl_talk(fd, &r.nlh, NULL, NULL);
	close(fd);
	if (rc < 0) {
		fprintf(stderr, "kpeer: ueid-add '%s': %s\n", ueid, strerror(-rc));
		return 1;
	}
	return 0;
}

static void ueid_cb(struct nlmsghdr *h, void *ctx)
{
	char *p = (char *)NLMSG_DATA(h) + GENL_HDRLEN;
	int len = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);

	(void)ctx;
	for_each_attr(a, p, len) {
		if ((a->nla_type & NLA_TYPE_MASK) == SMC_NLA_EID_TABLE_ENTRY) {
			char s[SMC_MAX_EID_LEN + 1];
			int n = ATTR_LEN(a) < SMC_MAX_EID_LEN ? ATTR_LEN(a) : SMC_MAX_EID_LEN;
			memcpy(s, ATTR_DATA(a), n);
			s[n] = 0;
			while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == 0))
				s[--n] = 0;
			sanitize(s);
			out("ueid", "ueid=%s", s);
		}
	}
}

static int cmd_ueid_list(void)
{
	struct nlbuf r;
	int fd = smc_genl_req(&r, SMC_NETLINK_DUMP_UEID, NLM_F_DUMP), rc;

	if (fd < 0)
		return 1;
	rc = nl_talk(fd, &r.nlh, ueid_cb, NULL);
	close(fd);
	return rc < 0;
}

/* --------------------------------------------------------- link groups */

struct lgr_list {
	char ids[256];
	int n;
	int print;
	int links_dump; /* this dump repeats each link group before its links */
};

/* Attributes whose payload is a string, whatever its length. */
static int is_string_attr(const char *nm)
{
	static const char *const str[] = { "pnetid", "ibdev", "gid", "peer_gid", "v2_neg_eid",
					   "v2_peer_host" };

	for (size_t i = 0; i < sizeof(str) / sizeof(*str); i++)
		if (!strcmp(nm, str[i]))
			return 1;
	return 0;
}

/* Append " name=value" for every known attribute of a nest. */
static void print_attrs(char *buf, size_t sz, struct nlattr *nest, const char *const *names,
			int nnames)
{
	size_t o = strlen(buf);

	for_each_attr(a, ATTR_DATA(nest), ATTR_LEN(nest)) {
		int t = a->nla_type & NLA_TYPE_MASK, l = ATTR_LEN(a);
		const char *nm = t < nnames && names[t] ? names[t] : NULL;
		char v[96];

		if (!nm || o + 140 > sz)
			continue;
		if (is_string_attr(nm)) {
			int n = l < (int)sizeof(v) - 1 ? l : (int)sizeof(v) - 1;
			memcpy(v, ATTR_DATA(a), n);
			v[n] = 0;
			n = strlen(v); /* EIDs and host names are blank-padded */
			while (n > 0 && v[n - 1] == ' ')
				v[--n] = 0;
		} else if (l == 1)
			snprintf(v, sizeof(v), "%u", *(uint8_t *)ATTR_DATA(a));
		else if (l == 2)
			snprintf(v, sizeof(v), "%u", *(uint16_t *)ATTR_DATA(a));
		else if (l == 4)
			snprintf(v, sizeof(v), strstr(nm, "uid") ? "0x%08x" : "%u",
				 *(uint32_t *)ATTR_DATA(a));
		else if (l == 8)
			snprintf(v, sizeof(v), "%llu", (unsigned long long)*(uint64_t *)ATTR_DATA(a));
		else
			continue;
		sanitize(v);
		o += snprintf(buf + o, sz - o, " %s=%s", nm, *v ? v : "-");
	}
}

static const char *const lgr_names[] = {
	[SMC_NLA_LGR_R_ID] = "id", [SMC_NLA_LGR_R_ROLE] = "role", [SMC_NLA_LGR_R_TYPE] = "type",
	[SMC_NLA_LGR_R_PNETID] = "pnetid", [SMC_NLA_LGR_R_VLAN_ID] = "vlan",
	[SMC_NLA_LGR_R_CONNS_NUM] = "conns", [SMC_NLA_LGR_R_BUF_TYPE] = "buf_type",
};
static const char *const lgr_v2_names[] = {
	[SMC_NLA_LGR_V2_VER] = "v2_ver", [SMC_NLA_LGR_V2_REL] = "v2_rel",
	[SMC_NLA_LGR_V2_OS] = "v2_peer_os", [SMC_NLA_LGR_V2_NEG_EID] = "v2_neg_eid",
	[SMC_NLA_LGR_V2_PEER_HOST] = "v2_peer_host",
};
static const char *const link_names[] = {
	[SMC_NLA_LINK_ID] = "link_id", [SMC_NLA_LINK_IB_DEV] = "ibdev",
	[SMC_NLA_LINK_IB_PORT] = "ibport", [SMC_NLA_LINK_GID] = "gid",
	[SMC_NLA_LINK_PEER_GID] = "peer_gid", [SMC_NLA_LINK_CONN_CNT] = "conns",
	[SMC_NLA_LINK_NET_DEV] = "netdev_ifindex", [SMC_NLA_LINK_UID] = "uid",
	[SMC_NLA_LINK_PEER_UID] = "peer_uid", [SMC_NLA_LINK_STATE] = "state",
};

static void lgr_cb(struct nlmsghdr *h, void *ctx)
{
	struct lgr_list *l = ctx;
	char *p = (char *)NLMSG_DATA(h) + GENL_HDRLEN;
	int len = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);

	for_each_attr(a, p, len) {
		int t = a->nla_type & NLA_TYPE_MASK;
		char line[1024] = "";

		if (t == SMC_GEN_LGR_SMCR && !l->links_dump) {
			for_each_attr(b, ATTR_DATA(a), ATTR_LEN(a)) {
				int bt = b->nla_type & NLA_TYPE_MASK;
				if (bt == SMC_NLA_LGR_R_ID && ATTR_LEN(b) == 4) {
					size_t o = strlen(l->ids);
					snprintf(l->ids + o, sizeof(l->ids) - o, "%s%u", l->n ? "," : "",
						 *(uint32_t *)ATTR_DATA(b));
					l->n++;
				}
				if (bt == SMC_NLA_LGR_R_V2_COMMON)
					print_attrs(line, sizeof(line), b, lgr_v2_names,
						    sizeof(lgr_v2_names) / sizeof(*lgr_v2_names));
			}
			if (l->print) {
				char head[1024] = "";
				print_attrs(head, sizeof(head), a, lgr_names,
					    sizeof(lgr_names) / sizeof(*lgr_names));
				out("lgr", "%s%s", *head ? head + 1 : "-", line);
			}
		} else if (t == SMC_GEN_LINK_SMCR && l->print) {
			print_attrs(line, sizeof(line), a, link_names,
				    sizeof(link_names) / sizeof(*link_names));
			out("link", "%s", *line ? line + 1 : "-");
		}
	}
}

/* Collect (and optionally print) the SMC-R link groups. ids gets "1,2" or "-". */
static int lgr_dump(int print, char *ids, size_t idsz)
{
	struct lgr_list l = { .print = print };
	struct nlbuf r;
	int fd, rc;

	fd = smc_genl_req(&r, SMC_NETLINK_GET_LGR_SMCR, NLM_F_DUMP);
	if (fd < 0)
		return -1;
	rc = nl_talk(fd, &r.nlh, lgr_cb, &l);
	close(fd);
	if (print && rc == 0) {
		fd = smc_genl_req(&r, SMC_NETLINK_GET_LINK_SMCR, NLM_F_DUMP);
		l.links_dump = 1;
		if (fd >= 0) {
			nl_talk(fd, &r.nlh, lgr_cb, &l);
			close(fd);
		}
	}
	if (ids)
		snprintf(ids, idsz, "%s", l.n ? l.ids : "-");
	return rc < 0 ? -1 : l.n;
}

/* --------------------------------------------------------------- stats */

static void stats_cb(struct nlmsghdr *h, void *ctx)
{
	char *p = (char *)NLMSG_DATA(h) + GENL_HDRLEN;
	int len = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);

	(void)ctx;
	for_each_attr(a, p, len) {
		int t = a->nla_type & NLA_TYPE_MASK;
		if (t == SMC_GEN_STATS) {
			unsigned long long v[SMC_NLA_STATS_T_MAX + 1] = { 0 };
			unsigned long long cerr = 0, serr = 0;
			for_each_attr(b, ATTR_DATA(a), ATTR_LEN(a)) {
				int bt = b->nla_type & NLA_TYPE_MASK;
				if (bt == SMC_NLA_STATS_CLNT_HS_ERR_CNT && ATTR_LEN(b) == 8)
					cerr = *(uint64_t *)ATTR_DATA(b);
				if (bt == SMC_NLA_STATS_SRV_HS_ERR_CNT && ATTR_LEN(b) == 8)
					serr = *(uint64_t *)ATTR_DATA(b);
				if (bt != SMC_NLA_STATS_SMCR_TECH)
					continue;
				for_each_attr(c, ATTR_DATA(b), ATTR_LEN(b)) {
					int ct = c->nla_type & NLA_TYPE_MASK;
					if (ct <= SMC_NLA_STATS_T_MAX && ATTR_LEN(c) == 8)
						v[ct] = *(uint64_t *)ATTR_DATA(c);
				}
			}
			out("stats",
			    "smcr_clnt_v1_succ=%llu smcr_clnt_v2_succ=%llu smcr_srv_v1_succ=%llu "
			    "smcr_srv_v2_succ=%llu smcr_urg_data=%llu smcr_rx_bytes=%llu "
			    "smcr_tx_bytes=%llu clnt_hs_err=%llu srv_hs_err=%llu",
			    v[SMC_NLA_STATS_T_CLNT_V1_SUCC], v[SMC_NLA_STATS_T_CLNT_V2_SUCC],
			    v[SMC_NLA_STATS_T_SRV_V1_SUCC], v[SMC_NLA_STATS_T_SRV_V2_SUCC],
			    v[SMC_NLA_STATS_T_URG_DATA_CNT], v[SMC_NLA_STATS_T_RX_BYTES],
			    v[SMC_NLA_STATS_T_TX_BYTES], cerr, serr);
		} else if (t == SMC_GEN_FBACK_STATS) {
			unsigned long long srv = 0, clnt = 0;
			unsigned code = 0, cnt = 0, type = 0;
			for_each_attr(b, ATTR_DATA(a), ATTR_LEN(a)) {
				int bt = b->nla_type & NLA_TYPE_MASK, l = ATTR_LEN(b);
				void *d = ATTR_DATA(b);
				if (bt == SMC_NLA_FBACK_STATS_TYPE && l == 1)
					type = *(uint8_t *)d;
				else if (bt == SMC_NLA_FBACK_STATS_SRV_CNT && l == 8)
					srv = *(uint64_t *)d;
				else if (bt == SMC_NLA_FBACK_STATS_CLNT_CNT && l == 8)
					clnt = *(uint64_t *)d;
				else if (bt == SMC_NLA_FBACK_STATS_RSN_CODE && l == 4)
					code = *(uint32_t *)d;
				else if (bt == SMC_NLA_FBACK_STATS_RSN_CNT && l == 2)
					cnt = *(uint16_t *)d;
			}
			out("fallback-stats", "type=%s reason=0x%08x count=%u srv_total=%llu clnt_total=%llu",
			    type ? "server" : "client", code, cnt, srv, clnt);
		}
	}
}

static int cmd_stats(void)
{
	struct nlbuf r;
	int fd, rc;

	fd = smc_genl_req(&r, SMC_NETLINK_GET_STATS, NLM_F_DUMP);
	if (fd < 0)
		return 1;
	rc = nl_talk(fd, &r.nlh, stats_cb, NULL);
	close(fd);
	fd = smc_genl_req(&r, SMC_NETLINK_GET_FBACK_STATS, NLM_F_DUMP);
	if (fd >= 0) {
		nl_talk(fd, &r.nlh, stats_cb, NULL);
		close(fd);
	}
	return rc < 0;
}

/* ------------------------------------------------------------- smc_diag */

/* Names of the SMC_CLC_DECL_* codes (linux net/smc/smc_clc.h). */
static const char *decl_name(uint32_t r)
{
	static const struct { uint32_t c; const char *n; } t[] = {
		{ 0, "NONE" }, { 0x01010000, "MEM" }, { 0x02010000, "TIMEOUT_CL" },
		{ 0x02020000, "TIMEOUT_AL" }, { 0x03000000, "CNFERR" }, { 0x03010000, "PEERNOSMC" },
		{ 0x03020000, "IPSEC" }, { 0x03030000, "NOSMCDEV" }, { 0x03030001, "NOSMCDDEV" },
		{ 0x03030002, "NOSMCRDEV" }, { 0x03030003, "NOISM2SUPP" }, { 0x03030004, "NOV2EXT" },
		{ 0x03030005, "NOV2DEXT" }, { 0x03030006, "NOSEID" }, { 0x03030007, "NOSMCD2DEV" },
		{ 0x03030008, "NOUEID" }, { 0x03030009, "RELEASEERR" }, { 0x0303000a, "MAXCONNERR" },
		{ 0x0303000b, "MAXLINKERR" }, { 0x03040000, "MODEUNSUPP" }, { 0x03050000, "RMBE_EC" },
		{ 0x03060000, "OPTUNSUPP" }, { 0x03070000, "DIFFPREFIX" }, { 0x03080000, "GETVLANERR" },
		{ 0x03090000, "ISMVLANERR" }, { 0x030a0000, "NOACTLINK" }, { 0x030b0000, "NOSRVLINK" },
		{ 0x030c0000, "VERSMISMAT" }, { 0x030d0000, "MAX_DMB" }, { 0x030e0000, "NOROUTE" },
		{ 0x030f0000, "NOINDIRECT" }, { 0x04000000, "SYNCERR" }, { 0x05000000, "PEERDECL" },
		{ 0x09990000, "INTERR" }, { 0x09990001, "ERR_RTOK" }, { 0x09990002, "ERR_RDYLNK" },
		{ 0x09990003, "ERR_REGBUF" },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(*t); i++)
		if (t[i].c == r)
			return t[i].n;
	return (int32_t)r < 0 ? "LOCAL_ERRNO" : "UNKNOWN";
}

struct diag {
	int found;
	int mode; /* SMC_DIAG_MODE_* or -1 */
	unsigned state, shutdown;
	char local[64], remote[64];
	unsigned long long inode;
	int have_conn, have_lgr, have_fb;
	struct smc_diag_conninfo conn;
	unsigned lgr_role, link_id, ibport;
	char ibdev[IB_DEVICE_NAME_MAX + 1], gid[41], peer_gid[41];
	uint32_t reason, peer_diag;
};

static const char *mode_name(int m)
{
	switch (m) {
	case SMC_DIAG_MODE_SMCR: return "SMCR";
	case SMC_DIAG_MODE_FALLBACK_TCP: return "FALLBACK";
	case SMC_DIAG_MODE_SMCD: return "SMCD";
	default: return "unknown";
	}
}

static void addr_str(const struct inet_diag_sockid *id, int src, char *o, size_t n)
{
	char a[INET6_ADDRSTRLEN];
	const void *p = src ? (const void *)id->idiag_src : (const void *)id->idiag_dst;

	inet_ntop(AF_INET, p, a, sizeof(a));
	snprintf(o, n, "%s:%u", a, ntohs(src ? id->idiag_sport : id->idiag_dport));
}

static void copy_str(char *d, const void *s, size_t n, size_t dsz)
{
	size_t l = n < dsz - 1 ? n : dsz - 1;

	memcpy(d, s, l);
	d[l] = 0;
	d[strnlen(d, l)] = 0;
	sanitize(d);
}

static void parse_diag(struct nlmsghdr *h, struct diag *d)
{
	struct smc_diag_msg *m = NLMSG_DATA(h);
	char *p = (char *)m + NLMSG_ALIGN(sizeof(*m));
	int len = (int)h->nlmsg_len - NLMSG_LENGTH(NLMSG_ALIGN(sizeof(*m)));

	memset(d, 0, sizeof(*d));
	d->found = 1;
	d->mode = m->diag_mode;
	d->state = m->diag_state;
	d->shutdown = m->diag_shutdown;
	d->inode = m->diag_inode;
	addr_str(&m->id, 1, d->local, sizeof(d->local));
	addr_str(&m->id, 0, d->remote, sizeof(d->remote));
	strcpy(d->ibdev, "-");
	strcpy(d->gid, "-");
	strcpy(d->peer_gid, "-");
	/* the extensions are classic rtattrs; nlattr has the same layout */
	for_each_attr(a, p, len) {
		void *v = ATTR_DATA(a);
		int l = ATTR_LEN(a);
		switch (a->nla_type) {
		case SMC_DIAG_CONNINFO:
			if (l >= (int)sizeof(d->conn)) {
				memcpy(&d->conn, v, sizeof(d->conn));
				d->have_conn = 1;
			}
			break;
		case SMC_DIAG_LGRINFO:
			if (l >= (int)sizeof(struct smc_diag_lgrinfo)) {
				struct smc_diag_lgrinfo *g = v;
				d->have_lgr = 1;
				d->lgr_role = g->role;
				d->link_id = g->lnk[0].link_id;
				d->ibport = g->lnk[0].ibport;
				copy_str(d->ibdev, g->lnk[0].ibname, sizeof(g->lnk[0].ibname),
					 sizeof(d->ibdev));
				copy_str(d->gid, g->lnk[0].gid, sizeof(g->lnk[0].gid), sizeof(d->gid));
				copy_str(d->peer_gid, g->lnk[0].peer_gid, sizeof(g->lnk[0].peer_gid),
					 sizeof(d->peer_gid));
			}
			break;
		case SMC_DIAG_FALLBACK:
			if (l >= (int)sizeof(struct smc_diag_fallback)) {
				struct smc_diag_fallback *f = v;
				d->have_fb = 1;
				d->reason = f->reason;
				d->peer_diag = f->peer_diagnosis;
			}
			break;
		}
	}
}

struct diag_ctx {
	unsigned long long inode; /* 0 = print every socket */
	struct diag *d;
};

static void diag_fmt(const struct diag *d, char *o, size_t n)
{
	int k = snprintf(o, n, "mode=%s state=%u shutdown=%u local=%s remote=%s reason=0x%08x "
			 "reason_name=%s peer_diag=0x%08x peer_diag_name=%s",
			 mode_name(d->mode), d->state, d->shutdown, d->local, d->remote, d->reason,
			 decl_name(d->reason), d->peer_diag, decl_name(d->peer_diag));
	if (d->have_conn && k < (int)n)
		k += snprintf(o + k, n - k, " token=0x%x sndbuf=%u rmbe=%u peer_rmbe=%u",
			      d->conn.token, d->conn.sndbuf_size, d->conn.rmbe_size,
			      d->conn.peer_rmbe_size);
	if (d->have_lgr && k < (int)n)
		snprintf(o + k, n - k, " lgr_role=%s link_id=%u ibdev=%s ibport=%u gid=%s peer_gid=%s",
			 d->lgr_role ? "SERVER" : "CLIENT", d->link_id, d->ibdev, d->ibport, d->gid,
			 d->peer_gid);
}

static void diag_cb(struct nlmsghdr *h, void *ctx)
{
	struct diag_ctx *c = ctx;
	struct smc_diag_msg *m = NLMSG_DATA(h);
	struct diag d;

	if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*m)))
		return;
	if (c->inode && m->diag_inode != c->inode)
		return;
	parse_diag(h, &d);
	if (c->d)
		*c->d = d;
	if (!c->inode) {
		char s[1024];
		diag_fmt(&d, s, sizeof(s));
		out("sock", "inode=%llu %s", d.inode, s);
	}
}

static int diag_query(unsigned long long inode, struct diag *d)
{
	struct {
		struct nlmsghdr nlh;
		struct smc_diag_req r;
	} req;
	struct diag_ctx c = { .inode = inode, .d = d };
	int fd = nl_open(NETLINK_SOCK_DIAG), rc;

	if (d)
		memset(d, 0, sizeof(*d));
	if (d)
		d->mode = -1;
	if (fd < 0)
		return -1;
	memset(&req, 0, sizeof(req));
	req.nlh.nlmsg_len = sizeof(req);
	req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	req.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	req.nlh.nlmsg_seq = 4;
	req.r.diag_family = AF_SMC;
	req.r.diag_ext = (1 << (SMC_DIAG_CONNINFO - 1)) | (1 << (SMC_DIAG_LGRINFO - 1)) |
			 (1 << (SMC_DIAG_SHUTDOWN - 1)) | (1 << (SMC_DIAG_FALLBACK - 1));
	rc = nl_talk(fd, &req.nlh, diag_cb, &c);
	close(fd);
	if (rc < 0)
		fprintf(stderr, "kpeer: smc_diag: %s\n", strerror(-rc));
	return rc;
}

static unsigned long long fd_inode(int fd)
{
	struct stat st;

	return fstat(fd, &st) ? 0 : (unsigned long long)st.st_ino;
}

/* ------------------------------------------------------- connection record */

struct conn {
	int fd;
	int idx;
	const char *role;
	const char *scen;
	double t0;
	struct diag at_open;
	char lgrs[256];
	uint64_t sent, recvd, bad;
	uint64_t rx_hash;
	int fail;
	char err[160];
	char detail[400];
};

static void conn_open(struct conn *c, int fd, int idx, const char *role, const char *scen)
{
	memset(c, 0, sizeof(*c));
	c->fd = fd;
	c->idx = idx;
	c->role = role;
	c->scen = scen;
	c->t0 = now_s();
	c->rx_hash = FNV_INIT;
	diag_query(fd_inode(fd), &c->at_open);
	lgr_dump(0, c->lgrs, sizeof(c->lgrs));
}

static void conn_fail(struct conn *c, const char *fmt, ...)
{
	va_list ap;

	if (c->fail)
		return; /* keep the first reason */
	c->fail = 1;
	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	sanitize(c->err);
}

static void conn_note(struct conn *c, const char *fmt, ...)
{
	size_t o = strlen(c->detail);
	va_list ap;

	if (o + 2 >= sizeof(c->detail))
		return;
	if (o)
		c->detail[o++] = ';';
	va_start(ap, fmt);
	vsnprintf(c->detail + o, sizeof(c->detail) - o, fmt, ap);
	va_end(ap);
	sanitize(c->detail);
}

/* Emit the connection's result line, then close it. The mode is the one
 * smc_diag reported right after connect()/accept(). */
static int conn_close(struct conn *c)
{
	char d[1024];
	double secs = now_s() - c->t0;
	struct diag end;

	/* the final diag shows the cursors and the close state */
	diag_query(fd_inode(c->fd), &end);
	if (!c->at_open.found)
		conn_fail(c, "no-smc_diag-entry");
	diag_fmt(&c->at_open, d, sizeof(d));
	/* end_*: smc_diag after the data, before close(): after a failover (RFC 7609
	 * section 4.6) still SMCR, on the link the connection moved to */
	out("conn", "role=%s idx=%d scen=%s result=%s %s lgrs=%s sent=%llu recv=%llu mismatch=%llu "
		    "rx_fnv=%016llx secs=%.3f mbps=%.2f end_state=%u end_mode=%s end_link_id=%u "
		    "end_ibdev=%s err=%s detail=%s",
	    c->role, c->idx, c->scen, c->fail ? "fail" : "ok", d, c->lgrs,
	    (unsigned long long)c->sent, (unsigned long long)c->recvd,
	    (unsigned long long)c->bad, (unsigned long long)c->rx_hash, secs,
	    secs > 0 ? (c->sent + c->recvd) / secs / 1e6 : 0.0, end.found ? end.state : 0,
	    end.found ? mode_name(end.mode) : "-", end.have_lgr ? end.link_id : 0,
	    end.have_lgr ? end.ibdev : "-", *c->err ? c->err : "-", *c->detail ? c->detail : "-");
	/* the kernel's link groups and links as this connection ends (after a failover and
	 * re-add: which links it has now) */
	lgr_dump(1, NULL, 0);
	close(c->fd);
	return c->fail;
}

/* ------------------------------------------------------------ socket I/O */

static void set_bufs(int fd, int sz)
{
	if (sz <= 0)
		return;
	/* as root, FORCE ignores net.core.[rw]mem_max; the kernel doubles it */
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)))
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)))
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
}

static int wait_fd(int fd, short ev, int timeout_s)
{
	struct pollfd p = { .fd = fd, .events = ev };
	int r;

	do
		r = poll(&p, 1, timeout_s * 1000);
	while (r < 0 && errno == EINTR);
	return r > 0 ? p.revents : 0;
}

/* Read exactly n bytes (pattern-checked when seed >= 0). Returns the number
 * read; stops early at EOF, error or timeout (reason in c). */
static size_t read_exact(struct conn *c, unsigned char *buf, size_t n, int64_t seed, uint64_t off)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r;
		if (!wait_fd(c->fd, POLLIN, g_iotimeout)) {
			conn_fail(c, "timeout-reading-%zu/%zu", got, n);
			break;
		}
		r = read(c->fd, buf + got, n - got);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r < 0) {
			conn_fail(c, "read-error-%s", strerror(errno));
			break;
		}
		if (r == 0) {
			conn_fail(c, "eof-after-%zu/%zu", got, n);
			break;
		}
		c->rx_hash = fnv(c->rx_hash, buf + got, r);
		if (seed >= 0)
			c->bad += pat_check(buf + got, r, seed, off + got);
		got += r;
		c->recvd += r;
	}
	return got;
}

static int write_all(struct conn *c, const unsigned char *b, size_t n)
{
	size_t off = 0;

	while (off < n) {
		ssize_t w = send(c->fd, b + off, n - off, MSG_NOSIGNAL);
		if (w < 0 && (errno == EINTR || errno == EAGAIN)) {
			if (errno == EAGAIN && !wait_fd(c->fd, POLLOUT, g_iotimeout)) {
				conn_fail(c, "timeout-writing");
				return -1;
			}
			continue;
		}
		if (w < 0) {
			conn_fail(c, "write-error-%s", strerror(errno));
			return -1;
		}
		off += w;
		c->sent += w;
	}
	return 0;
}

static int write_pattern(struct conn *c, size_t n, uint64_t seed, uint64_t off)
{
	static unsigned char b[65536];

	while (n) {
		size_t k = n < sizeof(b) ? n : sizeof(b);
		pat_fill(b, k, seed, off);
		if (write_all(c, b, k))
			return -1;
		n -= k;
		off += k;
	}
	return 0;
}

/* Read until EOF; pattern-check when seed >= 0. Returns bytes read. */
static uint64_t read_to_eof(struct conn *c, int64_t seed, uint64_t off)
{
	static unsigned char b[65536];
	uint64_t tot = 0;

	for (;;) {
		ssize_t r;
		if (!wait_fd(c->fd, POLLIN, g_iotimeout)) {
			conn_fail(c, "timeout-waiting-for-eof-after-%llu", (unsigned long long)tot);
			break;
		}
		r = read(c->fd, b, sizeof(b));
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r < 0) {
			conn_fail(c, "read-error-%s", strerror(errno));
			break;
		}
		if (r == 0)
			break;
		c->rx_hash = fnv(c->rx_hash, b, r);
		if (seed >= 0)
			c->bad += pat_check(b, r, seed, off + tot);
		tot += r;
		c->recvd += r;
	}
	return tot;
}

/* After the peer closed with unread data (an SMC "abnormal close", RFC 7609
 * §4.8.2 / Linux peer_conn_abort): wait for it and record what the socket
 * API shows. Linux reports SO_ERROR=ECONNRESET, read() then returns 0 and
 * write() fails with EPIPE. Passes when a reset is visible either way. */
static void expect_reset(struct conn *c)
{
	int re, soerr = 0, e;
	socklen_t l = sizeof(soerr);
	unsigned char b[64];
	ssize_t r, w;

	re = wait_fd(c->fd, POLLIN | POLLERR | POLLHUP, 15);
	usleep(200000); /* let the close CDC settle */
	getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &l);
	errno = 0;
	r = read(c->fd, b, sizeof(b));
	e = errno;
	w = send(c->fd, b, 16, MSG_NOSIGNAL | MSG_DONTWAIT);
	conn_note(c, "after-abort:revents=0x%x,so_error=%d,read=%zd/%d,write=%zd/%d", re, soerr, r,
		  r < 0 ? e : 0, w, w < 0 ? errno : 0);
	if (!(soerr == ECONNRESET || (r < 0 && e == ECONNRESET)))
		conn_fail(c, "no-reset-seen-so_error-%d", soerr);
}

/* ---------------------------------------------------------- scenarios */

static unsigned char g_buf[1 << 16];

/*
 * echo (server half): echo every byte until EOF, then close. Used by the
 * echo and multi scenarios.
 */
static void srv_echo(struct conn *c)
{
	for (;;) {
		ssize_t r;
		if (!wait_fd(c->fd, POLLIN, g_iotimeout)) {
			conn_fail(c, "timeout-no-data");
			return;
		}
		r = read(c->fd, g_buf, sizeof(g_buf));
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r < 0) {
			conn_fail(c, "read-error-%s", strerror(errno));
			return;
		}
		if (r == 0)
			return;
		c->recvd += r;
		c->rx_hash = fnv(c->rx_hash, g_buf, r);
		if (write_all(c, g_buf, r))
			return;
	}
}

/* echo (client half): send size pattern bytes while reading the echo, hold
 * the idle connection for hold seconds, shutdown(SHUT_WR), expect EOF. */
static void cli_echo(struct conn *c, uint64_t size, uint64_t seed, int hold)
{
	static unsigned char wb[65536], rb[65536];
	int shut = 0;

	fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
	for (;;) {
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		int r;

		if (c->sent < size)
			p.events |= POLLOUT;
		if (c->sent == size && c->recvd == size && !shut) {
			if (hold > 0) {
				conn_note(c, "held-idle-%ds", hold);
				sleep(hold);
			}
			shutdown(c->fd, SHUT_WR);
			shut = 1;
		}
		r = poll(&p, 1, g_iotimeout * 1000);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			conn_fail(c, "timeout-sent-%llu-recv-%llu", (unsigned long long)c->sent,
				  (unsigned long long)c->recvd);
			break;
		}
		if ((p.revents & POLLOUT) && c->sent < size) {
			size_t n = size - c->sent < sizeof(wb) ? size - c->sent : sizeof(wb);
			ssize_t w;
			pat_fill(wb, n, seed, c->sent);
			w = send(c->fd, wb, n, MSG_NOSIGNAL);
			if (w > 0)
				c->sent += w;
			else if (w < 0 && errno != EAGAIN && errno != EINTR) {
				conn_fail(c, "write-error-%s", strerror(errno));
				break;
			}
		}
		if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t n = read(c->fd, rb, sizeof(rb));
			if (n > 0) {
				c->bad += pat_check(rb, n, seed, c->recvd);
				c->rx_hash = fnv(c->rx_hash, rb, n);
				c->recvd += n;
				if (c->recvd > size) {
					conn_fail(c, "echo-longer-than-sent");
					break;
				}
			} else if (n == 0) {
				if (c->recvd != size)
					conn_fail(c, "eof-after-%llu/%llu",
						  (unsigned long long)c->recvd,
						  (unsigned long long)size);
				break;
			} else if (errno != EAGAIN && errno != EINTR) {
				conn_fail(c, "read-error-%s", strerror(errno));
				break;
			}
		}
	}
	fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) & ~O_NONBLOCK);
	if (c->bad)
		conn_fail(c, "echo-mismatch");
}

/*
 * urg, client half: 1000 B, urgent 'U' (MSG_OOB), 2000 B, shutdown(SHUT_WR).
 * Then wait for POLLPRI (the server's urgent 'V'), read the 1000 B echoed
 * before the mark, recv(MSG_OOB) 'V', read the remaining 2000 B echo + EOF.
 * The urgent byte is never part of the echoed stream. Waiting for POLLPRI
 * before reading is deliberate: a Linux receiver that consumed everything up
 * to the mark before the urgent CDC arrived never moves its consumer cursor
 * past the urgent byte, and the Linux sender then blocks (README, "urgent").
 */
#define URG_A 1000
#define URG_B 2000
static void cli_urg(struct conn *c, uint64_t seed)
{
	unsigned char u = 'U', v = 0;
	ssize_t r;
	int re;

	if (write_pattern(c, URG_A, seed, 0))
		return;
	usleep(200000);
	if (send(c->fd, &u, 1, MSG_OOB | MSG_NOSIGNAL) != 1) {
		conn_fail(c, "send-oob-%s", strerror(errno));
		return;
	}
	usleep(200000);
	if (write_pattern(c, URG_B, seed, URG_A))
		return;
	shutdown(c->fd, SHUT_WR);
	re = wait_fd(c->fd, POLLPRI, 15);
	if (!(re & POLLPRI)) {
		conn_fail(c, "no-POLLPRI-from-server");
		return;
	}
	if (read_exact(c, g_buf, URG_A, seed, 0) != URG_A)
		return;
	r = recv(c->fd, &v, 1, MSG_OOB);
	conn_note(c, "oob_rx=%c", r == 1 && v > ' ' && v < 127 ? v : '?');
	if (r != 1 || v != 'V') {
		conn_fail(c, "oob-expected-V-got-%zd", r);
		return;
	}
	if (read_to_eof(c, seed, URG_A) != URG_B)
		conn_fail(c, "tail-length-%llu-expected-%d", (unsigned long long)c->recvd - URG_A,
			  URG_B);
	if (c->bad)
		conn_fail(c, "data-mismatch");
}

/* urg, server half: wait for POLLPRI, read the 1000 B up to the mark,
 * recv(MSG_OOB) 'U', echo the 1000 B, send urgent 'V', then echo the rest
 * (2000 B) until EOF and close. */
static void srv_urg(struct conn *c, uint64_t seed)
{
	unsigned char u = 0, v = 'V';
	ssize_t r;
	int re;

	re = wait_fd(c->fd, POLLPRI, 15);
	if (!(re & POLLPRI)) {
		conn_fail(c, "no-POLLPRI-from-client");
		return;
	}
	if (read_exact(c, g_buf, URG_A, seed, 0) != URG_A)
		return;
	r = recv(c->fd, &u, 1, MSG_OOB);
	conn_note(c, "oob_rx=%c", r == 1 && u > ' ' && u < 127 ? u : '?');
	if (r != 1 || u != 'U') {
		conn_fail(c, "oob-expected-U-got-%zd", r);
		return;
	}
	if (write_all(c, g_buf, URG_A))
		return;
	usleep(200000);
	if (send(c->fd, &v, 1, MSG_OOB | MSG_NOSIGNAL) != 1) {
		conn_fail(c, "send-oob-%s", strerror(errno));
		return;
	}
	/* echo the rest; it must continue the pattern without the urgent byte */
	for (;;) {
		if (!wait_fd(c->fd, POLLIN, g_iotimeout)) {
			conn_fail(c, "timeout-reading-tail");
			return;
		}
		r = read(c->fd, g_buf, sizeof(g_buf));
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0)
			break;
		c->bad += pat_check(g_buf, r, seed, c->recvd);
		c->rx_hash = fnv(c->rx_hash, g_buf, r);
		c->recvd += r;
		if (write_all(c, g_buf, r))
			return;
	}
	if (c->recvd != URG_A + URG_B)
		conn_fail(c, "received-%llu-expected-%d", (unsigned long long)c->recvd, URG_A + URG_B);
	if (c->bad)
		conn_fail(c, "data-mismatch");
}

/*
 * srvhalf: the server closes its sending side first.
 * client: 10000 B; read the 10000 B echo, then EOF; send 20000 B more
 *         (pattern continues at offset 10000); shutdown(SHUT_WR); close.
 * server: read 10000 B, echo them, shutdown(SHUT_WR); read until EOF and
 *         check the 20000 B that arrive after its own half-close; close.
 */
#define HALF_A 10000
#define HALF_B 20000
static void cli_srvhalf(struct conn *c, uint64_t seed)
{
	unsigned char t[16];
	ssize_t r;

	if (write_pattern(c, HALF_A, seed, 0))
		return;
	if (read_exact(c, g_buf, HALF_A, seed, 0) != HALF_A)
		return;
	if (!wait_fd(c->fd, POLLIN, g_iotimeout)) {
		conn_fail(c, "no-eof-from-server-half-close");
		return;
	}
	r = read(c->fd, t, sizeof(t));
	if (r != 0) {
		conn_fail(c, "expected-eof-got-%zd", r);
		return;
	}
	conn_note(c, "server-half-closed");
	if (write_pattern(c, HALF_B, seed, HALF_A))
		return;
	shutdown(c->fd, SHUT_WR);
	if (c->bad)
		conn_fail(c, "data-mismatch");
}

static void srv_srvhalf(struct conn *c, uint64_t seed)
{
	uint64_t tail;

	if (read_exact(c, g_buf, HALF_A, seed, 0) != HALF_A)
		return;
	if (write_all(c, g_buf, HALF_A))
		return;
	shutdown(c->fd, SHUT_WR);
	tail = read_to_eof(c, seed, HALF_A);
	conn_note(c, "after_half_close=%llu", (unsigned long long)tail);
	if (tail != HALF_B)
		conn_fail(c, "after-half-close-%llu-expected-%d", (unsigned long long)tail, HALF_B);
	if (c->bad)
		conn_fail(c, "data-mismatch");
}

/*
 * abort: closing with unread data is an abnormal close.
 * connection 0: client sends 32768 B; the server reads 1000 B, waits 0.5 s
 *               and close()s; the client must see a reset.
 * connection 1: server sends 32768 B; the client reads 1000 B, waits 0.5 s
 *               and close()s; the server must see a reset.
 */
#define ABORT_TX 32768
#define ABORT_RX 1000
static void abort_sender(struct conn *c, uint64_t seed)
{
	if (write_pattern(c, ABORT_TX, seed, 0))
		return;
	expect_reset(c);
}

static void abort_closer(struct conn *c, uint64_t seed)
{
	if (read_exact(c, g_buf, ABORT_RX, seed, 0) != ABORT_RX)
		return;
	usleep(500000);
	conn_note(c, "closing-with-unread-data");
	if (c->bad)
		conn_fail(c, "data-mismatch");
}

/* ------------------------------------------------------------ server */

static int ctl_open(int fd)
{
	struct termios t;

	if (fd < 0)
		return -1;
	if (!tcgetattr(fd, &t)) {
		cfmakeraw(&t);
		tcsetattr(fd, TCSANOW, &t);
	}
	return fd;
}

/* Read one line from the control fd (non-blocking when ready). Returns 1 if
 * a complete line is in line[]. */
static int ctl_line(int fd, char *line, size_t n)
{
	static char acc[256];
	static size_t len;

	for (;;) {
		char *nl = memchr(acc, '\n', len);
		char ch;
		ssize_t r;

		if (!nl)
			nl = memchr(acc, '\r', len);
		if (nl) {
			size_t l = nl - acc;
			snprintf(line, n, "%.*s", (int)l, acc);
			memmove(acc, nl + 1, len - l - 1);
			len -= l + 1;
			if (*line)
				return 1;
			continue;
		}
		if (!wait_fd(fd, POLLIN, 0))
			return 0;
		r = read(fd, &ch, 1);
		if (r <= 0)
			return 0;
		if (len < sizeof(acc))
			acc[len++] = ch;
	}
}

static int serve_conn(int fd, int idx, const char *scen)
{
	struct conn c;
	uint64_t seed = idx;

	conn_open(&c, fd, idx, "server", scen);
	if (!strcmp(scen, "echo") || !strcmp(scen, "multi"))
		srv_echo(&c);
	else if (!strcmp(scen, "urg"))
		srv_urg(&c, seed);
	else if (!strcmp(scen, "srvhalf"))
		srv_srvhalf(&c, seed);
	else if (!strcmp(scen, "abort")) {
		if (idx % 2 == 0)
			abort_closer(&c, seed);
		else
			abort_sender(&c, seed);
	} else
		conn_fail(&c, "unknown-scenario");
	return conn_close(&c);
}

static int cmd_serve(int argc, char **argv)
{
	int port = argnum(argc, argv, "port", 5000);
	const char *scen = arg(argc, argv, "scen", "echo");
	int bufsize = argnum(argc, argv, "bufsize", 0);
	int ctl = ctl_open(argnum(argc, argv, "ctlfd", -1));
	int maxconns = argnum(argc, argv, "maxconns", 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int one = 1, ls, idx = 0, ok = 0, failed = 0, running = 0, stop = 0;
	double stop_at = 0;
	pid_t kids[1024];
	int nkids = 0;

	ls = socket(AF_SMC, SOCK_STREAM | SOCK_CLOEXEC, SMCPROTO_SMC);
	if (ls < 0) {
		out("error", "what=socket-AF_SMC err=%s", strerror(errno));
		return 1;
	}
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	set_bufs(ls, bufsize);
	if (bind(ls, (struct sockaddr *)&sa, sizeof(sa)) || listen(ls, 64)) {
		out("error", "what=bind-listen err=%s", strerror(errno));
		return 1;
	}
	out("listen", "port=%d scen=%s bufsize=%d", port, scen, bufsize);
	while (!stop || running) {
		struct pollfd p[2] = { { .fd = stop ? -1 : ls, .events = POLLIN },
				       { .fd = stop ? -1 : ctl, .events = POLLIN } };
		char line[128];
		int st;
		pid_t pid;

		poll(p, 2, 200);
		while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
			for (int k = 0; k < nkids; k++)
				if (kids[k] == pid)
					kids[k] = kids[--nkids];
			running--;
			if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
				ok++;
			else
				failed++;
		}
		if (ctl >= 0 && !stop && (p[1].revents & POLLIN) && ctl_line(ctl, line, sizeof(line))) {
			if (!strcmp(line, "stop") || !strcmp(line, "abort")) {
				stop = 1;
				stop_at = now_s();
				close(ls);
			}
		}
		if (stop && running && now_s() - stop_at > g_iotimeout + 20) {
			out("error", "what=connections-still-running n=%d", running);
			for (int k = 0; k < nkids; k++)
				kill(kids[k], SIGKILL);
			stop_at = now_s(); /* reaped (as failures) on the next rounds */
		}
		if (!stop && (p[0].revents & POLLIN)) {
			int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
			if (c < 0) {
				if (errno != EINTR && errno != EAGAIN)
					out("error", "what=accept err=%s", strerror(errno));
				continue;
			}
			pid = fork();
			if (pid == 0) {
				close(ls);
				_exit(serve_conn(c, idx, scen));
			}
			close(c);
			if (pid < 0) {
				out("error", "what=fork err=%s", strerror(errno));
				failed++;
			} else {
				running++;
				if (nkids < (int)(sizeof(kids) / sizeof(*kids)))
					kids[nkids++] = pid;
			}
			idx++;
			if (maxconns && idx >= maxconns) {
				stop = 1;
				stop_at = now_s();
				close(ls);
			}
		}
	}
	out("served", "conns=%d ok=%d fail=%d", idx, ok, failed);
	return failed ? 1 : 0;
}

/* ------------------------------------------------------------ client */

static int smc_connect(const char *host, int port, int bufsize, int *tries_out)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int tries;

	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		out("error", "what=bad-host host=%s", host);
		return -1;
	}
	/* the listener may not be up yet: retry refused connects for ~20 s */
	for (tries = 0;; tries++) {
		int s = socket(AF_SMC, SOCK_STREAM | SOCK_CLOEXEC, SMCPROTO_SMC);
		int e;
		if (s < 0) {
			out("error", "what=socket-AF_SMC err=%s", strerror(errno));
			return -1;
		}
		set_bufs(s, bufsize);
		if (!connect(s, (struct sockaddr *)&sa, sizeof(sa))) {
			*tries_out = tries;
			return s;
		}
		e = errno;
		close(s);
		if ((e == ECONNREFUSED || e == EHOSTUNREACH || e == ENETUNREACH) && tries < 200) {
			usleep(100000);
			continue;
		}
		out("error", "what=connect host=%s port=%d err=%s", host, port, strerror(e));
		return -1;
	}
}

static int client_one(const char *host, int port, int bufsize, int idx, const char *scen,
		      uint64_t size, int hold)
{
	struct conn c;
	int tries, s = smc_connect(host, port, bufsize, &tries);

	if (s < 0)
		return 1;
	conn_open(&c, s, idx, "client", scen);
	if (tries)
		conn_note(&c, "connect-retries=%d", tries);
	if (!strcmp(scen, "echo"))
		cli_echo(&c, size, idx, hold);
	else if (!strcmp(scen, "urg"))
		cli_urg(&c, idx);
	else if (!strcmp(scen, "srvhalf"))
		cli_srvhalf(&c, idx);
	else if (!strcmp(scen, "abort")) {
		if (idx % 2 == 0)
			abort_sender(&c, idx);
		else
			abort_closer(&c, idx);
	} else
		conn_fail(&c, "unknown-scenario");
	return conn_close(&c);
}

/*
 * multi: conns connections open at once, 4 rounds; in each round every
 * connection writes its chunk, then the echoes are read in reverse order.
 * Chunk sizes differ per connection and round so cursors wrap differently.
 */
#define MULTI_ROUNDS 4
static size_t multi_chunk(int i, int r)
{
	return 1000 + 1187 * i + 613 * r;
}

static int client_multi(const char *host, int port, int bufsize, int n)
{
	struct conn *c = calloc(n, sizeof(*c));
	int fails = 0;

	if (!c)
		return 1;
	for (int i = 0; i < n; i++) {
		int tries, s = smc_connect(host, port, bufsize, &tries);
		if (s < 0) {
			for (int k = 0; k < i; k++)
				close(c[k].fd);
			free(c);
			return 1;
		}
		conn_open(&c[i], s, i, "client", "multi");
	}
	for (int r = 0; r < MULTI_ROUNDS; r++) {
		for (int i = 0; i < n; i++)
			if (!c[i].fail)
				write_pattern(&c[i], multi_chunk(i, r), i, c[i].sent);
		for (int i = n - 1; i >= 0; i--)
			if (!c[i].fail)
				read_exact(&c[i], g_buf, multi_chunk(i, r), i, c[i].recvd);
	}
	for (int i = 0; i < n; i++)
		shutdown(c[i].fd, SHUT_WR);
	for (int i = 0; i < n; i++) {
		unsigned char t[16];
		if (!c[i].fail && wait_fd(c[i].fd, POLLIN, g_iotimeout) && read(c[i].fd, t, 16) != 0)
			conn_fail(&c[i], "expected-eof");
		if (c[i].bad)
			conn_fail(&c[i], "echo-mismatch");
		fails += conn_close(&c[i]);
	}
	free(c);
	return fails ? 1 : 0;
}

static int cmd_client(int argc, char **argv)
{
	const char *host = arg(argc, argv, "host", NULL);
	int port = argnum(argc, argv, "port", 5000);
	const char *scen = arg(argc, argv, "scen", "echo");
	const char *sizes = arg(argc, argv, "sizes", "4096");
	int hold = argnum(argc, argv, "hold", 0);
	int bufsize = argnum(argc, argv, "bufsize", 0);
	long long list[64];
	int nsizes = 0, conns, fails = 0;
	char tmp[512], *tok, *save = NULL;

	if (!host) {
		fprintf(stderr, "kpeer client: host= missing\n");
		return 2;
	}
	snprintf(tmp, sizeof(tmp), "%s", sizes);
	for (tok = strtok_r(tmp, ",", &save); tok && nsizes < 64; tok = strtok_r(NULL, ",", &save)) {
		long long v = parse_size(tok);
		if (v < 0) {
			out("error", "what=bad-size size=%s", tok);
			return 2;
		}
		list[nsizes++] = v;
	}
	if (!nsizes)
		list[nsizes++] = 4096;
	if (!strcmp(scen, "multi"))
		conns = argnum(argc, argv, "conns", 8);
	else if (!strcmp(scen, "abort"))
		conns = argnum(argc, argv, "conns", 2);
	else if (!strcmp(scen, "echo"))
		conns = argnum(argc, argv, "conns", nsizes);
	else
		conns = argnum(argc, argv, "conns", 1);
	out("client-start", "host=%s port=%d scen=%s conns=%d sizes=%s hold=%d bufsize=%d", host, port,
	    scen, conns, sizes, hold, bufsize);
	if (!strcmp(scen, "multi"))
		fails = client_multi(host, port, bufsize, conns);
	else
		for (int i = 0; i < conns; i++)
			fails += client_one(host, port, bufsize, i, scen, list[i % nsizes], hold);
	out("client-done", "conns=%d fail=%d", conns, fails);
	return fails ? 1 : 0;
}

/* ------------------------------------------------------------ waitctl */

static int cmd_waitctl(int argc, char **argv)
{
	int fd = ctl_open(argnum(argc, argv, "ctlfd", -1));
	const char *word = arg(argc, argv, "word", "go");
	int timeout = argnum(argc, argv, "timeout", 0);
	double t0 = now_s();
	char line[128];

	if (fd < 0) {
		fprintf(stderr, "kpeer waitctl: ctlfd= missing\n");
		return 2;
	}
	for (;;) {
		int left = timeout ? (int)(timeout - (now_s() - t0)) : 3600;
		if (left <= 0)
			return 1;
		if (ctl_line(fd, line, sizeof(line))) {
			if (!strcmp(line, word))
				return 0;
			if (!strcmp(line, "abort")) /* the host gave up on this run */
				return 3;
			fprintf(stderr, "kpeer waitctl: ignoring '%s' (waiting for '%s')\n", line, word);
			continue;
		}
		wait_fd(fd, POLLIN, left < 1 ? 1 : (left > 5 ? 5 : left));
	}
}

/* Print pattern bytes in hex, to cross-check another implementation. */
static int cmd_pattern(int argc, char **argv)
{
	long seed = argnum(argc, argv, "seed", 0), off = argnum(argc, argv, "off", 0);
	long len = argnum(argc, argv, "len", 64);
	unsigned char b[4096];

	if (len < 0 || len > (long)sizeof(b)) {
		fprintf(stderr, "kpeer pattern: len must be 0..%zu\n", sizeof(b));
		return 2;
	}
	pat_fill(b, len, seed, off);
	for (long i = 0; i < len; i++)
		printf("%02x", b[i]);
	printf("\n");
	return 0;
}

/* Print the next control line (for the init script's verbs loop). */
static int cmd_readctl(int argc, char **argv)
{
	int fd = ctl_open(argnum(argc, argv, "ctlfd", -1));
	int timeout = argnum(argc, argv, "timeout", 3600);
	double t0 = now_s();
	char line[128];

	if (fd < 0) {
		fprintf(stderr, "kpeer readctl: ctlfd= missing\n");
		return 2;
	}
	while (now_s() - t0 < timeout) {
		if (ctl_line(fd, line, sizeof(line))) {
			sanitize(line);
			printf("%s\n", line);
			return 0;
		}
		wait_fd(fd, POLLIN, 1);
	}
	return 1;
}

/* ------------------------------------------------------------ main */

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "help";

	setvbuf(stdout, NULL, _IONBF, 0);
	signal(SIGPIPE, SIG_IGN);
	g_vm = arg(argc, argv, "vm", getenv("KPEER_VM") ? getenv("KPEER_VM") : "vm");
	g_iotimeout = argnum(argc, argv, "iotimeout", 30);
	argc -= 2;
	argv += 2;
	if (argc < 0)
		argc = 0;
	if (!strcmp(cmd, "rxe-add"))
		return cmd_rxe_add(argc, argv);
	if (!strcmp(cmd, "rxe-del"))
		return cmd_rxe_del(argc, argv);
	if (!strcmp(cmd, "ueid-add"))
		return cmd_ueid_add(argc, argv);
	if (!strcmp(cmd, "ueid-list"))
		return cmd_ueid_list();
	if (!strcmp(cmd, "diag"))
		return diag_query(0, NULL) < 0;
	if (!strcmp(cmd, "lgr"))
		return lgr_dump(1, NULL, 0) < 0;
	if (!strcmp(cmd, "stats"))
		return cmd_stats();
	if (!strcmp(cmd, "serve"))
		return cmd_serve(argc, argv);
	if (!strcmp(cmd, "client"))
		return cmd_client(argc, argv);
	if (!strcmp(cmd, "waitctl"))
		return cmd_waitctl(argc, argv);
	if (!strcmp(cmd, "readctl"))
		return cmd_readctl(argc, argv);
	if (!strcmp(cmd, "pattern"))
		return cmd_pattern(argc, argv);
	fprintf(stderr, "usage: kpeer rxe-add|rxe-del|ueid-add|ueid-list|diag|lgr|stats|serve|client|waitctl|readctl|pattern "
			"key=value...\n");
	return 2;
}
