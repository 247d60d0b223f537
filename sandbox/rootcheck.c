//go:build linux && cgo

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The chroot check (root.go's CheckRoot) done before the Go runtime starts.
//
// The check joins this process's own mount namespace and compares the
// root directory before and after. Joining a mount namespace needs a
// thread whose filesystem state no other thread shares: once the Go
// runtime runs, that is a thread made for it and discarded after
// (netns.RootIsNamespaceRoot): in a starting process on a paravirtualized
// guest, milliseconds of thread creation and exit. Here, from
// trialnet_early, the process has one thread: it joins, looks, and takes
// its root and working directory back.

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "early.h"

struct trialnet_early_root trialnet_early_root;

// root_of is the calling thread's root directory, as netns.rootOf asks.
static int root_of(struct statx *st) {
	return statx(AT_FDCWD, "/", 0, STATX_INO | STATX_MNT_ID, st) == 0 && (st->stx_mask & STATX_MNT_ID);
}

// fatal is for a root or working directory this process could not take
// back: it must not go on where a chroot would no longer hold it.
__attribute__((noreturn)) static void fatal(const char *what, int err) {
	static const char head[] = "trialnet: cannot take back this process's ";
	static const char mid[] = " after joining its own mount namespace (the check that it runs in no chroot): ";
	static const char tail[] = "; it stops rather than run outside its root. Allow it chroot(2) and fchdir(2) "
	                           "(CAP_SYS_CHROOT; a security module may refuse them), or run it outside any chroot\n";
	const char *why = strerror(err);
	(void)!write(2, head, sizeof head - 1);
	(void)!write(2, what, strlen(what));
	(void)!write(2, mid, sizeof mid - 1);
	(void)!write(2, why, strlen(why));
	(void)!write(2, tail, sizeof tail - 1);
	_exit(126);
}

void trialnet_check_root(void) {
	// Without the privileges the join fails; CheckRoot asks again and
	// says what is missing.
	if (geteuid() != 0)
		return;
	int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	long pidfd = syscall(SYS_pidfd_open, getpid(), 0); // a chroot may have no /proc
	struct statx own, ns;
	if (root >= 0 && cwd >= 0 && pidfd >= 0 && root_of(&own) && setns((int)pidfd, CLONE_NEWNS) == 0) {
		int seen = root_of(&ns);
		int same = seen && own.stx_mnt_id == ns.stx_mnt_id && own.stx_dev_major == ns.stx_dev_major &&
		           own.stx_dev_minor == ns.stx_dev_minor && own.stx_ino == ns.stx_ino;
		// setns set both to the namespace's root: this process's own back.
		// A root that was the namespace's is back already: no chroot(2),
		// which a sandbox of the caller's may refuse (systemd's ~@mount).
		if (!same && (fchdir(root) != 0 || chroot(".") != 0))
			fatal("root directory", errno);
		if (fchdir(cwd) != 0)
			fatal("working directory", errno);
		if (seen) {
			trialnet_early_root.mnt = own.stx_mnt_id;
			trialnet_early_root.dev_major = own.stx_dev_major;
			trialnet_early_root.dev_minor = own.stx_dev_minor;
			trialnet_early_root.ino = own.stx_ino;
			trialnet_early_root.same = same;
			trialnet_early_root.checked = 1;
		}
	}
	if (pidfd >= 0)
		close((int)pidfd);
	if (cwd >= 0)
		close(cwd);
	if (root >= 0)
		close(root);
}
