//go:build linux && cgo

// trialnet-exec, run before the Go runtime starts, and the one-exec launch
// of a Trial command; off x86-64 also the Trial's init (init_early.c),
// which on x86-64 is a static binary of its own (initimage_amd64.go).
//
// Each is a re-execution of the trialnet binary (argv[0] names the role).
// Starting the Go runtime of a 20 MB binary costs 5-8 ms of CPU here, and
// a later command in a live Trial paid it every time; a C constructor runs
// from the dynamic loader, before the runtime, and execs the command or
// becomes the init without it (runc's nsexec does its namespace work the
// same way). exec.go's Go versions (trialExec; runInit, runReaper) are
// what CGO_ENABLED=0 builds run; this file does the same steps in the
// same order, and the same tests hold both.
//
// trialnet_launch (launch_cgo.go) saves the exec of trialnet too: it
// clones the command's process itself and runs trial_exec, the very steps
// of the constructor, in the child, which then execs the command. That
// child comes from a multi-threaded Go process: on x86-64 it shares its
// memory (see sys6), elsewhere it is a copy. So everything trial_exec calls is a
// bare system call or a pure function of its arguments (strlen, memcpy):
// no stdio, no malloc, no locale, no static and no errno written, nothing
// that could wait on a lock another thread held at the clone
// (signal-safety(7)); messages are built by hand, and the errno text is
// left to the launcher (a NUL, then the number).

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
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "early.h"

#include <sys/mman.h>

#ifndef LANDLOCK_SCOPE_SIGNAL
#define LANDLOCK_SCOPE_SIGNAL (1ULL << 1)
#endif
#ifndef KEYCTL_JOIN_SESSION_KEYRING
#define KEYCTL_JOIN_SESSION_KEYRING 1
#endif

// Exit codes and descriptors as exec.go has them.
enum { exit_cannot_execute = 126, exit_not_found = 127 };
enum { fd_errors = 3, fd_go = 4, fd_filter = 5, fd_count = 6 };

// The Trial's own directories (owndirs.go's ownDirs, checked equal by
// TestEarlyOwnDirs), beneath which a confined command makes sockets.
const char *const trialnet_early_own_dirs[] = {"/tmp", "/var/tmp", "/dev/shm", NULL};

// The most instructions a filter may have (BPF_MAXINSNS).
#define max_filter 4096

#if defined(__x86_64__)
// On x86-64 a launch's child shares the launcher's memory until it execs
// (CLONE_VM, as posix_spawn's vfork does), so that cloning a large Go
// process copies no page table. It then writes nothing but its own stack:
// no static, and not errno either, which is the launcher thread's (the
// child runs on its TLS). sys is the bare instruction.
static inline long sys6(long n, long a, long b, long c, long d, long e, long f) {
	register long r10 __asm__("r10") = d, r8 __asm__("r8") = e, r9 __asm__("r9") = f;
	long ret;
	__asm__ volatile("syscall"
	                 : "=a"(ret)
	                 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
	                 : "rcx", "r11", "memory");
	return ret;
}

// The kernel's struct sigaction on x86-64.
struct ksigaction {
	void (*handler)(int);
	unsigned long flags;
	void (*restorer)(void);
	uint64_t mask;
};

// signal_ignored and signal_default are sigaction's, without libc.
static int signal_ignored(int s) {
	struct ksigaction old;
	return sys6(SYS_rt_sigaction, s, 0, (long)&old, 8, 0, 0) == 0 && old.handler == SIG_IGN;
}

static void signal_default(int s) {
	struct ksigaction dfl = {.handler = SIG_DFL};
	sys6(SYS_rt_sigaction, s, (long)&dfl, 0, 8, 0, 0);
}
#else
// Elsewhere the child is a copy (fork), whose memory is its own: libc's
// wrappers may set errno there.
static inline long sys6(long n, long a, long b, long c, long d, long e, long f) {
	long r = syscall(n, a, b, c, d, e, f);
	return r < 0 ? -errno : r;
}

