//go:build linux && cgo

// trialnet-exec and the Trial's reaper, run before the Go runtime starts.
//
// Both are re-executions of the trialnet binary (argv[0] names the role).
// Starting the Go runtime of a 20 MB binary costs 5-8 ms of CPU here, and
// a later command in a live Trial paid it every time; a C constructor runs
// from the dynamic loader, before the runtime, and execs the command or
// becomes the reaper without it (runc's nsexec does its namespace work the
// same way). exec.go's Go versions (trialExec, runReaper) are what
// CGO_ENABLED=0 builds run; this file does the same steps in the same
// order, and the same tests hold both.

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef LANDLOCK_SCOPE_SIGNAL
#define LANDLOCK_SCOPE_SIGNAL (1ULL << 1)
#endif
#ifndef KEYCTL_JOIN_SESSION_KEYRING
#define KEYCTL_JOIN_SESSION_KEYRING 1
#endif

// Exit codes and descriptors as exec.go has them.
enum { exit_cannot_execute = 126, exit_not_found = 127 };
enum { fd_errors = 3, fd_go = 4, fd_filter = 5 };

// The Trial's own directories (owndirs.go's ownDirs, checked equal by
// TestEarlyOwnDirs), beneath which a confined command makes sockets.
const char *const trialnet_early_own_dirs[] = {"/tmp", "/var/tmp", "/dev/shm", NULL};

// The most instructions a filter may have (BPF_MAXINSNS).
#define max_filter 4096

// fail writes why trialnet-exec gave up to the launcher and exits.
__attribute__((noreturn, format(printf, 2, 3))) static void fail(int code, const char *format, ...) {
	char msg[1024];
	va_list ap;
	va_start(ap, format);
	int n = vsnprintf(msg, sizeof msg, format, ap);
	va_end(ap);
	if (n > (int)sizeof msg - 1)
		n = sizeof msg - 1;
	if (n > 0)
		(void)!write(fd_errors, msg, n);
	_exit(code);
}

// errstr is strerror in Go's spelling (lower case), as the Go path says it.
static const char *errstr(int e) {
	static char buf[128];
	snprintf(buf, sizeof buf, "%s", strerror(e));
	if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
		buf[0] += 'a' - 'A';
	return buf;
}

// quoted escapes what is not printable ASCII: the text reaches the
// operator's terminal.
static const char *quoted(const char *s) {
	static char buf[512];
	size_t o = 0;
	buf[o++] = '"';
	for (; *s && o < sizeof buf - 6; s++) {
		unsigned char c = *s;
		if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
			o += snprintf(buf + o, sizeof buf - o, "\\x%02x", c);
		else
			buf[o++] = c;
	}
	buf[o++] = '"';
	buf[o] = 0;
	return buf;
}

// parse_id reads a decimal id below UINT32_MAX, which is (uid_t)-1:
// "no change" to setresuid, which would leave the command root.
static int parse_id(const char *s, uint64_t *out) {
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *s < '0' || *s > '9' || *end || v >= UINT32_MAX)
		return -1;
	*out = v;
	return 0;
}

// find_executable is exec.LookPath's check of one candidate: a file,
// executable for the caller (root: any execute bit).
static int find_executable(const char *path) {
	struct stat st;
	if (stat(path, &st) < 0)
		return errno;
	if (S_ISDIR(st.st_mode))
		return EISDIR;
	if (syscall(SYS_faccessat2, AT_FDCWD, path, X_OK, AT_EACCESS) == 0)
		return 0;
	if (errno != ENOSYS && errno != EPERM)
		return errno;
	return (st.st_mode & 0111) ? 0 : EACCES;
}

// look_path is exec.LookPath: file itself when it has a slash, else the
// first executable in PATH; one found relative to the working directory
// is refused (exec.ErrDot).
static void look_path(const char *file, char **envp, char *out, uint64_t uid) {
	if (strchr(file, '/')) {
		int e = find_executable(file);
		if (e)
			fail(exit_not_found, "command %s not found or not executable as uid %llu: exec: %s: %s",
			     quoted(file), (unsigned long long)uid, quoted(file), errstr(e));
		snprintf(out, PATH_MAX, "%s", file);
		return;
	}
	const char *path = "";
	for (char **e = envp; e && *e; e++)
		if (strncmp(*e, "PATH=", 5) == 0) {
			path = *e + 5; // the first, as os.Getenv takes it
			break;
		}
	// An empty entry, a trailing one too, is the working directory
	// (filepath.SplitList); an empty PATH has none.
	for (int more = *path != 0; more;) {
		const char *end = strchrnul(path, ':');
		int n = end - path;
		int w = n ? snprintf(out, PATH_MAX, "%.*s/%s", n, path, file) : snprintf(out, PATH_MAX, "./%s", file);
		if (w < PATH_MAX && find_executable(out) == 0) {
			if (out[0] != '/')
				fail(exit_not_found, "command %s not found or not executable as uid %llu: exec: %s: cannot run executable found relative to current directory",
				     quoted(file), (unsigned long long)uid, quoted(file));
			return;
		}
		more = *end != 0;
		path = end + 1;
	}
	fail(exit_not_found, "command %s not found or not executable as uid %llu: exec: %s: executable file not found in $PATH",
	     quoted(file), (unsigned long long)uid, quoted(file));
}

