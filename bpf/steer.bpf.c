//go:build ignore
// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

/*
 * Transparent connections: an sk_lookup program, attached to one Trial's
 * network namespace, that hands every TCP connection to an address of the
 * Trial's name pool, on any port, to the one listening socket in
 * steer_map (the agent's). The connection keeps its destination: the
 * accepted socket's local address is the pool address and port the Trial
 * dialled, which is how the agent maps it back to name:port. Nothing is
 * rewritten.
 *
 * It runs for packets arriving in the namespace, before the kernel's own
 * listener lookup, so a Trial's own socket bound to a pool address never
 * sees them; with no socket in steer_map, a pool address is refused, never
 * left to fall through to one.
 */

#include <linux/bpf.h>
#include <linux/in.h>
#include "include/bpf_helpers.h"
#include "include/bpf_endian.h"

#define AF_INET 2

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} steer_map SEC(".maps");

/* The pool, set by the loader: network byte order, pool_net & ~pool_mask == 0. */
volatile const __u32 pool_net = 0;
volatile const __u32 pool_mask = 0;

SEC("sk_lookup")
int trialnet_steer(struct bpf_sk_lookup *ctx)
{
	if (ctx->family != AF_INET || ctx->protocol != IPPROTO_TCP ||
	    (ctx->local_ip4 & pool_mask) != pool_net)
		return SK_PASS; /* not ours: the kernel's own lookup decides */

	__u32 key = 0;
	struct bpf_sock *sk = bpf_map_lookup_elem(&steer_map, &key);
	if (!sk)
		return SK_DROP; /* no listener: refused (RST), not left to the Trial's sockets */
	long err = bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	return err ? SK_DROP : SK_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
