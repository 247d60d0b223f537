//go:build ignore
// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

/*
 * trialnet's kernel layer. Every program is attached once to the parent
 * cgroup (<cgroup2>/trialnet) and inherited by each Trial cgroup below it.
 * A Trial is identified by its cgroup at depth trial_level (the parent's
 * depth + 1), so a process that somehow sits deeper is still attributed to
 * its Trial. No policy entry, or a socket in another network namespace than
 * the one recorded for the Trial, means everything is refused.
 */

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/socket.h>
#include "include/bpf_helpers.h"
#include "include/bpf_endian.h"

/* Verdicts, named as cilium's bpf_sock.c names them. */
#define SYS_REJECT  0
#define SYS_PROCEED 1

#define AF_UNIX  1
#define AF_INET  2
#define AF_INET6 10

#define SOCK_DGRAM 2
#define SOCK_RAW   3

#define LOOPBACK_IFINDEX 1
#define UNIX_PATH_MAX    108

/* Policy flags. */
enum trial_flag {
	TRIAL_F_STRICT = 1 << 0,    /* only the proxy address:port, not all loopback */
	TRIAL_F_UNIX_OPEN = 1 << 1, /* the Trial opted out of unix socket confinement */
};

struct trial_policy {
	__u64 netns_cookie; /* SO_NETNS_COOKIE of the Trial's own namespace */
	__u32 flags;        /* enum trial_flag */
	__u32 proxy_ip4;    /* network byte order; 0 = no IPv4 proxy address */
	__u32 proxy_ip6[4]; /* network byte order; all zero = no IPv6 proxy address */
	__u16 proxy_port;   /* host byte order; 0 = no proxy */
	__u16 pad;
	__u32 pad2;
};

/* One set of counters per Trial; key 0 collects what no Trial owns. */
struct trial_counters {
	__u64 connect4_allowed;
	__u64 connect4_denied;
	__u64 connect6_allowed;
	__u64 connect6_denied;
	__u64 sendmsg4_allowed;
	__u64 sendmsg4_denied;
	__u64 sendmsg6_allowed;
	__u64 sendmsg6_denied;
	__u64 unix_connect_allowed;
	__u64 unix_connect_denied;
	__u64 unix_sendmsg_allowed;
	__u64 unix_sendmsg_denied;
	__u64 bind_denied;
	__u64 sock_create_allowed;
	__u64 sock_create_denied;
	__u64 egress_loopback_packets;
	__u64 egress_loopback_bytes;
	__u64 egress_other_packets; /* direct egress: dropped, must stay 0 */
	__u64 egress_other_bytes;
	__u64 netns_mismatch; /* refusals because the socket was not in the Trial's netns */
	__u64 no_policy;      /* refusals because the cgroup had no policy entry */
};

struct unix_key {
	__u64 cgroup_id;
	char path[UNIX_PATH_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct trial_policy);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16385);
	__type(key, __u64);
	__type(value, struct trial_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} counters_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct unix_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} unix_paths_map SEC(".maps");

/* Depth of a Trial cgroup in the cgroup2 hierarchy, set by the loader. */
volatile const __u32 trial_level = 2;


static __always_inline struct trial_counters *counters_for(__u64 cgid)
{
	struct trial_counters *c = bpf_map_lookup_elem(&counters_map, &cgid);
	if (c)
		return c;
	cgid = 0;
	return bpf_map_lookup_elem(&counters_map, &cgid);
}

#define COUNT(c, field)                     \
	do {                                \
		if (c)                      \
			(c)->field += 1;    \
	} while (0)

/*
 * policy_in_netns returns the Trial's policy when the socket lives in the
 * Trial's own namespace, and NULL (counting why) otherwise.
 */
static __always_inline struct trial_policy *policy_in_netns(void *ctx, __u64 cgid,
							   struct trial_counters *c)
{
	struct trial_policy *p = bpf_map_lookup_elem(&policy_map, &cgid);
	if (!p) {
		COUNT(c, no_policy);
		return 0;
	}
	if (bpf_get_netns_cookie(ctx) != p->netns_cookie) {
		COUNT(c, netns_mismatch);
		return 0;
	}
	return p;
}