// read_filter reads the seccomp program the launcher passes (a sealed
// memfd, seccompFile), before anything is dropped.
static int read_filter(struct sock_filter *prog) {
	struct stat st;
	if (fstat(fd_filter, &st) < 0 || st.st_size <= 0 || st.st_size % sizeof *prog ||
	    st.st_size > (off_t)(max_filter * sizeof *prog))
		fail(exit_cannot_execute, "trialnet-exec: no seccomp filter from the launcher on fd %d", fd_filter);
	if (pread(fd_filter, prog, st.st_size, 0) != st.st_size)
		fail(exit_cannot_execute, "trialnet-exec: read the seccomp filter: %s", errstr(errno));
	return st.st_size / sizeof *prog;
}

// isolate is exec.go's isolate.
static void isolate(void) {
	if (unshare(CLONE_NEWCGROUP) < 0)
		fail(exit_cannot_execute, "trialnet-exec: unshare cgroup namespace: %s", errstr(errno));
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "1000", 4) != 4)
		fail(exit_cannot_execute, "trialnet-exec: make the Trial the OOM killer's first choice: %s", errstr(errno));
	close(fd);
	if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
		fail(exit_cannot_execute, "trialnet-exec: close inherited descriptors: %s", errstr(errno));
}

// drop_privileges is exec.go's dropPrivileges for a command's uid and gid.
static void drop_privileges(uint64_t uid, uint64_t gid) {
	char buf[16] = {0};
	int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || read(fd, buf, sizeof buf - 1) <= 0)
		fail(exit_cannot_execute, "trialnet-exec: read cap_last_cap: %s", errstr(errno));
	close(fd);
	int last = atoi(buf);
	for (int c = 0; c <= last; c++)
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0)
			fail(exit_cannot_execute, "trialnet-exec: drop capability %d from the bounding set: %s", c, errstr(errno));
	// Raw: glibc's wrappers would signal every thread; there is one.
	if (syscall(SYS_setgroups, 0, NULL) < 0)
		fail(exit_cannot_execute, "trialnet-exec: setgroups: %s", errstr(errno));
	if (syscall(SYS_setresgid, gid, gid, gid) < 0)
		fail(exit_cannot_execute, "trialnet-exec: setgid %llu: %s", (unsigned long long)gid, errstr(errno));
	if (syscall(SYS_setresuid, uid, uid, uid) < 0)
		fail(exit_cannot_execute, "trialnet-exec: setuid %llu: %s", (unsigned long long)uid, errstr(errno));
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
		fail(exit_cannot_execute, "trialnet-exec: clear ambient capabilities: %s", errstr(errno));
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct data[2] = {0};
	if (syscall(SYS_capset, &hdr, data) < 0)
		fail(exit_cannot_execute, "trialnet-exec: clear capabilities: %s", errstr(errno));
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		fail(exit_cannot_execute, "trialnet-exec: set no_new_privs: %s", errstr(errno));
}

