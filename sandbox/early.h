// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// early.c's one-exec launch, as launch_cgo.go calls it.

#ifndef TRIALNET_EARLY_H
#define TRIALNET_EARLY_H

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
	// The child's stack, where it has one (trialnet_launch sets it).
	void *stack;
};

// trialnet_launch clones a process into l->cgroup that runs trialnet-exec's
// steps and execs the command, and returns its pid, or -errno. The child
// may use l, what it points to and its stack until it has exec'd or
// exited: only then may the caller call trialnet_launch_done and free l.
long trialnet_launch(struct trialnet_launch *l);

// trialnet_launch_done frees what trialnet_launch allocated for l.
void trialnet_launch_done(struct trialnet_launch *l);

#endif