static int signal_ignored(int s) {
	struct sigaction old;
	return sigaction(s, NULL, &old) == 0 && old.sa_handler == SIG_IGN;
}

static void signal_default(int s) {
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	sigaction(s, &dfl, NULL);
}
#endif

// sys is a system call that returns -errno on failure.
#define sys(n, a, b, c, d) sys6((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)

// vfail writes why trialnet-exec gave up to fd and exits: the
// NULL-terminated pieces of the message, then, when err is not 0, a NUL
// and err in decimal, which the launcher spells (execMessage).
__attribute__((noreturn)) static void vfail(int fd, int code, int err, va_list ap) {
	char msg[1024];
	size_t n = 0;
	for (const char *s; (s = va_arg(ap, const char *));)
		for (; *s && n < sizeof msg - 16; s++)
			msg[n++] = *s;
	if (err) {
		char d[12];
		int i = 0;
		for (unsigned v = err; v || !i; v /= 10)
			d[i++] = '0' + v % 10;
		msg[n++] = 0;
		while (i)
			msg[n++] = d[--i];
	}
	sys(SYS_write, fd, msg, n, 0);
	for (;;)
		sys(SYS_exit_group, code, 0, 0, 0);
}

// fail is vfail to fd 3, where trialnet-exec's error pipe is; err is an
// errno, or -errno as sys returns it.
__attribute__((noreturn, sentinel)) static void fail(int code, long err, ...) {
	va_list ap;
	va_start(ap, err);
	vfail(fd_errors, code, err < 0 ? -err : err, ap);
}

// fail_at is fail to fd, before the child's descriptors are in place.
__attribute__((noreturn, sentinel)) static void fail_at(int fd, int code, long err, ...) {
	va_list ap;
	va_start(ap, err);
	vfail(fd, code, err < 0 ? -err : err, ap);
}

// decimal writes v into buf, which must hold 21 bytes.
static const char *decimal(char *buf, unsigned long long v) {
	char *p = buf + 20;
	*p = 0;
	do
		*--p = '0' + v % 10;
	while (v /= 10);
	return p;
}

// quoted escapes into buf (512 bytes) what is not printable ASCII: the
// text reaches the operator's terminal.
static const char *quoted(char *buf, const char *s) {
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;
	buf[o++] = '"';
	for (; *s && o < 512 - 6; s++) {
		unsigned char c = *s;
		if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
			buf[o++] = '\\', buf[o++] = 'x';
			buf[o++] = hex[c >> 4], buf[o++] = hex[c & 15];
		} else {
			buf[o++] = c;
		}
	}
	buf[o++] = '"';
	buf[o] = 0;
	return buf;
}

// parse_id reads a decimal id below UINT32_MAX, which is (uid_t)-1:
// "no change" to setresuid, which would leave the command root.
static int parse_id(const char *s, uint64_t *out) {
	uint64_t v = 0;
	if (!*s)
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (*s - '0');
		if (v >= UINT32_MAX)
			return -1;
	}
	*out = v;
	return 0;
}

// find_executable is exec.LookPath's check of one candidate: a file,
// executable for the caller (root: any execute bit); it returns an errno.
static int find_executable(const char *path) {
	struct stat st;
	long r = sys(SYS_newfstatat, AT_FDCWD, path, &st, 0);
	if (r < 0)
		return -r;
	if (S_ISDIR(st.st_mode))
		return EISDIR;
	if ((r = sys(SYS_faccessat2, AT_FDCWD, path, X_OK, AT_EACCESS)) == 0)
		return 0;
	if (r != -ENOSYS && r != -EPERM)
		return -r;
	return (st.st_mode & 0111) ? 0 : EACCES;
}

// not_found fails look_path for file as uid, with why (err, or text).
__attribute__((noreturn)) static void not_found(const char *file, uint64_t uid, int err, const char *why) {
	char q[512], u[21];
	fail(exit_not_found, err, "command ", quoted(q, file), " not found or not executable as uid ", decimal(u, uid),
	     ": exec: ", q, why, NULL);
}