static __always_inline int ip4_allowed(struct trial_policy *p, __u32 ip4, __u16 port)
{
	if (p->flags & TRIAL_F_STRICT)
		return p->proxy_port != 0 && p->proxy_ip4 != 0 && ip4 == p->proxy_ip4 &&
		       port == p->proxy_port;
	return (bpf_ntohl(ip4) >> 24) == 127;
}

static __always_inline int ip6_allowed(struct trial_policy *p, __u32 ip6[4], __u16 port)
{
	/* ::ffff:a.b.c.d is IPv4 on the wire: judge it as IPv4. */
	if (ip6[0] == 0 && ip6[1] == 0 && ip6[2] == bpf_htonl(0x0000ffff))
		return ip4_allowed(p, ip6[3], port);

	int loopback = ip6[0] == 0 && ip6[1] == 0 && ip6[2] == 0 && ip6[3] == bpf_htonl(1);
	if (!(p->flags & TRIAL_F_STRICT))
		return loopback;
	return loopback && p->proxy_port != 0 && port == p->proxy_port &&
	       p->proxy_ip6[0] == ip6[0] && p->proxy_ip6[1] == ip6[1] &&
	       p->proxy_ip6[2] == ip6[2] && p->proxy_ip6[3] == ip6[3];
}

static __always_inline __u64 trial_cgroup(void)
{
	return bpf_get_current_ancestor_cgroup_id(trial_level);
}

SEC("cgroup/connect4")
int trialnet_connect4(struct bpf_sock_addr *ctx)
{
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	struct trial_policy *p = policy_in_netns(ctx, cgid, c);

	if (p && ip4_allowed(p, ctx->user_ip4, bpf_ntohs(ctx->user_port))) {
		COUNT(c, connect4_allowed);
		return SYS_PROCEED;
	}
	COUNT(c, connect4_denied);
	return SYS_REJECT;
}

SEC("cgroup/connect6")
int trialnet_connect6(struct bpf_sock_addr *ctx)
{
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	struct trial_policy *p = policy_in_netns(ctx, cgid, c);
	__u32 ip6[4] = {ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3]};

	if (p && ip6_allowed(p, ip6, bpf_ntohs(ctx->user_port))) {
		COUNT(c, connect6_allowed);
		return SYS_PROCEED;
	}
	COUNT(c, connect6_denied);
	return SYS_REJECT;
}

/* Unconnected UDP. The proxy speaks TCP, so strict mode allows no datagrams. */
SEC("cgroup/sendmsg4")
int trialnet_sendmsg4(struct bpf_sock_addr *ctx)
{
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	struct trial_policy *p = policy_in_netns(ctx, cgid, c);

	if (p && !(p->flags & TRIAL_F_STRICT) &&
	    ip4_allowed(p, ctx->user_ip4, bpf_ntohs(ctx->user_port))) {
		COUNT(c, sendmsg4_allowed);
		return SYS_PROCEED;
	}
	COUNT(c, sendmsg4_denied);
	return SYS_REJECT;
}

SEC("cgroup/sendmsg6")
int trialnet_sendmsg6(struct bpf_sock_addr *ctx)
{
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	struct trial_policy *p = policy_in_netns(ctx, cgid, c);
	__u32 ip6[4] = {ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3]};

	if (p && !(p->flags & TRIAL_F_STRICT) && ip6_allowed(p, ip6, bpf_ntohs(ctx->user_port))) {
		COUNT(c, sendmsg6_allowed);
		return SYS_PROCEED;
	}
	COUNT(c, sendmsg6_denied);
	return SYS_REJECT;
}

/* Binding is only refused outside the Trial's netns: inside it only lo exists. */
static __always_inline int bind_verdict(struct bpf_sock_addr *ctx)
{
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);

	if (policy_in_netns(ctx, cgid, c))
		return SYS_PROCEED;
	COUNT(c, bind_denied);
	return SYS_REJECT;
}

SEC("cgroup/bind4")
int trialnet_bind4(struct bpf_sock_addr *ctx)
{
	return bind_verdict(ctx);
}

SEC("cgroup/bind6")
int trialnet_bind6(struct bpf_sock_addr *ctx)
{
	return bind_verdict(ctx);
}