// enter_landlock is landlock.go's enterLandlock; no Landlock is not an
// error (the layers report it).
static void enter_landlock(int confine_sockets, int nested) {
	long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
	if (abi < 1 || (nested && abi < 6))
		return;
	struct {
		uint64_t fs, net, scoped;
	} attr = {.fs = LANDLOCK_ACCESS_FS_MAKE_BLOCK};
	const uint64_t sockets = LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO;
	if (nested)
		attr.fs = 0, confine_sockets = 0;
	if (confine_sockets)
		attr.fs |= sockets;
	size_t size = offsetof(typeof(attr), net);
	if (abi >= 4)
		size = offsetof(typeof(attr), scoped);
	if (abi >= 6)
		attr.scoped = LANDLOCK_SCOPE_SIGNAL, size = sizeof attr;
	int fd = syscall(SYS_landlock_create_ruleset, &attr, size, 0);
	if (fd < 0)
		fail(exit_cannot_execute, "trialnet-exec: landlock ruleset: %s", errstr(errno));
	for (const char *const *d = trialnet_early_own_dirs; confine_sockets && *d; d++) {
		int dir = open(*d, O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (dir < 0 && errno == ENOENT)
			continue; // the host has no such directory, so the Trial has none
		if (dir < 0)
			fail(exit_cannot_execute, "trialnet-exec: landlock: open %s: %s", *d, errstr(errno));
		struct landlock_path_beneath_attr rule = {.allowed_access = sockets, .parent_fd = dir};
		if (syscall(SYS_landlock_add_rule, fd, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) < 0)
			fail(exit_cannot_execute, "trialnet-exec: landlock: allow sockets beneath %s: %s", *d, errstr(errno));
		close(dir);
	}
	if (syscall(SYS_landlock_restrict_self, fd, 0) < 0)
		fail(exit_cannot_execute, "trialnet-exec: landlock restrict_self: %s", errstr(errno));
	close(fd);
}

// trial_exec is exec.go's trialExec and becomeCommand: argv is
// trialnet-exec UID GID NPROC SOCKETS -- CMD...
__attribute__((noreturn)) static void trial_exec(int argc, char **argv, char **envp) {
	uint64_t uid, gid, nproc;
	const char *mode = argc > 4 ? argv[4] : "";
	int confine = !strcmp(mode, "sockets=trial"), nested = !strcmp(mode, "nested");
	if (argc < 7 || strcmp(argv[5], "--") || (!confine && !nested && strcmp(mode, "sockets=anywhere")) ||
	    parse_id(argv[1], &uid) || parse_id(argv[2], &gid) || parse_id(argv[3], &nproc))
		fail(exit_cannot_execute, "trialnet-exec: bad arguments");
	char **cmd = argv + 6;
	// A command on a terminal expects default dispositions: what the
	// launcher ignored is reset, as the Go runtime's exec resets what it
	// caught (SIGHUP and SIGINT ignored at start stay ignored there too).
	for (int s = 1; s < NSIG; s++) {
		struct sigaction old;
		if (s == SIGKILL || s == SIGSTOP || sigaction(s, NULL, &old) < 0)
			continue;
		if ((s == SIGHUP || s == SIGINT) && old.sa_handler == SIG_IGN)
			continue;
		signal(s, SIG_DFL);
	}
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	static struct sock_filter filter[max_filter];
	int n = read_filter(filter);
	isolate();
	// Found as root; a command the uid may not execute fails at exec.
	static char path[PATH_MAX];
	look_path(cmd[0], envp, path, uid);
	// Nothing of CMD runs before the launcher's byte: the init is ready.
	char b;
	if (read(fd_go, &b, 1) != 1)
		fail(exit_cannot_execute, "trialnet-exec: the Trial's init did not become ready");
	struct rlimit lim = {nproc, nproc}, none_lim = {0, 0};
	if (setrlimit(RLIMIT_NPROC, &lim) < 0)
		fail(exit_cannot_execute, "trialnet-exec: set the process limit: %s", errstr(errno));
	if (setrlimit(RLIMIT_CORE, &none_lim) < 0)
		fail(exit_cannot_execute, "trialnet-exec: set the core size limit: %s", errstr(errno));
	drop_privileges(uid, gid);
	if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, 0, 0, 0, 0) < 0 && errno != ENOSYS)
		fail(exit_cannot_execute, "trialnet-exec: join a session keyring of its own: %s", errstr(errno));
	enter_landlock(confine, nested);
	// Last before exec: inherited by everything CMD starts.
	struct sock_fprog prog = {.len = n, .filter = filter};
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
		fail(exit_cannot_execute, "trialnet-exec: install seccomp filter: %s", errstr(errno));
	execve(path, cmd, envp);
	int e = errno;
	if (e == EACCES)
		fail(exit_not_found, "command %s not found or not executable as uid %llu: %s", quoted(cmd[0]), (unsigned long long)uid, errstr(e));
	if (e == EAGAIN)
		fail(exit_cannot_execute, "exec %s: uid %llu already has %llu or more processes or threads, this command's process limit, which counts all of the uid's, in every Trial and outside them (give each Trial its own uid, or raise --max-procs): %s",
		     path, (unsigned long long)uid, (unsigned long long)nproc, errstr(e));
	fail(exit_cannot_execute, "exec %s: %s", path, errstr(e));
}

// crashed says which signal ended the reaper, on its stderr, which only
// the launcher that started the init reads (initProc.lastWords), and
// exits: a crash of PID 1 ends the Trial, and the launch says why.
static void crashed(int sig) {
	char msg[64] = "trialnet-init: crashed: signal SIG";
	const char *name = sigabbrev_np(sig);
	size_t n = strlen(msg);
	for (; name && *name && n < sizeof msg - 2; name++)
		msg[n++] = *name;
	msg[n++] = '\n';
	(void)!write(2, msg, n);
	// Not raise: the kernel drops a signal PID 1 sends itself without a
	// handler.
	_exit(128 + sig);
}

// reap is runReaper: the Trial's PID 1 once set up, with no capability,
// under the filter (both survive the exec). Every other signal it could
// catch is ignored, so nothing inside stops it, and SIGCHLD ignored makes
// the kernel reap each orphan as it exits.
__attribute__((noreturn)) static void reap(void) {
	for (int s = 1; s < NSIG; s++) {
		switch (s) {
		case SIGKILL:
		case SIGSTOP:
			continue;
		case SIGABRT:
		case SIGSEGV:
		case SIGBUS:
		case SIGILL:
		case SIGFPE:
		case SIGSYS:
			signal(s, crashed);
			break;
		default:
			signal(s, SIG_IGN);
		}
	}
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	for (;;)
		pause();
}

__attribute__((constructor)) static void trialnet_early(int argc, char **argv, char **envp) {
	if (argc < 1 || !argv || !argv[0])
		return;
	if (!strcmp(argv[0], "trialnet-exec"))
		trial_exec(argc, argv, envp);
	if (argc == 1 && !strcmp(argv[0], "trialnet-init"))
		reap();
}