// look_path is exec.LookPath: file itself when it has a slash, else the
// first executable in PATH; one found relative to the working directory
// is refused (exec.ErrDot).
static void look_path(const char *file, char **envp, char *out, uint64_t uid) {
	size_t flen = strlen(file);
	if (strchr(file, '/')) {
		int e = find_executable(file);
		if (e)
			not_found(file, uid, e, "");
		if (flen >= PATH_MAX)
			not_found(file, uid, ENAMETOOLONG, "");
		memcpy(out, file, flen + 1);
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
		const char *dir = path;
		size_t n = end - path;
		if (!n)
			dir = ".", n = 1;
		if (n + 1 + flen < PATH_MAX) {
			memcpy(out, dir, n);
			out[n] = '/';
			memcpy(out + n + 1, file, flen + 1);
			if (find_executable(out) == 0) {
				if (out[0] != '/')
					not_found(file, uid, 0, ": cannot run executable found relative to current directory");
				return;
			}
		}
		more = *end != 0;
		path = end + 1;
	}
	not_found(file, uid, 0, ": executable file not found in $PATH");
}

// read_filter reads the seccomp program the launcher passes (a sealed
// memfd, seccompFile), before anything is dropped.
static int read_filter(struct sock_filter *prog) {
	// Sealed (seccompMemfd): what is read is what the launcher wrote, and
	// stays so between the size and the read.
	const long seals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
	long got = sys(SYS_fcntl, fd_filter, F_GET_SEALS, 0, 0);
	if (got < 0 || (got & seals) != seals)
		fail(exit_cannot_execute, got < 0 ? got : EPERM, "trialnet-exec: the seccomp filter on fd 5 is not a sealed memfd", NULL);
	struct stat st;
	if (sys(SYS_fstat, fd_filter, &st, 0, 0) < 0 || st.st_size <= 0 || st.st_size % sizeof *prog ||
	    st.st_size > (off_t)(max_filter * sizeof *prog))
		fail(exit_cannot_execute, 0, "trialnet-exec: no seccomp filter from the launcher on fd 5", NULL);
	long r = sys(SYS_pread64, fd_filter, prog, st.st_size, 0);
	if (r != st.st_size)
		fail(exit_cannot_execute, r < 0 ? r : EIO, "trialnet-exec: read the seccomp filter", NULL);
	return st.st_size / sizeof *prog;
}

