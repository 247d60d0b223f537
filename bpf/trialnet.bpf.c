//go:build ignore
// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

/*
 * trialnet's kernel layer. Every cgroup program is attached once to the
 * parent cgroup (<cgroup2>/trialnet) and inherited by each Trial cgroup below
 * it. A Trial is identified by its cgroup at depth trial_level (the parent's
 * depth + 1), so a process that somehow sits deeper is still attributed to
 * its Trial. No policy entry, or a socket in another network namespace than
 * the one recorded for the Trial, means everything is refused.
 *
 * The cgroup hooks judge a socket by the cgroup that created it. The BPF LSM
 * programs at the end of this file judge the *task* instead, so a socket a
 * Trial task got from outside (inherited, or stolen with pidfd_getfd or
 * ptrace) is judged by the Trial that uses it.
 */

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/socket.h>
#include "include/bpf_helpers.h"
#include "include/bpf_endian.h"
#include "include/bpf_tracing.h"
#include "include/bpf_core_read.h"

/* Verdicts, named as cilium's bpf_sock.c names them. */
#define SYS_REJECT  0
#define SYS_PROCEED 1

#define AF_UNIX  1
#define AF_INET  2
#define AF_INET6 10
#define AF_NETLINK 16

#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define SOCK_RAW   3

#define LOOPBACK_IFINDEX 1
#define UNIX_PATH_MAX    108

/* Policy flags. */
enum trial_flag {
	TRIAL_F_STRICT = 1 << 0,    /* only the proxy address:port, not all loopback */
	TRIAL_F_UNIX_OPEN = 1 << 1, /* the Trial opted out of unix socket confinement */
	TRIAL_F_OWN_DIRS = 1 << 2,  /* /tmp, /var/tmp, /dev/shm are the Trial's, viewed under /run/trialnet */
	TRIAL_F_PEER_CHECK = 1 << 3, /* the LSM layer judges unix peers (unix_peer_verdict) */
	TRIAL_F_NESTED = 1 << 4,     /* user namespaces allowed: its own nested netns are its */
	TRIAL_F_TRANSPARENT = 1 << 5, /* a DNS stub and a name pool: strict mode allows them too */
};

struct trial_policy {
	__u64 netns_cookie; /* SO_NETNS_COOKIE of the Trial's own namespace */
	enum trial_flag flags; /* 4 bytes, as the __u32 it was */
	__u32 proxy_ip4;    /* network byte order; 0 = no IPv4 proxy address */
	__u32 proxy_ip6[4]; /* network byte order; all zero = no IPv6 proxy address */
	__u16 proxy_port;   /* host byte order; 0 = no proxy */
	/*
	 * TRIAL_F_TRANSPARENT's name pool, in what were two pads (older
	 * trialnets' entries hold zeros there, and lack the flag).
	 */
	__u16 pool_bits;    /* prefix length, 8-32 */
	__u32 pool_ip4;     /* network byte order, masked */
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
	/* BPF LSM layer: judged by the task's Trial, not the socket's cgroup. */
	__u64 foreign_socket_denied; /* connect/send on a socket of another netns */
	__u64 ptrace_denied;         /* ptrace, pidfd_getfd, /proc/PID/mem... outside the Trial */
	__u64 sock_family_denied;    /* socket() of a family outside the allowlist */
	__u64 ioctl_denied;          /* TIOCSTI, TIOCLINUX */
	__u64 unix_identity_denied;  /* unix peer not the Trial's nor an allowed inode; or a host task reaching in */
	/* pty_denied is struct trial_ptys's: this layout is older trialnets' too,
	 * so that an upgrade adopts their live Trials' pinned counters. */
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
	/* Entries are made by userspace only (AddTrial), so a failed
	 * allocation is an error there; preallocating every entry on every
	 * CPU took 22 ms of the first install on 2 CPUs, and grows with them. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} counters_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct unix_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} unix_paths_map SEC(".maps");

/*
 * An allowed pathname unix socket by identity: the inode the loader found at
 * the path when the Trial was added. dev is the kernel's s_dev encoding
 * (major << 20 | minor), not userspace's st_dev.
 */
struct unix_id_key {
	__u64 cgroup_id;
	__u64 ino;
	__u32 dev;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct unix_id_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} unix_ids_map SEC(".maps");

/*
 * The pty masters a Trial's tasks hold open, whatever devpts instance they
 * came from (its own, or one a nested sandbox mounted: bwrap --dev), and
 * its bound. The loader makes the entry; the LSM programs count in it.
 */
struct trial_ptys {
	__u64 open;
	__u64 max;
	__u64 denied; /* masters refused past max (or with pty_files_map full): pty_denied */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct trial_ptys);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* entries made by userspace only */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ptys_map SEC(".maps");

/*
 * Each counted pty master (its struct file) and the Trial it counts for,
 * so that it is given back when the file is freed, by whichever task last
 * held it. Full, it refuses the next master (counted as denied): the
 * host's pty pool (kernel.pty.max, 4,096 by default) runs out long before.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);   /* the struct file's address */
	__type(value, __u64); /* the Trial's cgroup id */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pty_files_map SEC(".maps");

/* Depth of a Trial cgroup in the cgroup2 hierarchy, set by the loader. */
volatile const __u32 trial_level = 2;

/*
 * The parent cgroup this object was loaded for, set by the loader. LSM
 * programs run for every task on the host; they only judge tasks below it,
 * so that several loaders (each with its own parent and maps) coexist.
 */
volatile const __u64 parent_cgroup_id = 0;


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
 * Trial's own namespace, and NULL (counting why) otherwise. A nested
 * Trial's task may also be in a network namespace it made (it cannot join
 * any other: setns is refused, and the netns files are hidden): there the
 * same policy holds, over a namespace with nothing but its own loopback.
 */
