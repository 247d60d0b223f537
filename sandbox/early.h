// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// early.c's one-exec launch, as launch_cgo.go calls it.

#ifndef TRIALNET_EARLY_H
#define TRIALNET_EARLY_H

#include <stddef.h>

// A command's RLIMIT_MSGQUEUE, soft and hard: MsgQueueBytes in pools.go.
#define TRIALNET_MSGQUEUE_BYTES 204800
// A command's RLIMIT_CORE, soft and hard: CoreLimit in pools.go.
#define TRIALNET_CORE_LIMIT 1

// The Trial's init's bounds and files, as init_early.c mounts them
// (TestEarlyInitTables holds them to the Go side's): TmpBytes, ShmBytes,
// MaxPtys and trial.ResolvConf.
#define TRIALNET_TMP_BYTES (1LL << 30)
#define TRIALNET_SHM_BYTES (256LL << 20)
// SharedBytes: each of sharedDirs' covers.
#define TRIALNET_SHARED_BYTES (5LL << 20)
#define TRIALNET_MAX_PTYS 256
#define TRIALNET_RESOLV_CONF \
	"# trialnet: this Trial's own DNS stub (transparent mode), in this\n" \
	"# Trial's view only. It answers the names the Trial's allowlist admits\n" \
	"# with addresses its connections are checked at, and forwards nothing.\n" \
	"nameserver 127.0.0.53\n" \
	"options timeout:2 attempts:2\n"

// trialnet_init_setup is the Trial's init's set-up (init.go's runInit)
// for argv trialnet-init-setup MODE DNS HIDE... -- KEEP...: it execs the
// reaper, or reports why not on fd 3 and exits.
__attribute__((noreturn)) void trialnet_init_setup(int argc, char **argv);

// trialnet_init_reap is the Trial's init once set up (init.go's
// runReaper), argv trialnet-init.
__attribute__((noreturn)) void trialnet_init_reap(void);

// A Trial's own directory as init_early.c mounts it: where, the name of
// its view in /run/trialnet, and its tmpfs's size.
struct trialnet_own_dir {
	const char *dir, *view;
	long long size;
};

// trialnet_parse_last_cap reads /proc/sys/kernel/cap_last_cap's text, or
// returns -1 if it is not a capability's number (Go's Atoi refuses it).
int trialnet_parse_last_cap(const char *buf);

// trialnet_mount_covered finds the mount id in table (mountinfo's text)
// and says whether the table shows it covered (1): a mount on it, or on
// a mount below it, at its point or at a directory above that point, the
// mount below's point. *point (len bytes, escaped as the table prints
// it) is id's point; -1: id is not listed; 0: the table shows it on top.
int trialnet_mount_covered(const char *table, unsigned long long id, const char **point, size_t *len);

struct trialnet_launch {
	// trialnet-exec's arguments and environment, NULL-terminated.
	int argc;
	char **argv, **envp;
	// The working directory, or NULL.
	const char *dir;
	// The launcher's descriptors that become the child's 0-5: stdio, the
	// error pipe, the ready pipe and the seccomp filter.
	int fds[6];
	// Whether the child leads a session of its own, and whether its fd
	// ctty becomes its controlling terminal.
	int setsid, setctty, ctty;
	// The cgroup the child is cloned into, or -1: the launcher's.
	int cgroup;
	// The launcher's descriptor the child writes one byte to as it
	// starts, by which time the kernel has set pid to its pid.
	int started;
	int pid;
};

// trialnet_launch clones a process into l->cgroup that runs trialnet-exec's
// steps and execs the command, and returns its pid, or -errno. It returns
// once the child has exec'd or exited (the child may use l until then);
// the byte on l->started says it runs before that.
long trialnet_launch(struct trialnet_launch *l);

// What trialnet_check_root saw at the process's start: whether it could
// look (checked), the root directory it had (as netns.rootOf names one),
// and whether that was its mount namespace's root.
struct trialnet_early_root {
	int checked, same;
	unsigned long long mnt, dev_major, dev_minor, ino;
};
extern struct trialnet_early_root trialnet_early_root;

// trialnet_check_root fills trialnet_early_root. The process must have
// one thread: it joins its own mount namespace and then takes its root
// and working directory back.
void trialnet_check_root(void);

#endif
