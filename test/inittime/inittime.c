// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

// inittime times a Trial's init from clone to its ready byte, for two
// builds in turn (interleaved, so that the machine's load falls on both):
// the clone with the Trial's namespace flags (the copy of this mount
// namespace's table among them), the exec of the binary and its set-up
// (early.c's constructor, init_early.c), in the network namespace mounted
// at NSPATH. run.sh puts N other namespace mounts beside it.
//
//	inittime NSPATH ITERATIONS OLD-BINARY NEW-BINARY
//
// OLD-BINARY takes the init's arguments without the namespace's path (as
// before 2026-12-05's "mountinfo read taken out"), NEW-BINARY with it. The
// commands' filter on fd 4 allows everything: the filter's cost is not
// what this measures.

#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int netfd, filter, ready[2];
static char **init_argv;
static const char *bin;

static double now_ms(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int child(void *arg) {
	(void)arg;
	if (setns(netfd, CLONE_NEWNET) < 0)
		_exit(5);
	dup2(ready[1], 3);
	dup2(filter, 4);
	execv(bin, init_argv);
	_exit(6);
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
	if (argc != 5) {
		fprintf(stderr, "usage: %s NSPATH ITERATIONS OLD-BINARY NEW-BINARY\n", argv[0]);
		return 2;
	}
	char *ns = argv[1];
	int n = atoi(argv[2]);
	if ((netfd = open(ns, O_RDONLY | O_CLOEXEC)) < 0 || n < 1) {
		perror(ns);
		return 1;
	}
	struct sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
	filter = memfd_create("filter", 0);
	if (filter < 0 || write(filter, allow, sizeof allow) != sizeof allow) {
		perror("filter");
		return 1;
	}
	char *before[] = {"trialnet-init-setup", "masked", "host-dns", "/run/trialnet", "--", NULL};
	char *after[] = {"trialnet-init-setup", "masked", "host-dns", ns, "/run/trialnet", "--", NULL};
	static char stack[1 << 20];
	double *took[2] = {calloc(n, sizeof(double)), calloc(n, sizeof(double))};
	for (int i = 0; i < n; i++)
		for (int v = 0; v < 2; v++) {
			bin = argv[3 + v];
			init_argv = v ? after : before;
			if (pipe2(ready, O_CLOEXEC) < 0)
				return 1;
			double t0 = now_ms();
			int pid = clone(child, stack + sizeof stack, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | SIGCHLD, NULL);
			close(ready[1]);
			char msg[4096];
			ssize_t r, got = 0;
			while ((r = read(ready[0], msg, sizeof msg)) > 0)
				got += r;
			took[v][i] = now_ms() - t0;
			close(ready[0]);
			if (pid > 0) {
				kill(pid, SIGKILL);
				waitpid(pid, NULL, 0);
			}
			if (pid < 0 || got != 1) {
				fprintf(stderr, "%s: not ready (%zd bytes)\n", bin, got);
				return 1;
			}
		}
	for (int v = 0; v < 2; v++) {
		qsort(took[v], n, sizeof(double), cmp);
		printf("%s p50 %.2f p99 %.2f ms\n", v ? "new" : "old", took[v][n / 2], took[v][n * 99 / 100]);
	}
	return 0;
}