static __always_inline struct trial_policy *policy_in_netns(void *ctx, __u64 cgid,
							   struct trial_counters *c)
{
	struct trial_policy *p = bpf_map_lookup_elem(&policy_map, &cgid);
	if (!p) {
		COUNT(c, no_policy);
		return 0;
	}
	if (bpf_get_netns_cookie(ctx) != p->netns_cookie && !(p->flags & TRIAL_F_NESTED)) {
		COUNT(c, netns_mismatch);
		return 0;
	}
	return p;
}

/* The Trial's DNS stub in transparent mode, as systemd-resolved's stub: 127.0.0.53:53. */
#define STUB_IP4  0x7f000035 /* host byte order */
#define STUB_PORT 53

/* What a destination is asked for: a verdict may differ by socket and call. */
enum dest_use {
	USE_CONNECT,        /* connect() of a socket that is not TCP (UDP) */
	USE_CONNECT_STREAM, /* connect() of a TCP (or MPTCP) socket */
	USE_SEND,           /* sendmsg() to an address: unconnected UDP */
};

static __always_inline enum dest_use connect_use(struct bpf_sock_addr *ctx)
{
	if (ctx->type == SOCK_STREAM &&
	    (ctx->protocol == IPPROTO_TCP || ctx->protocol == IPPROTO_MPTCP))
		return USE_CONNECT_STREAM;
	return USE_CONNECT;
}

/*
 * transparent_allowed is what transparent mode adds to strict mode: the
 * stub, by UDP and TCP, and TCP to any port of the pool (steered to the
 * agent, which judges name:port). Nothing else.
 */
static __always_inline int transparent_allowed(struct trial_policy *p, __u32 ip4, __u16 port,
					       enum dest_use use)
{
	if (!(p->flags & TRIAL_F_TRANSPARENT))
		return 0;
	if (bpf_ntohl(ip4) == STUB_IP4 && port == STUB_PORT)
		return 1;
	if (use != USE_CONNECT_STREAM || p->pool_bits < 8 || p->pool_bits > 32)
		return 0;
	__u32 mask = bpf_htonl(0xffffffffU << (32 - p->pool_bits));
	return (ip4 & mask) == p->pool_ip4;
}

static __always_inline int ip4_allowed(struct trial_policy *p, __u32 ip4, __u16 port,
				       enum dest_use use)
{
	if (!(p->flags & TRIAL_F_STRICT))
		return (bpf_ntohl(ip4) >> 24) == 127;
	if (transparent_allowed(p, ip4, port, use))
		return 1;
	/* The proxy speaks TCP: strict mode sends it no datagrams. */
	return use != USE_SEND && p->proxy_port != 0 && p->proxy_ip4 != 0 &&
	       ip4 == p->proxy_ip4 && port == p->proxy_port;
}

static __always_inline int ip6_allowed(struct trial_policy *p, __u32 ip6[4], __u16 port,
				       enum dest_use use)
{
	/* ::ffff:a.b.c.d is IPv4 on the wire: judge it as IPv4. */
	if (ip6[0] == 0 && ip6[1] == 0 && ip6[2] == bpf_htonl(0x0000ffff))
		return ip4_allowed(p, ip6[3], port, use);