/* Raw and ping sockets reach the network without connect(): refuse them. */
SEC("cgroup/sock_create")
int trialnet_sock_create(struct bpf_sock *ctx)
{
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	struct trial_policy *p = policy_in_netns(ctx, cgid, c);
	int icmp = ctx->protocol == IPPROTO_ICMP || ctx->protocol == IPPROTO_ICMPV6;

	if (p && ctx->type != SOCK_RAW && !(ctx->type == SOCK_DGRAM && icmp)) {
		COUNT(c, sock_create_allowed);
		return SYS_PROCEED;
	}
	COUNT(c, sock_create_denied);
	return SYS_REJECT;
}

/*
 * The evidence and the last wall: every packet a Trial socket sends is
 * counted, and anything not leaving through loopback is dropped.
 */
SEC("cgroup_skb/egress")
int trialnet_egress(struct __sk_buff *skb)
{
	__u64 cgid = bpf_skb_ancestor_cgroup_id(skb, trial_level);
	struct trial_counters *c = counters_for(cgid);
	int has_policy = bpf_map_lookup_elem(&policy_map, &cgid) != 0;

	if (has_policy && skb->ifindex == LOOPBACK_IFINDEX) {
		if (c) {
			c->egress_loopback_packets += 1;
			c->egress_loopback_bytes += skb->len;
		}
		return SYS_PROCEED;
	}
	if (c) {
		c->egress_other_packets += 1;
		c->egress_other_bytes += skb->len;
	}
	return SYS_REJECT;
}

/* The kernel's context behind a unix bpf_sock_addr (Linux 6.7+), read with CO-RE. */
struct sockaddr;
struct bpf_sock_addr_kern {
	struct sockaddr *uaddr;
	__u32 uaddrlen;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/*
 * unix_verdict allows abstract sockets (scoped to the Trial's netns) and the
 * pathname sockets listed for the Trial; every other path is refused.
 */
static __always_inline int unix_verdict(struct bpf_sock_addr *ctx, struct trial_counters *c,
					__u64 cgid)
{
	struct trial_policy *p = policy_in_netns(ctx, cgid, c);
	if (!p)
		return SYS_REJECT;
	if (p->flags & TRIAL_F_UNIX_OPEN)
		return SYS_PROCEED;

	struct bpf_sock_addr_kern *sa = bpf_cast_to_kern_ctx(ctx);
	__u64 len = sa->uaddrlen;
	if (len <= 2)
		return SYS_REJECT; /* unnamed: nothing to allow */
	len -= 2;                  /* sun_family */
	if (len > UNIX_PATH_MAX)
		len = UNIX_PATH_MAX;
	/* Keep clang from folding the bound the verifier needs to see. */
	barrier_var(len);
	if (len > UNIX_PATH_MAX)
		return SYS_REJECT;

	struct unix_key key = {};
	key.cgroup_id = cgid;
	if (bpf_probe_read_kernel(key.path, len, (char *)sa->uaddr + 2))
		return SYS_REJECT;
	if (key.path[0] == 0)
		return SYS_PROCEED; /* abstract */

	/* Normalise: the kernel accepts a path with or without its NUL. */
	int end = 0;
	for (int i = 0; i < UNIX_PATH_MAX; i++) {
		if (i >= len || key.path[i] == 0)
			end = 1;
		if (end)
			key.path[i] = 0;
	}
	return bpf_map_lookup_elem(&unix_paths_map, &key) ? SYS_PROCEED : SYS_REJECT;
}

SEC("cgroup/connect_unix")
int trialnet_connect_unix(struct bpf_sock_addr *ctx)
{
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);

	if (unix_verdict(ctx, c, cgid) == SYS_PROCEED) {
		COUNT(c, unix_connect_allowed);
		return SYS_PROCEED;
	}
	COUNT(c, unix_connect_denied);
	return SYS_REJECT;
}

SEC("cgroup/sendmsg_unix")
int trialnet_sendmsg_unix(struct bpf_sock_addr *ctx)
{
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);

	if (unix_verdict(ctx, c, cgid) == SYS_PROCEED) {
		COUNT(c, unix_sendmsg_allowed);
		return SYS_PROCEED;
	}
	COUNT(c, unix_sendmsg_denied);
	return SYS_REJECT;
}

char __license[] SEC("license") = "Dual BSD/GPL";
