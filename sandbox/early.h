// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// early.c's one-exec launch, as launch_cgo.go calls it.

#ifndef TRIALNET_EARLY_H
#define TRIALNET_EARLY_H

// A command's RLIMIT_MSGQUEUE, soft and hard: MsgQueueBytes in pools.go.
#define TRIALNET_MSGQUEUE_BYTES 204800

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

#endif