	int loopback = ip6[0] == 0 && ip6[1] == 0 && ip6[2] == 0 && ip6[3] == bpf_htonl(1);
	if (!(p->flags & TRIAL_F_STRICT))
		return loopback;
	return use != USE_SEND && loopback && p->proxy_port != 0 && port == p->proxy_port &&
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

	if (p && ip4_allowed(p, ctx->user_ip4, bpf_ntohs(ctx->user_port), connect_use(ctx))) {
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

	if (p && ip6_allowed(p, ip6, bpf_ntohs(ctx->user_port), connect_use(ctx))) {
		COUNT(c, connect6_allowed);
		return SYS_PROCEED;
	}
	COUNT(c, connect6_denied);
	return SYS_REJECT;
}

/* Unconnected UDP: strict mode allows none but the DNS stub's (transparent). */
SEC("cgroup/sendmsg4")
int trialnet_sendmsg4(struct bpf_sock_addr *ctx)
{
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	struct trial_policy *p = policy_in_netns(ctx, cgid, c);

	if (p && ip4_allowed(p, ctx->user_ip4, bpf_ntohs(ctx->user_port), USE_SEND)) {
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

	if (p && ip6_allowed(p, ip6, bpf_ntohs(ctx->user_port), USE_SEND)) {
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
 * The Trial's own directories. Each is a tmpfs of the Trial's mount
 * namespace that no host process sees, and the only places a confined
 * Trial may make sockets (Landlock). A path beneath one is reached through
 * a view of the same tmpfs mounted nosymfollow under /run/trialnet (read
 * only, root's): a symlink the Trial made there ends the lookup (ELOOP)
 * instead of leading it to a host socket, and ".." is refused, as it
 * would climb out of the view. A hard link cannot cross into a tmpfs, and
 * without user namespaces the Trial cannot mount over the views.
 */
#define OWN_DIRS 3
#define VIEW_LEN 15 /* "/run/trialnet/t" */
struct own_dir {
	char dir[10]; /* with its trailing slash */
	__u32 len;    /* of dir, without the NUL */
	char view[VIEW_LEN + 1];
};

static const struct own_dir own_dirs[OWN_DIRS] = {
	{"/tmp/", 5, "/run/trialnet/t"},
	{"/var/tmp/", 9, "/run/trialnet/v"},
	{"/dev/shm/", 9, "/run/trialnet/d"},
};

/* A path as the hook read it, with room past its end for the scan. */
struct unix_path {
	char p[UNIX_PATH_MAX + 3];
	__u8 dotdot;
};

static long dotdot_step(__u32 i, void *data)
{
	struct unix_path *u = data;
	__u64 k = i; /* 64-bit, so that k + 2 keeps the bound below */
	if (k >= UNIX_PATH_MAX)
		return 1;
	char c = u->p[k];
	if (c == 0)
		return 1;
	if (c == '.' && u->p[k + 1] == '.' && (k == 0 || u->p[k - 1] == '/') &&
	    (u->p[k + 2] == '/' || u->p[k + 2] == 0)) {
		u->dotdot = 1;
		return 1;
	}
	return 0;
}

extern int bpf_sock_addr_set_sun_path(struct bpf_sock_addr_kern *sa_kern, const __u8 *sun_path,
				      __u32 sun_path__sz) __ksym;

/*
 * own_dir_verdict lets a connect or send to a path beneath one of the
 * Trial's own directories proceed by way of its view (pathlen: the
 * path's length without its NUL).
 */
static __always_inline int own_dir_verdict(struct bpf_sock_addr_kern *sa, struct unix_path *u,
					   __u64 pathlen)
{
	int i;
#pragma unroll
	for (i = 0; i < OWN_DIRS; i++) {
		const struct own_dir *d = &own_dirs[i];
		int match = 1, j;
#pragma unroll
		for (j = 0; j < (int)sizeof(d->dir) - 1; j++) {
			if (j < d->len && u->p[j] != d->dir[j])
				match = 0;
		}
		if (!match)
			continue;
		u->dotdot = 0;
		bpf_loop(UNIX_PATH_MAX, dotdot_step, u, 0);
		if (u->dotdot)
			return SYS_REJECT;
		/* view + the path from dir's slash on, and its NUL */
		__u64 size = VIEW_LEN + (pathlen - (d->len - 1)) + 1;
		if (pathlen < d->len || size > UNIX_PATH_MAX)
			return SYS_REJECT;
		char out[UNIX_PATH_MAX] = {};
		__builtin_memcpy(out, d->view, VIEW_LEN);
		if (bpf_probe_read_kernel_str(out + VIEW_LEN, UNIX_PATH_MAX - VIEW_LEN,
					      u->p + d->len - 1) <= 0)
			return SYS_REJECT;
		barrier_var(size);
		if (size > UNIX_PATH_MAX || size == 0)
			return SYS_REJECT;
		return bpf_sock_addr_set_sun_path(sa, (const __u8 *)out, size) ? SYS_REJECT : SYS_PROCEED;
	}
	return SYS_REJECT;
}

/*
 * unix_verdict allows abstract sockets (scoped to the Trial's netns), the
 * pathname sockets listed for the Trial, and paths beneath the Trial's own
 * directories (own_dir_verdict); every other path is refused, unless the
 * LSM layer judges the peer.
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
	/*
	 * Read with the helper, not as sa->uaddr: the verifier checks each
	 * load through a BTF pointer with a linear search of the kernel's BTF
	 * by name (btf_nested_type_is_trusted), 2-3 ms on the machines
	 * measured, on every path that passes the load. Two such loads made
	 * each unix program take 14-15 ms to load.
	 */
	char *uaddr = 0;
	__u32 uaddrlen = 0;
	if (bpf_probe_read_kernel(&uaddr, sizeof(uaddr), &sa->uaddr) ||
	    bpf_probe_read_kernel(&uaddrlen, sizeof(uaddrlen), &sa->uaddrlen))
		return SYS_REJECT;
	__u64 len = uaddrlen;
	char *path = uaddr + 2; /* after sun_family */
	if (len <= 2)
		return SYS_REJECT; /* unnamed: nothing to allow */
	len -= 2;                  /* sun_family */
	if (len > UNIX_PATH_MAX)
		len = UNIX_PATH_MAX;
	/* Keep clang from folding the bound the verifier needs to see. */
	barrier_var(len);
	if (len > UNIX_PATH_MAX)
		return SYS_REJECT;

	/*
	 * Copy the path up to its first NUL or its length, whichever comes
	 * first: the kernel accepts a path with or without its NUL, and the
	 * zeroed buffer pads both the same way. The string copy is one helper
	 * call; a byte loop over UNIX_PATH_MAX cost the verifier ~150 ms.
	 */
	struct unix_path u = {};
	__u64 size = len + 1; /* room for the NUL the helper always writes */
	if (size > UNIX_PATH_MAX)
		size = UNIX_PATH_MAX;
	long n = bpf_probe_read_kernel_str(u.p, size, path);
	if (n <= 0)
		return SYS_REJECT;
	if (u.p[0] == 0)
		return SYS_PROCEED; /* abstract */
	/*
	 * A full buffer holds 107 bytes: a 108-byte path without a NUL would
	 * be cut to a shorter one, so it is refused (the loader never allows
	 * a path that long, and no view of one fits).
	 */
	if (n == UNIX_PATH_MAX && len == UNIX_PATH_MAX) {
		char last = 0;
		if (bpf_probe_read_kernel(&last, 1, path + UNIX_PATH_MAX - 1) || last != 0)
			return SYS_REJECT;
	}
	struct unix_key key = {};
	key.cgroup_id = cgid;
	__builtin_memcpy(key.path, u.p, sizeof(key.path));
	if (bpf_map_lookup_elem(&unix_paths_map, &key))
		return SYS_PROCEED;
	/*
	 * The LSM layer sees the socket a path leads to: a symlink or ".." to a
	 * host socket is refused there, and counted, where a view would end in
	 * an uncounted ELOOP.
	 */
	if (p->flags & TRIAL_F_PEER_CHECK)
		return SYS_PROCEED;
	if (!(p->flags & TRIAL_F_OWN_DIRS))
		return SYS_REJECT;
	return own_dir_verdict(sa, &u, (__u64)(n - 1));
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

/*
 * The BPF LSM layer. LSM verdicts: 0 allows, a negative errno refuses. Each
 * program first passes on an earlier BPF LSM program's refusal (the hook's
 * last argument).
 */
#define LSM_ALLOW     0
#define EPERM         1
#define EEXIST        17
#define ENOSPC        28
#define EAFNOSUPPORT  97
#define MAX_ERRNO     4095

/*
 * lsm_prior is the earlier verdict, sign-extended and clamped: the verifier
 * (6.11+) must see every return inside [-MAX_ERRNO, 0], and a context
 * argument returned as is has no known range.
 */
static __always_inline long lsm_prior(int ret)
{
	long r = ret;
	if (r < -MAX_ERRNO || r > 0)
		return -EPERM;
	return r;
}

#define TIOCSTI   0x5412
#define TIOCLINUX 0x541C

/* The kernel types the LSM programs read, relocated with CO-RE. */
struct net {
	__u64 net_cookie;
} __attribute__((preserve_access_index));

struct sock_common {
	unsigned short skc_family;
	struct {
		struct net *net;
	} skc_net; /* possible_net_t */
} __attribute__((preserve_access_index));

struct sock_cgroup_data {
	struct cgroup *cgroup; /* the cgroup v2 of the task that made the socket */
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	struct sock_cgroup_data sk_cgrp_data;
} __attribute__((preserve_access_index));

struct socket {
	struct sock *sk;
} __attribute__((preserve_access_index));

struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode {
	unsigned short i_mode; /* umode_t */
	__u32 i_rdev;          /* dev_t */
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct dentry {
	struct inode *d_inode;
} __attribute__((preserve_access_index));

struct path {
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct unix_sock {
	struct path path;
} __attribute__((preserve_access_index));

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup {
	int level;
	struct kernfs_node *kn;
	struct cgroup *ancestors[];
} __attribute__((preserve_access_index));

struct css_set {
	struct cgroup *dfl_cgrp;
} __attribute__((preserve_access_index));

struct task_struct {
	struct css_set *cgroups;
} __attribute__((preserve_access_index));

struct msghdr;

/* in_scope: the current task is below this loader's parent cgroup. */
static __always_inline int in_scope(void)
{
	return parent_cgroup_id != 0 &&
	       bpf_get_current_ancestor_cgroup_id(trial_level - 1) == parent_cgroup_id;
}

/* lsm_policy is the Trial's policy; none means refuse (counted). */
static __always_inline struct trial_policy *lsm_policy(__u64 cgid, struct trial_counters *c)
{
	struct trial_policy *p = bpf_map_lookup_elem(&policy_map, &cgid);
	if (!p)
		COUNT(c, no_policy);
	return p;
}

static __always_inline __u64 sock_netns_cookie(struct sock *sk)
{
	return BPF_CORE_READ(sk, __sk_common.skc_net.net, net_cookie);
}

/* cgroup_ancestor is the id of cg's ancestor at level, 0 if cg sits higher. */
static __always_inline __u64 cgroup_ancestor(struct cgroup *cg, __u32 level)
{
	if (!cg || BPF_CORE_READ(cg, level) < (int)level)
		return 0;
	struct cgroup *anc = 0;
	void *slot = (void *)cg + bpf_core_field_offset(struct cgroup, ancestors) +
		     (__u64)level * sizeof(anc);
	if (bpf_probe_read_kernel(&anc, sizeof(anc), slot) || !anc)
		return 0;
	return BPF_CORE_READ(anc, kn, id);
}

/* task_trial is the id of t's cgroup at trial_level, 0 if t sits higher. */
static __always_inline __u64 task_trial(struct task_struct *t)
{
	return cgroup_ancestor(BPF_CORE_READ(t, cgroups, dfl_cgrp), trial_level);
}

/*
 * sock_trial is the Trial whose task made sk (the id of its cgroup at
 * trial_level), 0 if none below this loader's parent did. An accepted
 * socket keeps its listener's.
 */
static __always_inline __u64 sock_trial(struct sock *sk)
{
	struct cgroup *cg = BPF_CORE_READ(sk, sk_cgrp_data.cgroup);
	if (parent_cgroup_id == 0 || trial_level == 0 ||
	    cgroup_ancestor(cg, trial_level - 1) != parent_cgroup_id)
		return 0;
	return cgroup_ancestor(cg, trial_level);
}

/*
 * foreign_socket_verdict refuses connect and send on a socket neither made
 * by the Trial nor living in its network namespace: one made outside and
 * handed in or stolen. (A nested Trial's sockets in network namespaces of
 * its own are its own; the cgroup hooks refuse them any address.) AF_UNIX is exempt: a Trial's stdio may legitimately be a unix
 * socket the operator handed in, and writes to it come through
 * socket_sendmsg. Unix peers are judged by identity instead
 * (unix_peer_verdict). Netlink is not exempt: a netlink socket opened by
 * root outside carries its opener's privileges.
 */
static __always_inline int foreign_socket_verdict(struct socket *sock)
{
	if (!in_scope())
		return LSM_ALLOW;
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	struct trial_policy *p = lsm_policy(cgid, c);
	if (!p)
		return -EPERM;
	struct sock *sk = BPF_CORE_READ(sock, sk);
	if (BPF_CORE_READ(sk, __sk_common.skc_family) == AF_UNIX)
		return LSM_ALLOW;
	if (sock_netns_cookie(sk) == p->netns_cookie || sock_trial(sk) == cgid)
		return LSM_ALLOW;
	COUNT(c, foreign_socket_denied);
	return -EPERM;
}

SEC("lsm/socket_connect")
int BPF_PROG(trialnet_lsm_socket_connect, struct socket *sock, struct sockaddr *address,
	     int addrlen, int ret)
{
	long prior = lsm_prior(ret);
	if (prior)
		return prior;
	return foreign_socket_verdict(sock);
}

SEC("lsm/socket_sendmsg")
int BPF_PROG(trialnet_lsm_socket_sendmsg, struct socket *sock, struct msghdr *msg, int size,
	     int ret)
{
	long prior = lsm_prior(ret);
	if (prior)
		return prior;
	return foreign_socket_verdict(sock);
}

/*
 * Every way to reach into another process (ptrace, pidfd_getfd,
 * /proc/PID/mem and the other ptrace-guarded /proc files, process_vm_*)
 * asks ptrace_access_check: a Trial task may reach its own Trial only.
 */
SEC("lsm/ptrace_access_check")
int BPF_PROG(trialnet_lsm_ptrace_access_check, struct task_struct *child, unsigned int mode,
	     int ret)
{
	long prior = lsm_prior(ret);
	if (prior)
		return prior;
	if (!in_scope())
		return LSM_ALLOW;
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	if (!lsm_policy(cgid, c))
		return -EPERM;
	if (task_trial(child) == cgid)
		return LSM_ALLOW;
	COUNT(c, ptrace_denied);
	return -EPERM;
}

/*
 * An allowlist of socket families, so that families added to the kernel
 * later are refused too. Sockets the kernel makes for itself pass.
 */
SEC("lsm/socket_create")
int BPF_PROG(trialnet_lsm_socket_create, int family, int type, int protocol, int kern, int ret)
{
	long prior = lsm_prior(ret);
	if (prior)
		return prior;
	if (kern || !in_scope())
		return LSM_ALLOW;
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	if (!lsm_policy(cgid, c))
		return -EPERM;
	if (family == AF_UNIX || family == AF_INET || family == AF_INET6 || family == AF_NETLINK)
		return LSM_ALLOW;
	COUNT(c, sock_family_denied);
	return -EAFNOSUPPORT;
}

/* Pushing input into a terminal another process reads is a way out. */
static __always_inline int ioctl_verdict(unsigned int cmd)
{
	if (cmd != TIOCSTI && cmd != TIOCLINUX)
		return LSM_ALLOW;
	if (!in_scope())
		return LSM_ALLOW;
	struct trial_counters *c = counters_for(trial_cgroup());
	COUNT(c, ioctl_denied);
	return -EPERM;
}

SEC("lsm/file_ioctl")
int BPF_PROG(trialnet_lsm_file_ioctl, struct file *file, unsigned int cmd, unsigned long arg,
	     int ret)
{
	long prior = lsm_prior(ret);
	if (prior)
		return prior;
	return ioctl_verdict(cmd);
}

/* 32-bit ioctls (Linux 6.8+; the loader drops this program where absent). */
SEC("lsm/file_ioctl_compat")
int BPF_PROG(trialnet_lsm_file_ioctl_compat, struct file *file, unsigned int cmd,
	     unsigned long arg, int ret)
{
	long prior = lsm_prior(ret);
	if (prior)
		return prior;
	return ioctl_verdict(cmd);
}

/*
 * A pty master is an open of the ptmx character device (5, 2) by any path:
 * /dev/ptmx, the ptmx of any devpts instance, a bind mount of either, or a
 * reopen through /proc/PID/fd. Each takes a pty from the host's pool
 * (kernel.pty.max), which a devpts instance's max= bounds only for that
 * instance, and a nested Trial can mount instances of its own. So the
 * masters a Trial's tasks open are counted here, by the open file, up to
 * the Trial's bound. An O_PATH open allocates nothing and never reaches
 * this hook; a master opened outside every Trial (trialnet's own relay
 * among them) is not the Trial's, and its own devpts max= bounds those.
 */
#define S_IFMT    0170000
#define S_IFCHR   0020000
#define PTMX_RDEV ((5U << 20) | 2) /* the kernel's dev_t: major << 20 | minor */

static __always_inline int is_ptmx(struct file *file)
{
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	if (!inode)
		return 0;
	return (BPF_CORE_READ(inode, i_mode) & S_IFMT) == S_IFCHR &&
	       BPF_CORE_READ(inode, i_rdev) == PTMX_RDEV;
}

/*
 * pty_verdict counts a Trial task's new pty master, or refuses it past the
 * bound. The add comes before the check, so that of two racing opens at
 * the bound the later add sees the earlier and backs out: the bound is
 * never passed (near it, a racing open may be refused needlessly). The
 * file's entry is made without replacing one: while a new program and the
 * one it replaces are both attached (an upgrade), the second finds the
 * first's entry and counts nothing again.
 */
static __always_inline int pty_verdict(struct file *file)
{
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	struct trial_ptys *n = bpf_map_lookup_elem(&ptys_map, &cgid);
	if (!n) {
		COUNT(c, no_policy);
		return -EPERM;
	}
	__sync_fetch_and_add(&n->open, 1);
	if (*(volatile __u64 *)&n->open <= n->max) {
		__u64 key = (__u64)file;
		long err = bpf_map_update_elem(&pty_files_map, &key, &cgid, BPF_NOEXIST);
		if (!err)
			return LSM_ALLOW;
		__sync_fetch_and_add(&n->open, -1);
		if (err == -EEXIST)
			return LSM_ALLOW;
	} else {
		__sync_fetch_and_add(&n->open, -1);
	}
	__sync_fetch_and_add(&n->denied, 1);
	return -ENOSPC;
}

SEC("lsm/file_open")
int BPF_PROG(trialnet_lsm_file_open, struct file *file, int ret)
{
	long prior = lsm_prior(ret);
	if (prior)
		return prior;
	if (!in_scope() || !is_ptmx(file))
		return LSM_ALLOW;
	return pty_verdict(file);
}

/*
 * A counted master is given back when its file is freed: closed by its
 * last holder, in or out of the Trial, or an open that failed after
 * file_open allowed it. Only the program whose delete succeeds gives it
 * back (two may run during an upgrade).
 */
SEC("lsm/file_free_security")
int BPF_PROG(trialnet_lsm_file_free_security, struct file *file)
{
	__u64 key = (__u64)file;
	__u64 *owner = bpf_map_lookup_elem(&pty_files_map, &key);
	if (!owner)
		return 0;
	__u64 cgid = *owner;
	if (bpf_map_delete_elem(&pty_files_map, &key))
		return 0;
	struct trial_ptys *n = bpf_map_lookup_elem(&ptys_map, &cgid);
	if (n)
		__sync_fetch_and_add(&n->open, -1);
	return 0;
}

/*
 * outside_verdict judges a task outside every Trial reaching a unix socket:
 * refused if a Trial that confines unix sockets made it (counted there).
 */
static __always_inline int outside_verdict(struct sock *other)
{
	__u64 owner = sock_trial(other);
	if (!owner)
		return LSM_ALLOW;
	struct trial_policy *p = bpf_map_lookup_elem(&policy_map, &owner);
	if (p && (p->flags & TRIAL_F_UNIX_OPEN))
		return LSM_ALLOW;
	struct trial_counters *c = counters_for(owner);
	COUNT(c, unix_identity_denied);
	return -EPERM;
}

/*
 * unix_peer_verdict allows a Trial task a unix peer the Trial made (in any
 * network namespace: a nested sandbox's too), one in its own network
 * namespace (socketpairs among them), or one bound to an inode the loader
 * recorded for the Trial. Whatever path led there: a symlink, "..", a bind
 * mount from a nested mount namespace over an allowed path or the Trial's
 * own /tmp, all end at the peer. And no task outside a Trial reaches a
 * socket a Trial made: no host client is served by a Trial, at any path.
 */
static __always_inline int unix_peer_verdict(struct sock *other)
{
	if (!in_scope())
		return outside_verdict(other);
	__u64 cgid = trial_cgroup();
	struct trial_counters *c = counters_for(cgid);
	struct trial_policy *p = lsm_policy(cgid, c);
	if (!p)
		return -EPERM;
	if (p->flags & TRIAL_F_UNIX_OPEN)
		return LSM_ALLOW;
	if (sock_trial(other) == cgid || sock_netns_cookie(other) == p->netns_cookie)
		return LSM_ALLOW;

	struct inode *inode = BPF_CORE_READ((struct unix_sock *)other, path.dentry, d_inode);
	if (inode) {
		struct unix_id_key key = {};
		key.cgroup_id = cgid;
		key.ino = BPF_CORE_READ(inode, i_ino);
		key.dev = BPF_CORE_READ(inode, i_sb, s_dev);
		if (bpf_map_lookup_elem(&unix_ids_map, &key))
			return LSM_ALLOW;
	}
	COUNT(c, unix_identity_denied);
	return -EPERM;
}

SEC("lsm/unix_stream_connect")
int BPF_PROG(trialnet_lsm_unix_stream_connect, struct sock *sock, struct sock *other,
	     struct sock *newsk, int ret)
{
	long prior = lsm_prior(ret);
	if (prior)
		return prior;
	return unix_peer_verdict(other);
}

SEC("lsm/unix_may_send")
int BPF_PROG(trialnet_lsm_unix_may_send, struct socket *sock, struct socket *other, int ret)
{
	long prior = lsm_prior(ret);
	if (prior)
		return prior;
	return unix_peer_verdict(BPF_CORE_READ(other, sk));
}

/*
 * Route netlink writes. A nested Trial holds CAP_NET_ADMIN over network
 * namespaces it makes, which would put traffic control, routing, link
 * creation (and the modules a link kind loads) within its reach: a large
 * part of the kernel, and the usual way a user namespace becomes root.
 * A Trial task may send only requests that read (RTM_GET*), add an
 * address, and set an existing link's flags (bringing loopback up, as a
 * sandbox does): the rest is refused, whatever namespace the socket is in.
 */
#define NETLINK_ROUTE 0
#define RTM_NEWLINK   16
#define RTM_NEWADDR   20
#define NLM_F_CREATE  0x400
#define NL_MAX_MSGS   64
#define NL_BARE_LINK  32 /* nlmsghdr + ifinfomsg */

struct sk_buff {
	unsigned int len;
	unsigned char *data;
} __attribute__((preserve_access_index));

struct sock___proto {
	__u16 sk_protocol;
} __attribute__((preserve_access_index));

SEC("lsm/netlink_send")
int BPF_PROG(trialnet_lsm_netlink_send, struct sock *sk, struct sk_buff *skb, int ret)
{
	long prior = lsm_prior(ret);
	if (prior)
		return prior;
	if (!in_scope() || BPF_CORE_READ((struct sock___proto *)sk, sk_protocol) != NETLINK_ROUTE)
		return LSM_ALLOW;
	unsigned char *data = BPF_CORE_READ(skb, data);
	__u32 len = BPF_CORE_READ(skb, len), off = 0;
	/*
	 * A bounded loop, not bpf_loop: an LSM program's callbacks are held
	 * to its return range (6.11+), which a loop callback's 0 and 1 miss.
	 */
	for (int i = 0; i < NL_MAX_MSGS; i++) {
		struct {
			__u32 len;
			__u16 type;
			__u16 flags;
		} h = {};
		if (off >= len || len - off < 16)
			return LSM_ALLOW; /* the end, or too short to be a request */
		if (bpf_probe_read_kernel(&h, sizeof(h), data + off))
			return -EPERM;
		__u16 t = h.type;
		/*
		 * RTM_NEWLINK only bare (its ifinfomsg, no attributes), as a
		 * sandbox brings loopback up: no link kind (6.13+ loads its
		 * module before looking at NLM_F_CREATE), no namespace move.
		 */
		int ok = t < RTM_NEWLINK || (t & 3) == 2 || t == RTM_NEWADDR ||
			 (t == RTM_NEWLINK && !(h.flags & NLM_F_CREATE) && h.len == NL_BARE_LINK);
		if (!ok || h.len < 16)
			return -EPERM;
		off += (h.len + 3) & ~3U;
	}
	return off >= len ? LSM_ALLOW : -EPERM; /* more than NL_MAX_MSGS requests */
}

char __license[] SEC("license") = "Dual BSD/GPL";
