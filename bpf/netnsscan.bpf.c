//go:build ignore
// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

/*
 * The adoption scan: a task iterator that writes the tgid of every task
 * (every thread: a thread may setns alone) whose network namespace is
 * the one in netns_target, by its nsfs inode number. nsfs is one
 * filesystem, whose inode numbers name each live namespace once; the
 * agent holds the target open for the scan, so its number is not
 * reused meanwhile. A task being exited has no nsproxy, and no files
 * left (do_exit closes them before it drops its namespaces): skipped,
 * as the /proc walk skips exited tasks.
 */

#include <linux/bpf.h>
#include "include/bpf_helpers.h"
#include "include/bpf_core_read.h"

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));

struct nsproxy {
	struct net *net_ns;
} __attribute__((preserve_access_index));

struct task_struct {
	int tgid;
	struct nsproxy *nsproxy;
} __attribute__((preserve_access_index));

struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__task {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
} __attribute__((preserve_access_index));

/* The inode number of the namespace scanned for: set before each read,
 * under the agent's lock (one scan at a time). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} netns_target SEC(".maps");

SEC("iter/task")
int netns_tasks(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	__u32 zero = 0;
	__u32 *want;

	if (!task)
		return 0;
	want = bpf_map_lookup_elem(&netns_target, &zero);
	if (!want || !*want)
		return 0;
	struct nsproxy *nsp = BPF_CORE_READ(task, nsproxy);
	if (!nsp || BPF_CORE_READ(nsp, net_ns, ns.inum) != *want)
		return 0;
	__u32 tgid = BPF_CORE_READ(task, tgid);
	bpf_seq_write(ctx->meta->seq, &tgid, sizeof(tgid));
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