// own_cgroup_namespace is exec.go's ownCgroupNamespace.
static void own_cgroup_namespace(void) {
	long r;
	if ((r = sys(SYS_unshare, CLONE_NEWCGROUP, 0, 0, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: unshare cgroup namespace", NULL);
}

// isolate is exec.go's isolate.
static void isolate(void) {
	long r;
	long fd = sys(SYS_openat, AT_FDCWD, "/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC, 0);
	if (fd < 0 || (r = sys(SYS_write, fd, "1000", 4, 0)) != 4)
		fail(exit_cannot_execute, fd < 0 ? fd : r < 0 ? r : EIO, "trialnet-exec: make the Trial the OOM killer's first choice", NULL);
	sys(SYS_close, fd, 0, 0, 0);
	if ((r = sys(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: close inherited descriptors", NULL);
}

// last_cap reads /proc/sys/kernel/cap_last_cap.
static int last_cap(void) {
	char buf[16] = {0};
	long r, fd = sys(SYS_openat, AT_FDCWD, "/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0 || (r = sys(SYS_read, fd, buf, sizeof buf - 1, 0)) <= 0)
		fail(exit_cannot_execute, fd < 0 ? fd : r < 0 ? r : EIO, "trialnet-exec: read cap_last_cap", NULL);
	sys(SYS_close, fd, 0, 0, 0);
	int last = trialnet_parse_last_cap(buf);
	if (last < 0)
		fail(exit_cannot_execute, EINVAL, "trialnet-exec: read cap_last_cap", NULL);
	return last;
}

// drop_privileges is exec.go's dropPrivileges for a command's uid and gid.
static void drop_privileges(uint64_t uid, uint64_t gid) {
	char d[21];
	long r;
	int last = last_cap();
	for (int c = 0; c <= last; c++)
		if ((r = sys(SYS_prctl, PR_CAPBSET_DROP, c, 0, 0)) < 0)
			fail(exit_cannot_execute, r, "trialnet-exec: drop capability ", decimal(d, c), " from the bounding set", NULL);
	// Raw: glibc's wrappers would signal every thread; there is one.
	if ((r = sys(SYS_setgroups, 0, NULL, 0, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: setgroups", NULL);
	if ((r = sys(SYS_setresgid, gid, gid, gid, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: setgid ", decimal(d, gid), NULL);
	// The uid change resets the memory's dumpable flag to
	// fs.suid_dumpable, and a launch's child shares the launcher's memory:
	// at 1, the Trial's uid could open its /proc/PID/mem. Kept
	// capabilities keep that uid out (ptrace needs the tracee's permitted
	// set) until the flag is 0 again. A launcher whose keep-caps bit is
	// locked (EPERM) goes without: the flag is cleared right after.
	if ((r = sys(SYS_prctl, PR_SET_KEEPCAPS, 1, 0, 0)) < 0 && r != -EPERM)
		fail(exit_cannot_execute, r, "trialnet-exec: keep capabilities across setuid", NULL);
	if ((r = sys(SYS_setresuid, uid, uid, uid, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: setuid ", decimal(d, uid), NULL);
	if ((r = sys(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: set not dumpable", NULL);
	if ((r = sys(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: clear ambient capabilities", NULL);
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct data[2] = {0};
	if ((r = sys(SYS_capset, &hdr, data, 0, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: clear capabilities", NULL);
	if ((r = sys(SYS_prctl, PR_SET_KEEPCAPS, 0, 0, 0)) < 0 && r != -EPERM)
		fail(exit_cannot_execute, r, "trialnet-exec: stop keeping capabilities", NULL);
	if ((r = sys(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: set no_new_privs", NULL);
}

// reach_cwd_as_uid is exec.go's reachCwdAsUID: the working directory the
// launcher's chdir reached as root is reached again by its path, now as
// the command's uid, so that a link the Trial left at --workdir leads
// nowhere that uid could not go itself (beneath root's 0700 directory).
static void reach_cwd_as_uid(uint64_t uid) {
	char cwd[PATH_MAX], u[21];
	long r = sys(SYS_getcwd, cwd, sizeof cwd, 0, 0);
	if (r < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: read the working directory's path", NULL);
	// "(unreachable)..." would be a path relative to the directory itself.
	if (cwd[0] != '/')
		fail(exit_cannot_execute, ENOENT, "trialnet-exec: the working directory is outside the Trial's root", NULL);
	if ((r = sys(SYS_chdir, cwd, 0, 0, 0)) < 0) {
		char q[512];
		fail(exit_cannot_execute, r, "trialnet-exec: the working directory ", quoted(q, cwd), " is not reachable as uid ",
		     decimal(u, uid), " (give --workdir a directory that user can enter by its path)", NULL);
	}
}

// enter_landlock is landlock.go's enterLandlock; no Landlock is not an
// error (the layers report it).
static void enter_landlock(int confine_sockets, int nested) {
	long abi = sys(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION, 0);
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
	long r, fd = sys(SYS_landlock_create_ruleset, &attr, size, 0, 0);
	if (fd < 0)
		fail(exit_cannot_execute, fd, "trialnet-exec: landlock ruleset", NULL);
	for (const char *const *d = trialnet_early_own_dirs; confine_sockets && *d; d++) {
		long dir = sys(SYS_openat, AT_FDCWD, *d, O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
		if (dir == -ENOENT)
			continue; // the host has no such directory, so the Trial has none
		if (dir < 0)
			fail(exit_cannot_execute, dir, "trialnet-exec: landlock: open ", *d, NULL);
		struct landlock_path_beneath_attr rule = {.allowed_access = sockets, .parent_fd = dir};
		if ((r = sys(SYS_landlock_add_rule, fd, LANDLOCK_RULE_PATH_BENEATH, &rule, 0)) < 0)
			fail(exit_cannot_execute, r, "trialnet-exec: landlock: allow sockets beneath ", *d, NULL);
		sys(SYS_close, dir, 0, 0, 0);
	}
	if ((r = sys(SYS_landlock_restrict_self, fd, 0, 0, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: landlock restrict_self", NULL);
	sys(SYS_close, fd, 0, 0, 0);
}

// default_signals gives the command default dispositions and no blocked
// signal: a command on a terminal expects them. What the launcher ignored
// is reset, as the Go runtime's exec resets what it caught (SIGHUP and
// SIGINT ignored at start stay ignored there too).
static void default_signals(void) {
	for (int s = 1; s < NSIG; s++) {
		if (s == SIGKILL || s == SIGSTOP)
			continue;
		if ((s == SIGHUP || s == SIGINT) && signal_ignored(s))
			continue;
		signal_default(s);
	}
	uint64_t none = 0;
	sys(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
}

// trial_exec is exec.go's trialExec and becomeCommand: argv is
// trialnet-exec UID GID NPROC SOCKETS -- CMD...
__attribute__((noreturn)) static void trial_exec(int argc, char **argv, char **envp) {
	uint64_t uid, gid, nproc;
	const char *mode = argc > 4 ? argv[4] : "";
	int confine = !strcmp(mode, "sockets=trial"), nested = !strcmp(mode, "nested");
	if (argc < 7 || strcmp(argv[5], "--") || (!confine && !nested && strcmp(mode, "sockets=anywhere")) ||
	    parse_id(argv[1], &uid) || parse_id(argv[2], &gid) || parse_id(argv[3], &nproc))
		fail(exit_cannot_execute, 0, "trialnet-exec: bad arguments", NULL);
	char **cmd = argv + 6;
	default_signals();

	struct sock_filter filter[max_filter]; // 32 KiB: the launch stack has room
	int n = read_filter(filter);
	isolate();
	// Found as root; a command the uid may not execute fails at exec.
	char path[PATH_MAX];
	look_path(cmd[0], envp, path, uid);
	// Nothing of CMD runs before the launcher's byte: the init is ready.
	char b;
	if (sys(SYS_read, fd_go, &b, 1, 0) != 1)
		fail(exit_cannot_execute, 0, "trialnet-exec: the Trial's init did not become ready", NULL);
	own_cgroup_namespace();
	struct rlimit lim = {nproc, nproc}, none_lim = {TRIALNET_CORE_LIMIT, TRIALNET_CORE_LIMIT};
	long r;
	if ((r = sys(SYS_prlimit64, 0, RLIMIT_NPROC, &lim, NULL)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: set the process limit", NULL);
	if ((r = sys(SYS_prlimit64, 0, RLIMIT_CORE, &none_lim, NULL)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: set the core size limit", NULL);
	struct rlimit mq_lim = {TRIALNET_MSGQUEUE_BYTES, TRIALNET_MSGQUEUE_BYTES};
	if ((r = sys(SYS_prlimit64, 0, RLIMIT_MSGQUEUE, &mq_lim, NULL)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: set the message queue limit", NULL);
	drop_privileges(uid, gid);
	reach_cwd_as_uid(uid);
	if ((r = sys(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, 0, 0, 0)) < 0 && r != -ENOSYS)
		fail(exit_cannot_execute, r, "trialnet-exec: join a session keyring of its own", NULL);
	enter_landlock(confine, nested);
	// Last before exec: inherited by everything CMD starts.
	struct sock_fprog prog = {.len = n, .filter = filter};
	if ((r = sys(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: install seccomp filter", NULL);
	long e = -sys(SYS_execve, path, cmd, envp, 0);
	char q[512], u[21], p[21];
	if (e == EACCES)
		fail(exit_not_found, e, "command ", quoted(q, cmd[0]), " not found or not executable as uid ", decimal(u, uid), NULL);
	if (e == EAGAIN)
		fail(exit_cannot_execute, e, "exec ", path, ": uid ", decimal(u, uid), " already has ", decimal(p, nproc),
		     " or more processes or threads, this command's process limit, which counts all of the uid's, in every Trial and outside them (give each Trial its own uid, or raise --max-procs)", NULL);
	fail(exit_cannot_execute, e, "exec ", path, NULL);
}

// The descriptor limit this process started with, before the Go runtime
// raised its soft limit to the hard one: a launch gives it back to the
// command, as Go's own exec does. Written once, by the constructor.
static struct rlimit start_nofile;
static int have_start_nofile;

// launch_child is what a launch's child does before trial_exec: what Go's
// fork would do for trialnet-exec (a session of its own, the working
// directory, descriptors 0-5, the terminal, the descriptor limit), then
// the constructor's steps. Its signals are all blocked until it has set
// its own: a handler of the Go runtime must not run on it.
__attribute__((noreturn)) static void launch_child(struct trialnet_launch *l) {
	int errfd = l->fds[fd_errors];
	long r;
	// The launcher learns the pid (l->pid, set by the kernel before this
	// runs) from this byte: its own thread waits in clone3 until exec.
	sys(SYS_write, l->started, "", 1, 0);
	// The child holds the launcher's memory until exec: no process of
	// the Trial's may read it (ptrace, /proc/PID/mem), nor a core dump
	// carry it. exec resets this.
	if ((r = sys(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0)) < 0)
		fail_at(errfd, exit_cannot_execute, r, "trialnet-exec: set not dumpable", NULL);
	if (l->setsid && (r = sys(SYS_setsid, 0, 0, 0, 0)) < 0)
		fail_at(errfd, exit_cannot_execute, r, "trialnet-exec: setsid", NULL);
	if (l->dir && (r = sys(SYS_chdir, l->dir, 0, 0, 0)) < 0) {
		char q[512];
		fail_at(errfd, exit_cannot_execute, r, "trialnet-exec: enter the working directory ", quoted(q, l->dir),
		        " (run/exec --workdir: a directory in the Trial's view of files, where /tmp is the Trial's own)", NULL);
	}
	// Out of the way first, so that no source is overwritten before it
	// is moved.
	long moved[fd_count];
	for (int i = 0; i < fd_count; i++)
		if ((moved[i] = sys(SYS_fcntl, l->fds[i], F_DUPFD_CLOEXEC, fd_count, 0)) < 0)
			fail_at(errfd, exit_cannot_execute, moved[i], "trialnet-exec: move descriptors", NULL);
	for (int i = 0; i < fd_count; i++)
		if ((r = sys(SYS_dup3, moved[i], i, 0, 0)) < 0)
			fail_at(errfd, exit_cannot_execute, r, "trialnet-exec: place descriptors", NULL);
	// The rest of the launcher's table goes now, not at exec: this child
	// waits for the ready byte with it, and a copy of a ready pipe's write
	// end (its own launch's or another's) would keep that read from
	// seeing the launcher give up, as one of an error pipe would keep
	// another launch from seeing its command's exec.
	if ((r = sys(SYS_close_range, fd_count, ~0U, 0, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: close the launcher's descriptors", NULL);
	if (l->setctty && (r = sys(SYS_ioctl, l->ctty, TIOCSCTTY, 1, 0)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: set the controlling terminal", NULL);
	if (have_start_nofile && (r = sys(SYS_prlimit64, 0, RLIMIT_NOFILE, &start_nofile, NULL)) < 0)
		fail(exit_cannot_execute, r, "trialnet-exec: give back the descriptor limit", NULL);
	trial_exec(l->argc, l->argv, l->envp);
}

// The launch child's stack, and a guard page below it.
enum { launch_stack = 256 << 10, launch_guard = 4096 };

#if defined(__x86_64__)
// clone3_run clones with a stack of its own and calls fn(arg) there: the
// child cannot return into this function's frames, which the launcher
// goes on using.
static long clone3_run(struct clone_args *args, void (*fn)(struct trialnet_launch *), struct trialnet_launch *arg) {
	register long rax __asm__("rax") = SYS_clone3;
	register struct clone_args *rdi __asm__("rdi") = args;
	register long rsi __asm__("rsi") = sizeof *args;
	register void (*r12)(struct trialnet_launch *) __asm__("r12") = fn;
	register struct trialnet_launch *r13 __asm__("r13") = arg;
	__asm__ volatile("syscall\n\t"
	                 "testq %%rax, %%rax\n\t"
	                 "jnz 1f\n\t"
	                 "xorl %%ebp, %%ebp\n\t"
	                 "movq %%r13, %%rdi\n\t"
	                 "callq *%%r12\n\t"
	                 "ud2\n"
	                 "1:"
	                 : "+r"(rax)
	                 : "r"(rdi), "r"(rsi), "r"(r12), "r"(r13)
	                 : "rcx", "r11", "memory", "cc");
	return rax;
}
#endif

long trialnet_launch(struct trialnet_launch *l) {
	struct clone_args args = {.flags = CLONE_PARENT_SETTID, .parent_tid = (uint64_t)(uintptr_t)&l->pid, .exit_signal = SIGCHLD};
	if (l->cgroup >= 0)
		args.flags |= CLONE_INTO_CGROUP, args.cgroup = l->cgroup;
#if defined(__x86_64__)
	void *stack = mmap(NULL, launch_stack + launch_guard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (stack == MAP_FAILED)
		return -errno;
	if (mprotect(stack, launch_guard, PROT_NONE) < 0) {
		long e = -errno;
		munmap(stack, launch_stack + launch_guard);
		return e;
	}
	// CLONE_VFORK too: the kernel gives an oom_score_adj written by one
	// process to every other that shares its memory, unless the writer
	// is a vfork child, and the child's 1000 must not become the
	// launcher's (the agent's -900). This thread waits until the child
	// has exec'd or exited; the launcher's others go on.
	args.flags |= CLONE_VM | CLONE_VFORK;
	args.stack = (uint64_t)(uintptr_t)stack;
	args.stack_size = launch_stack + launch_guard;
#endif
	// Raw: libc's pthread_sigmask leaves its own two signals unblocked.
	uint64_t all = ~0ULL, old;
	sys(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, 8);
#if defined(__x86_64__)
	long pid = clone3_run(&args, launch_child, l);
#else
	long pid = sys(SYS_clone3, &args, sizeof args, 0, 0);
	if (pid == 0)
		launch_child(l);
#endif
	sys(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, 8);
#if defined(__x86_64__)
	// The child has exec'd or exited: its stack is free.
	munmap(stack, launch_stack + launch_guard);
#endif
	return pid;
}

__attribute__((constructor)) static void trialnet_early(int argc, char **argv, char **envp) {
	if (argc < 1 || !argv || !argv[0])
		return;
	if (!strcmp(argv[0], "trialnet-exec"))
		trial_exec(argc, argv, envp);
#if !defined(__x86_64__)
	// On x86-64 the Trial's init is a static binary of its own
	// (initimage_amd64.go); elsewhere it is this one.
	if (argc == 1 && !strcmp(argv[0], "trialnet-init"))
		trialnet_init_reap();
	if (!strcmp(argv[0], "trialnet-init-setup"))
		trialnet_init_setup(argc, argv);
#endif
	trialnet_check_root();
	have_start_nofile = getrlimit(RLIMIT_NOFILE, &start_nofile) == 0;
}
