//go:build linux && cgo && !amd64

// The Trial's init: its set-up, then, exec'd again, its reaper.
//
// On x86-64 this file and init_main.c are a static binary of their own
// (musl, `make generate`: initimage_amd64.go embeds it), which a
// launcher execs from a sealed memfd: a Trial's init loads neither the
// 20 MB Go binary nor a dynamic loader, twice. Elsewhere early.c's
// constructor calls trialnet_init_setup and trialnet_init_reap in the
// trialnet binary before the Go runtime starts (and CGO_ENABLED=0 builds
// run init.go's runInit, setupInit and runReaper). Either way the steps,
// their order and the failure reports are init.go's. The process is a
// fresh exec with one thread: unlike a launch's child, it may use libc
// freely.

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/filter.h>
#include <linux/magic.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "early.h"

#ifndef __GLIBC__
// musl (1.2.3) has no statx wrapper nor its struct: the kernel's.
#include <linux/stat.h>
#endif
#ifndef STATX_MNT_ID
#define STATX_MNT_ID 0x00001000U
#endif
#ifndef AT_STATX_DONT_SYNC
#define AT_STATX_DONT_SYNC 0x4000
#endif
#ifndef MS_NOSYMFOLLOW
#define MS_NOSYMFOLLOW 256
#endif

// The descriptors runInit's launcher gives it: the ready pipe, and in a
// cgo build the commands' seccomp filter (a sealed memfd, seccompFile).
enum { fd_ready = 3, fd_init_filter = 4 };

#define run_dir "/run/trialnet" // rootdir.Run
#define resolv_path "/etc/resolv.conf"

// The Trial's own directories: owndirs.go's ownDirs. These tables have
// names of their own, kept (used) where the compiler folds them into the
// code, so that TestEarlyInitTables reads them from the very binary that
// mounts with them.
const struct trialnet_own_dir trialnet_init_own_dirs[] = {
    {"/tmp", "t", TRIALNET_TMP_BYTES},
    {"/var/tmp", "v", TRIALNET_TMP_BYTES},
    {"/dev/shm", "d", TRIALNET_SHM_BYTES},
};
enum { n_own_dirs = sizeof trialnet_init_own_dirs / sizeof trialnet_init_own_dirs[0] };

// The host's shared directories: owndirs.go's sharedDirs, each covered
// with an empty tmpfs of its mode and owner (cover_shared_dirs).
const char *const trialnet_init_shared_dirs[] = {"/run/lock", "/var/lock", "/var/crash"};
enum { n_shared_dirs = sizeof trialnet_init_shared_dirs / sizeof trialnet_init_shared_dirs[0] };
__attribute__((used)) const long long trialnet_init_shared_bytes = TRIALNET_SHARED_BYTES;

// The types of the file systems served outside the Trial: mask.go's
// remoteFS (an entry ending in "." names each subtype), which
// hide_remote_fs detaches.
const char *const trialnet_init_remote_fs[] = {
    "fuse", "fuse.", "fuseblk", "fuseblk.",
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "9p",
    "ceph", "afs", "coda", "lustre", "orangefs", "beegfs", "gpfs",
};
enum { n_remote_fs = sizeof trialnet_init_remote_fs / sizeof trialnet_init_remote_fs[0] };

const char *const trialnet_init_resolv_conf = TRIALNET_RESOLV_CONF;
__attribute__((used)) const int trialnet_init_max_ptys = TRIALNET_MAX_PTYS;

// init_fail writes why setting the Trial up failed to the ready pipe, as
// runInit writes its error, and exits: "trialnet-init: " and the message,
// then, when err is not 0, a NUL and err in decimal, and when tail is not
// NULL a NUL and tail. The launcher puts the errno's text in the NUL's
// place and tail after it (execMessage): a Go error's text, word for word.
__attribute__((noreturn, format(printf, 3, 4))) static void init_fail(int err, const char *tail, const char *fmt, ...) {
	char msg[4096];
	int n = snprintf(msg, sizeof msg, "trialnet-init: ");
	va_list ap;
	va_start(ap, fmt);
	n += vsnprintf(msg + n, sizeof msg - n, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof msg - 256)
		n = sizeof msg - 256; // cut short: room for the errno and tail
	if (err) {
		msg[n] = 0; // the separator, which a text cut short lacks
		n += 1 + snprintf(msg + n + 1, 16, "%d", err);
		if (tail)
			n += 1 + snprintf(msg + n + 1, sizeof msg - n - 1, "%s", tail);
	}
	if (n > (int)sizeof msg - 1)
		n = sizeof msg - 1;
	(void)!write(fd_ready, msg, n);
	_exit(1);
}

// mask_fail is maskErr.
#define mask_fail(err, ...) \
	init_fail((err), "; trialnet does not start a Trial without it: check that nothing (an AppArmor or SELinux policy, a container runtime) stops root mounting", __VA_ARGS__)

// The open mountinfo read_mountinfo polls, and the table it last read
// from the kernel, as read (where held).
static int mountinfo_fd = -1, mountinfo_held;
static char *mountinfo_kept;
static size_t mountinfo_kept_len, mountinfo_kept_cap;

// read_mountinfo reads this namespace's mount table, NUL-terminated,
// into one buffer that each read reuses (the last read's table is gone):
// musl maps a buffer this large afresh and unmaps it at free, and each
// unmap flushes the TLB, a hypercall in a paravirtualized guest, four
// times on a Trial's first command's path.
//
// The kernel prints the table again only where it changed since: poll
// on an open mountinfo reports POLLPRI once for every mount, detach,
// move or remount in the namespace since the descriptor last polled,
// and each read polls right before it reads. Printing the table was a
// quarter of the init's CPU, and the set-up reads it ten times, five
// of them with nothing changed between (where nothing is detached). What the kernel prints that no
// event marks stays out of the copy: propagation changes only before
// the first read (setup_init), and the cgroup namespace's unshare, which
// changes the roots printed for cgroup mounts, drops it
// (mountinfo_forget).
static char *read_mountinfo(void) {
	static char *b;
	static size_t cap = 64 << 10;
	if (mountinfo_fd < 0 && (mountinfo_fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC)) < 0)
		init_fail(errno, NULL, "read mountinfo");
	struct pollfd p = {.fd = mountinfo_fd, .events = POLLPRI};
	if (poll(&p, 1, 0) < 0)
		init_fail(errno, NULL, "read mountinfo");
	if (!b)
		b = malloc(cap);
	if (!b)
		init_fail(ENOMEM, NULL, "read mountinfo");
	if (mountinfo_held && !(p.revents & POLLPRI)) {
		memcpy(b, mountinfo_kept, mountinfo_kept_len + 1); // callers cut it up
		return b;
	}
	if (lseek(mountinfo_fd, 0, SEEK_SET) < 0)
		init_fail(errno, NULL, "read mountinfo");
	size_t len = 0;
	for (;;) {
		ssize_t r = read(mountinfo_fd, b + len, cap - len - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			init_fail(errno, NULL, "read mountinfo");
		if (r == 0)
			break;
		len += r;
		if (cap - len < 4096 && !(b = realloc(b, cap *= 2)))
			init_fail(ENOMEM, NULL, "read mountinfo");
	}
	b[len] = 0;
	if (mountinfo_kept_cap < cap && !(mountinfo_kept = realloc(mountinfo_kept, mountinfo_kept_cap = cap)))
		init_fail(ENOMEM, NULL, "read mountinfo");
	memcpy(mountinfo_kept, b, len + 1);
	mountinfo_kept_len = len;
	mountinfo_held = 1;
	return b;
}

// mountinfo_forget makes the next read_mountinfo read the kernel's table,
// after a change no poll reports.
static void mountinfo_forget(void) {
	mountinfo_held = 0;
}

// A line of mountinfo, split: its root, its mount point unescaped, its
// per-mount options, and what follows " - " (the file system type first). A mount
// point may be longer than PATH_MAX (made through relative paths), which
// no call takes whole: point then holds its start, and too_long is set,
// so that nothing acts on another path, a prefix of it.
struct mount_line {
	char point[PATH_MAX];
	const char *opts, *post;
	const char *root; // as the kernel wrote it, root_len bytes
	size_t root_len;
	int fields, too_long;
};

// unescape is cgroup2.UnescapeMountPath: \NNN octal escapes undone. It
// returns 0 if out holds all of it.
static int unescape(const char *s, size_t len, char *out, size_t outlen) {
	size_t o = 0, i = 0;
	for (; i < len && o < outlen - 1; i++) {
		if (s[i] == '\\' && i + 3 < len && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' && s[i + 2] <= '7' &&
		    s[i + 3] >= '0' && s[i + 3] <= '7') {
			out[o++] = (s[i + 1] - '0') << 6 | (s[i + 2] - '0') << 3 | (s[i + 3] - '0');
			i += 3;
			continue;
		}
		out[o++] = s[i];
	}
	out[o] = 0;
	return i < len;
}

// split_line fills m from line (modified: the options end in a NUL).
static void split_line(char *line, struct mount_line *m) {
	char *sep = strstr(line, " - ");
	m->post = sep ? sep + 3 : NULL;
	m->opts = NULL;
	m->root = NULL;
	m->root_len = 0;
	m->point[0] = 0;
	m->fields = 0;
	m->too_long = 0;
	char *end = sep ? sep : line + strlen(line);
	for (char *p = line; p < end;) {
		while (p < end && *p == ' ')
			p++;
		if (p == end)
			break;
		char *f = p;
		while (p < end && *p != ' ')
			p++;
		if (m->fields == 3)
			m->root = f, m->root_len = p - f;
		if (m->fields == 4)
			m->too_long = unescape(f, p - f, m->point, sizeof m->point);
		if (m->fields == 5) {
			m->opts = f;
			if (p < end)
				*p++ = 0;
		}
		m->fields++;
	}
}

// next_line returns the next line of *s (NUL-terminated in place), or NULL.
static char *next_line(char **s) {
	if (!**s)
		return NULL;
	char *line = *s, *nl = strchr(line, '\n');
	if (nl)
		*nl = 0, *s = nl + 1;
	else
		*s = line + strlen(line);
	return line;
}

static int under(const char *path, const char *dir) {
	size_t n = strlen(dir);
	return !strncmp(path, dir, n) && (path[n] == 0 || path[n] == '/');
}

static uint64_t mount_id(const char *path, int *err);

// own_ns_dir is ownNsDir: the directory of ns_path, when ns_path is this
// Trial's own namespace mount and the directory a mount of its own.
static int own_ns_dir(const char *ns_path, char *dir) {
	struct stat own, got;
	if (!*ns_path || strlen(ns_path) >= PATH_MAX || stat("/proc/self/ns/net", &own) < 0 || lstat(ns_path, &got) < 0 || own.st_dev != got.st_dev ||
	    own.st_ino != got.st_ino)
		return 0;
	snprintf(dir, PATH_MAX, "%s", ns_path);
	char *slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = 0;
	char up[PATH_MAX + 4];
	snprintf(up, sizeof up, "%s/..", dir);
	int err;
	uint64_t self = mount_id(dir, &err), parent = mount_id(up, &err);
	return self && parent && self != parent;
}

// is_mount_point says whether mountinfo b (left as it is) lists a mount
// on dir.
static int is_mount_point(const char *b, const char *dir) {
	char *c = strdup(b), *s = c, *line;
	if (!c)
		init_fail(ENOMEM, NULL, "read mountinfo");
	struct mount_line m;
	int found = 0;
	while (!found && (line = next_line(&s))) {
		split_line(line, &m);
		found = m.fields >= 5 && !strcmp(m.point, dir);
	}
	free(c);
	return found;
}

// ns_dir finds, in mountinfo b (left as it is), the agent's netns
// directory as dropNsMounts does: the directory of this Trial's own
// namespace mount, when it is a mount of its own. 0: none.
static int ns_dir(const char *b, char *dir) {
	char own[64], *line;
	ssize_t n = readlink("/proc/self/ns/net", own, sizeof own - 1);
	if (n <= 0)
		return 0;
	own[n] = 0;
	struct mount_line m;
	char *c = strdup(b), *s = c;
	if (!c)
		init_fail(ENOMEM, NULL, "read mountinfo");
	while (!*dir && (line = next_line(&s))) {
		split_line(line, &m);
		// A mount point cut short names another directory: the
		// one-by-one detach refuses it instead.
		if (m.post && m.fields >= 5 && !m.too_long && !strncmp(m.post, "nsfs ", 5) && m.root_len == (size_t)n &&
		    !memcmp(m.root, own, n) &&
		    strrchr(m.point, '/') != m.point) {
			snprintf(dir, PATH_MAX, "%s", m.point);
			*strrchr(dir, '/') = 0;
		}
	}
	free(c);
	return *dir && is_mount_point(b, dir);
}

// detach_ns is detachNs.
static int detach_ns(const char *point) {
	if (umount2(point, MNT_DETACH) == 0)
		return 1;
	if (errno != EINVAL && errno != ENOENT)
		init_fail(errno, NULL, "detach %s", point);
	return 0;
}

// drop_ns_mounts is dropNsMounts: the launcher's directory, checked,
// then the directory found in the mount table (a stacked one), then every
// nsfs mount the table still lists.
static void drop_ns_mounts(const char *ns_path) {
	char *b, *s, *line, dir[PATH_MAX] = "";
	if (own_ns_dir(ns_path, dir))
		detach_ns(dir);
	dir[0] = 0;
	b = read_mountinfo();
	// Each mount on the directory in turn (one mounted twice holds
	// copies beneath the top one), while the path reaches one.
	for (int more = ns_dir(b, dir); more; more = more && is_mount_point(b, dir)) {
		more = detach_ns(dir);
		b = read_mountinfo();
	}
	struct mount_line m;
	for (s = b; (line = next_line(&s));) {
		split_line(line, &m);
		if (!m.post || m.fields < 5 || strncmp(m.post, "nsfs ", 5))
			continue;
		if (m.too_long)
			init_fail(ENAMETOOLONG, NULL, "detach %s", m.point);
		detach_ns(m.point);
	}
}

// mkdir_all is os.MkdirAll; it fails as it does ("mkdir PATH").
static int mkdir_all(const char *path, mode_t mode, char *failed) {
	struct stat st;
	if (stat(path, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return 0;
		snprintf(failed, PATH_MAX + 8, "mkdir %s", path);
		return ENOTDIR;
	}
	char parent[PATH_MAX];
	snprintf(parent, sizeof parent, "%s", path);
	char *slash = strrchr(parent, '/');
	if (slash && slash != parent) {
		*slash = 0;
		int e = mkdir_all(parent, mode, failed);
		if (e)
			return e;
	}
	if (mkdir(path, mode) < 0) {
		int e = errno;
		if (e == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
			return 0;
		snprintf(failed, PATH_MAX + 8, "mkdir %s", path);
		return e;
	}
	return 0;
}

// mount_id is mountID: the id of the mount path (followed) is on, or 0
// with *err set (0 too when the kernel gives none).
static uint64_t mount_id(const char *path, int *err) {
	struct statx st;
	*err = 0;
	if (syscall(SYS_statx, AT_FDCWD, path, 0, STATX_MNT_ID, &st) < 0) {
		*err = errno;
		return 0;
	}
	return (st.stx_mask & STATX_MNT_ID) ? st.stx_mnt_id : 0;
}

static const char *own_dir_of(const char *path) {
	for (int i = 0; i < n_own_dirs; i++)
		if (under(path, trialnet_init_own_dirs[i].dir))
			return trialnet_init_own_dirs[i].dir;
	return NULL;
}

// bind_socket is bindSockets for one socket, fd opened at path.
static void bind_socket(const char *own, const char *path, int fd) {
	char failed[PATH_MAX + 8], parent[PATH_MAX];
	snprintf(parent, sizeof parent, "%s", path);
	*strrchr(parent, '/') = 0;
	int e = mkdir_all(*parent ? parent : "/", 0755, failed);
	if (e)
		init_fail(e, NULL, "mount the Trial's own %s: %s", own, failed);
	int mp = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
	if (mp < 0 && errno == EEXIST) {
		struct stat a, b;
		if (stat(path, &a) == 0 && fstat(fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
			return; // the same socket, by another spelling of its path
		errno = EEXIST;
	}
	if (mp < 0)
		init_fail(errno, NULL, "mount the Trial's own %s: open %s", own, path);
	close(mp);
	char src[32];
	snprintf(src, sizeof src, "/proc/self/fd/%d", fd);
	if (mount(src, path, "", MS_BIND, "") < 0)
		init_fail(errno, NULL, "mount the Trial's own %s: bind allowed unix socket %s", own, path);
}

// mount_own_dirs is mountOwnDirs; keep is clean, sorted and without
// duplicates (initArgs).
static void mount_own_dirs(char **keep, int nkeep) {
	int *fds = calloc(nkeep + 1, sizeof *fds);
	if (!fds)
		init_fail(ENOMEM, NULL, "mount the Trial's own directories");
	for (int i = 0; i < nkeep; i++) {
		const char *d = own_dir_of(keep[i]);
		fds[i] = -1;
		if (d && (fds[i] = open(keep[i], O_PATH | O_CLOEXEC)) < 0)
			init_fail(errno, NULL, "open allowed unix socket %s to keep it in the Trial's own %s: open %s", keep[i], d, keep[i]);
	}
	char real[n_own_dirs][PATH_MAX];
	uint64_t ids[n_own_dirs];
	int nmounted = 0;
	for (int i = 0; i < n_own_dirs; i++) {
		const char *dir = trialnet_init_own_dirs[i].dir;
		char r[PATH_MAX];
		if (!realpath(dir, r))
			continue; // none on this host: its paths lead nowhere
		uint64_t id = 0;
		for (int j = 0; j < nmounted; j++)
			if (!strcmp(real[j], r))
				id = ids[j];
		int err;
		if (!id) {
			char data[64];
			snprintf(data, sizeof data, "mode=1777,size=%lld", trialnet_init_own_dirs[i].size);
			if (mount("tmpfs", r, "tmpfs", MS_NOSUID | MS_NODEV, data) < 0)
				init_fail(errno, NULL, "mount the Trial's own %s", dir);
			if (!(id = mount_id(r, &err)) && err)
				init_fail(err, NULL, "mount the Trial's own %s: statx %s", dir, r);
			if (!id)
				init_fail(0, NULL, "mount the Trial's own %s: statx %s: no mount id (Linux 5.8+)", dir, r);
			snprintf(real[nmounted], PATH_MAX, "%s", r);
			ids[nmounted++] = id;
		}
		// Followed as Landlock and the views follow it, the directory is
		// the tmpfs just mounted.
		uint64_t got = mount_id(dir, &err);
		if (got != id)
			init_fail(err, NULL, "the Trial's own %s is not the tmpfs mounted for it at %s (mount %llu, want %llu)", dir, r,
			          (unsigned long long)got, (unsigned long long)id);
		for (int k = 0; k < nkeep; k++) {
			const char *d = own_dir_of(keep[k]);
			if (d && !strcmp(d, dir))
				bind_socket(dir, keep[k], fds[k]);
		}
	}
	for (int i = 0; i < nkeep; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(fds);
}

// cover_shared_dirs is coverSharedDirs.
static void cover_shared_dirs(void) {
	char real[n_shared_dirs][PATH_MAX];
	int n = 0;
	for (int i = 0; i < n_shared_dirs; i++) {
		const char *dir = trialnet_init_shared_dirs[i];
		struct stat st;
		if (!realpath(dir, real[n]) || stat(real[n], &st) < 0 || !S_ISDIR(st.st_mode))
			continue; // none on this host
		int seen = 0;
		for (int j = 0; j < n; j++)
			seen |= !strcmp(real[j], real[n]);
		if (seen)
			continue; // one link to another
		char data[128];
		snprintf(data, sizeof data, "mode=%o,uid=%u,gid=%u,size=%lld", (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid,
		         (unsigned)st.st_gid, trialnet_init_shared_bytes);
		if (mount("tmpfs", real[n], "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, data) < 0)
			init_fail(errno, NULL, "cover the host's %s with the Trial's own (so that no file outlives the Trial there)", dir);
		n++;
	}
}

// mount_resolv_conf is mountResolvConf at resolv_path, with run_dir
// (free until mask_host covers it) as the scratch directory; covered says
// mask_host covers run_dir.
static void overlay_resolv_conf(const char *dir, const char *top);

static void mount_resolv_conf(int covered) {
	const unsigned long flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
	if (mount("tmpfs", run_dir, "tmpfs", flags, "mode=0755,size=16k") < 0)
		init_fail(errno, NULL, "transparent mode: mount a tmpfs for the Trial's resolv.conf");
	const char *top = run_dir "/top", *src = run_dir "/top/resolv.conf";
	if (mkdir(top, 0755) < 0)
		init_fail(errno, NULL, "transparent mode: mkdir %s", top);
	int f = open(src, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	size_t len = strlen(trialnet_init_resolv_conf);
	if (f < 0)
		init_fail(errno, NULL, "transparent mode: write the Trial's resolv.conf: open %s", src);
	errno = 0;
	if (write(f, trialnet_init_resolv_conf, len) != (ssize_t)len)
		init_fail(errno ? errno : EIO, NULL, "transparent mode: write the Trial's resolv.conf: write %s", src);
	close(f);
	int fd = open(resolv_path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT) {
		overlay_resolv_conf("/etc", top);
	} else {
		if (fd < 0)
			init_fail(errno, NULL, "transparent mode: open %s", resolv_path);
		struct stat st;
		if (fstat(fd, &st) < 0)
			init_fail(errno, NULL, "transparent mode: %s", resolv_path);
		if (S_ISDIR(st.st_mode))
			init_fail(0, NULL, "transparent mode: %s is a directory on this host, which a resolv.conf cannot cover: make it a file, or turn transparent mode off (--no-transparent)", resolv_path);
		// On the path itself, through the descriptor, never where a
		// symlink there leads.
		char at[32];
		snprintf(at, sizeof at, "/proc/self/fd/%d", fd);
		if (mount(src, at, "", MS_BIND, "") < 0)
			init_fail(errno, NULL, "transparent mode: bind the Trial's resolv.conf over %s", resolv_path);
		if (mount("", resolv_path, "", MS_BIND | MS_REMOUNT | MS_RDONLY | flags, "") < 0)
			init_fail(errno, NULL, "transparent mode: make the Trial's %s read-only", resolv_path);
		close(fd);
	}
	// What is mounted from it keeps it: the scratch mount point is free
	// again, unless mask_host covers it anyway (as mountResolvConf).
	if (!covered)
		umount2(run_dir, MNT_DETACH);
}

// overlay_resolv_conf is overlayResolvConf.
static void overlay_resolv_conf(const char *dir, const char *top) {
	char *b = read_mountinfo(), *s = b, *line;
	struct mount_line m;
	while ((line = next_line(&s))) {
		split_line(line, &m);
		if (m.fields >= 5 && strcmp(m.point, dir) && under(m.point, dir))
			init_fail(0, NULL, "transparent mode: this host has no %s/resolv.conf, and giving a Trial one would hide the mount at %s: create the file on the host (any content: the Trial sees its own), or turn transparent mode off (--no-transparent)", dir, m.point);
	}
	char opts[2 * PATH_MAX + 16];
	snprintf(opts, sizeof opts, "lowerdir=%s:%s", top, dir);
	if (mount("overlay", dir, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, opts) < 0)
		init_fail(errno, "; create the file on the host (any content: the Trial sees its own), or turn transparent mode off (--no-transparent)",
		          "transparent mode: this host has no %s/resolv.conf, and an overlay to give the Trial one failed", dir);
}

#ifndef MOUNT_ATTR_RDONLY
#define MOUNT_ATTR_RDONLY 0x00000001 // linux/mount.h, which clashes with sys/mount.h
#endif

// read_only_sys is readOnlySys.
static void read_only_sys(void) {
	// struct mount_attr: attr_set, attr_clr, propagation, userns_fd.
	uint64_t attr[4] = {MOUNT_ATTR_RDONLY};
	if (syscall(SYS_mount_setattr, AT_FDCWD, "/sys", AT_RECURSIVE | AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, attr, sizeof attr) == 0)
		return;
	// Before Linux 5.12, or /sys no mount of its own: mount by mount.
	static const struct {
		const char *opt;
		unsigned long flag;
	} kept[] = {{"nosuid", MS_NOSUID},   {"nodev", MS_NODEV},           {"noexec", MS_NOEXEC},
	            {"noatime", MS_NOATIME}, {"nodiratime", MS_NODIRATIME}, {"relatime", MS_RELATIME}};
	char *b = read_mountinfo(), *s = b, *line;
	struct mount_line m;
	while ((line = next_line(&s))) {
		split_line(line, &m);
		if (m.fields < 6 || !under(m.point, "/sys"))
			continue;
		if (m.too_long)
			mask_fail(ENAMETOOLONG, "make %s read-only (a Trial must not change the host's devices or kernel state)", m.point);
		unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY;
		char *save, *o = strtok_r((char *)m.opts, ",", &save);
		for (; o; o = strtok_r(NULL, ",", &save))
			for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
				if (!strcmp(o, kept[i].opt))
					flags |= kept[i].flag;
		if (mount("", m.point, "", flags, "") < 0) {
			if (errno == ENOENT)
				continue; // covered by a later mount: unreachable anyway
			mask_fail(errno, "make %s read-only (a Trial must not change the host's devices or kernel state)", m.point);
		}
	}
}

// cgroup2_mount is cgroup2.Mount: where the unified hierarchy is mounted.
static void cgroup2_mount(char *out) {
	char *b = read_mountinfo(), *s = b, *line;
	struct mount_line m;
	while ((line = next_line(&s))) {
		split_line(line, &m);
		if (m.post && m.fields >= 5 && !strncmp(m.post, "cgroup2 ", 8)) {
			snprintf(out, PATH_MAX, "%s", m.point);
			return;
		}
	}
	init_fail(0, NULL, "no cgroup2 file system is mounted (trialnet needs the unified hierarchy; mount it with 'mount -t cgroup2 none /sys/fs/cgroup/unified')");
}

// mount_views is mountViews.
static void mount_views(const char *dir) {
	for (int i = 0; i < n_own_dirs; i++) {
		char v[PATH_MAX];
		snprintf(v, sizeof v, "%s/%s", dir, trialnet_init_own_dirs[i].view);
		if (mkdir(v, 0755) < 0)
			init_fail(errno, NULL, "make the view of %s: mkdir %s", trialnet_init_own_dirs[i].dir, v);
		struct stat st;
		if (stat(trialnet_init_own_dirs[i].dir, &st) < 0)
			continue; // none on this host: its paths lead nowhere
		if (mount(trialnet_init_own_dirs[i].dir, v, "", MS_BIND | MS_REC, "") < 0)
			init_fail(errno, NULL, "bind the view of %s", trialnet_init_own_dirs[i].dir);
		if (mount("", v, "", MS_BIND | MS_REMOUNT | MS_NOSYMFOLLOW | MS_NOSUID | MS_NODEV | MS_NOEXEC, "") < 0)
			init_fail(errno, NULL, "make the view of %s follow no symlinks", trialnet_init_own_dirs[i].dir);
	}
}

// From linux/mount.h, which clashes with sys/mount.h.
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif

// statx's STATX_MNT_ID: musl's headers have no struct statx, whose
// mask is its first 4 bytes and whose stx_mnt_id is the 8 at 144.
#define TRIALNET_STATX_MNT_ID 0x1000U

#define V1_WHY "to hide the host's cgroup v1 hierarchy there"
#define DEVPTS_HELD "it holds terminals outside the Trial, the operator's among them"
#define PROC_HELD "it shows the host's processes, and its kernel settings writable"
#define MQUEUE_HELD "it holds the host's POSIX message queues"
#define HUGETLBFS_HELD "it draws on the host's reserved huge pages, which no limit of the Trial's bounds"
#define SHM_HELD "it is the host's /dev/shm, with its POSIX shared memory and semaphores"
#define CGROUP2_HELD "it shows every Trial, and a subtree delegated to the Trial's uid writable"

// mount_id_at is mountIDAt.
static uint64_t mount_id_at(int dirfd, const char *path, int flags, const char *what, const char *why) {
	uint64_t sx[32];
	uint32_t mask;
	if (syscall(SYS_statx, dirfd, path, flags | AT_NO_AUTOMOUNT, TRIALNET_STATX_MNT_ID, sx) < 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return 0;
		mask_fail(errno, "find what is mounted on %s (%s)", what, why);
	}
	memcpy(&mask, sx, sizeof mask);
	if (!(mask & TRIALNET_STATX_MNT_ID))
		mask_fail(ENOSYS, "find what is mounted on %s (%s): the kernel gives no mount id (statx STATX_MNT_ID, Linux 5.8)", what, why);
	return sx[18];
}

// MOVED_MAX is movedMax: mount_on_top's looks.
#define MOVED_MAX 16

// read_table is a fresh copy of the mount table, which read_mountinfo's
// callers may be walking.
static char *read_table(void) {
	int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		init_fail(errno, NULL, "read mountinfo");
	size_t cap = 64 << 10, len = 0;
	char *b = malloc(cap);
	for (ssize_t r = 1; b && r;) {
		r = read(fd, b + len, cap - len - 1);
		if (r < 0 && errno != EINTR)
			init_fail(errno, NULL, "read mountinfo");
		len += r > 0 ? r : 0;
		if (cap - len < 4096)
			b = realloc(b, cap *= 2);
	}
	if (!b)
		init_fail(ENOMEM, NULL, "read mountinfo");
	close(fd);
	b[len] = 0;
	return b;
}

// mount_on_top is mountOnTop; the table its caller walks is
// read_mountinfo's last, mountinfo_kept.
static int mount_on_top(uint64_t id, char point[PATH_MAX], int flags, const char *why) {
	const char *p;
	size_t len;
	for (int look = 1;; look++) {
		if (mount_id_at(AT_FDCWD, point, flags, point, why) == id)
			return 1;
		if (look == 1 && trialnet_mount_covered(mountinfo_kept, id, &p, &len))
			return 0; // hidden, reached once what hides it goes
		if (look == MOVED_MAX)
			init_fail(EAGAIN, "; trialnet does not start a Trial that may see a mount it is to hide: start it again, and find what renames directories there",
			          "find the mount on %s (%s): it was not there, nor covered, each of the %d times the init looked (a directory above it renamed meanwhile)",
			          point, why, look);
		char *t = read_table();
		int covered = trialnet_mount_covered(t, id, &p, &len);
		int cut = !covered && unescape(p, len, point, PATH_MAX);
		free(t);
		if (covered)
			return 0;
		if (cut)
			mask_fail(ENAMETOOLONG, "find the mount on %s... (%s)", point, why);
	}
}

// own_group_tree is ownGroupTree: a copy of the Trial's group below the
// cgroup v1 mount point mnt, named in own, or -1; *group is its name.
static int own_group_tree(const char *mnt, char **own, int nown, const char **group) {
	int tree = -1;
	*group = NULL;
	for (int i = 0; i < nown; i++) {
		// One group named twice: the pids and memory controllers share
		// this hierarchy.
		if (!under(own[i], mnt) || !strcmp(own[i], mnt) || (tree >= 0 && !strcmp(own[i], *group)))
			continue;
		if (tree >= 0)
			mask_fail(EINVAL, "show the Trial's cgroup v1 groups %s and %s (they share one hierarchy, whose mount point shows one group)", *group, own[i]);
		tree = syscall(SYS_open_tree, AT_FDCWD, own[i], OPEN_TREE_CLONE | O_CLOEXEC);
		if (tree < 0 && errno == ENOENT)
			continue; // removed (by an operator): not there to show
		if (tree < 0)
			mask_fail(errno, "copy the Trial's cgroup v1 group %s (to show it alone)", own[i]);
		*group = own[i];
	}
	return tree;
}

// show_v1_group is showV1Group: the copy tree of group moved to mnt,
// read-only; its mount id.
static uint64_t show_v1_group(int tree, const char *group, const char *mnt) {
	uint64_t id = mount_id_at(tree, "", AT_EMPTY_PATH, group, V1_WHY);
	if (syscall(SYS_move_mount, tree, "", AT_FDCWD, mnt, MOVE_MOUNT_F_EMPTY_PATH) < 0)
		mask_fail(errno, "mount the Trial's cgroup v1 group %s on %s (to show it alone)", group, mnt);
	const unsigned long flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
	if (mount("", mnt, "", MS_BIND | MS_REMOUNT | MS_RDONLY | flags, "") < 0)
		mask_fail(errno, "make the Trial's cgroup v1 group on %s read-only (a Trial must not change its own limits)", mnt);
	close(tree);
	return id;
}

// hide_v1_mount is hideV1Mount.
static uint64_t hide_v1_mount(const char *mnt, char **own, int nown) {
	const char *group;
	int tree = own_group_tree(mnt, own, nown, &group);
	// Every cgroup v1 mount stacked there, and only those: what the host
	// put over one (a tmpfs) already hides it.
	struct statfs st;
	while (statfs(mnt, &st) == 0 && st.f_type == CGROUP_SUPER_MAGIC)
		if (umount2(mnt, MNT_DETACH) < 0)
			mask_fail(errno, "detach the host's cgroup v1 hierarchy from %s (it shows every Trial's groups and the host's)", mnt);
	return tree < 0 ? 0 : show_v1_group(tree, group, mnt);
}

#define V1_MAX 64

// A mount of the table as hide_v1_tree judges it.
enum { MOUNT_OTHER, MOUNT_V1, MOUNT_V2, MOUNT_TMPFS, MOUNT_LONG };
struct v1_entry {
	uint64_t id, parent;
	int kind;
	char *point;
};

static int placed_in(uint64_t id, const uint64_t *placed, int nplaced) {
	for (int i = 0; i < nplaced; i++)
		if (placed[i] == id)
			return 1;
	return 0;
}

// v1_tree_alone is v1TreeAlone: whether every mount below the tmpfs
// e[t]'s point is a cgroup one of the host's (no copy placed), on a
// directory of that tmpfs (stacked ones too), and one at least is v1.
static int v1_tree_alone(const struct v1_entry *e, int n, int t, const uint64_t *placed, int nplaced) {
	const char *dir = e[t].point;
	size_t len = strlen(dir);
	int v1 = 0;
	for (int j = 0; j < n; j++) {
		const char *p = e[j].point;
		if (!under(p, dir) || !strcmp(p, dir))
			continue;
		if ((e[j].kind != MOUNT_V1 && e[j].kind != MOUNT_V2) || placed_in(e[j].id, placed, nplaced) || strchr(p + len + 1, '/'))
			return 0;
		int on_tmpfs = e[j].parent == e[t].id;
		for (int k = 0; !on_tmpfs && k < n; k++)
			on_tmpfs = e[k].id == e[j].parent && !strcmp(e[k].point, p);
		if (!on_tmpfs)
			return 0;
		v1 |= e[j].kind == MOUNT_V1;
	}
	return v1;
}

// replace_v1_tree is replaceV1Tree.
static void replace_v1_tree(const struct v1_entry *e, int n, int t, char **own, int nown, uint64_t *placed, int *nplaced) {
	const char *dir = e[t].point;
	// The tmpfs alone, without what is mounted on it: its directories
	// are the mount points the Trial sees, empty. Copied first, so that
	// mountinfo lists it before the groups' copies mounted on it.
	int tmp = syscall(SYS_open_tree, AT_FDCWD, dir, OPEN_TREE_CLONE | O_CLOEXEC | AT_NO_AUTOMOUNT | AT_SYMLINK_NOFOLLOW);
	if (tmp < 0)
		mask_fail(errno, "copy the tmpfs on %s without the cgroup hierarchies mounted on it (%s)", dir, V1_WHY);
	int tree[V1_MAX], ntree = 0;
	const char *group[V1_MAX], *at[V1_MAX];
	for (int j = 0; j < n; j++) {
		const char *p = e[j].point;
		int seen = 0;
		for (int k = 0; k < j; k++)
			seen |= !strcmp(e[k].point, p);
		struct statfs st;
		// Only where a v1 hierarchy is on top: that is where the
		// Trial's group path leads.
		if (seen || !under(p, dir) || !strcmp(p, dir) || statfs(p, &st) < 0 || st.f_type != CGROUP_SUPER_MAGIC)
			continue;
		const char *name;
		int g = own_group_tree(p, own, nown, &name);
		if (g < 0)
			continue;
		if (*nplaced + ntree == V1_MAX)
			mask_fail(E2BIG, "hide the cgroup v1 hierarchy on %s (more than %d groups of the Trial's shown)", p, V1_MAX);
		tree[ntree] = g;
		group[ntree] = name;
		at[ntree++] = p;
	}
	// One detach for every hierarchy: each unmount waits for an RCU
	// grace period (docs/performance.md, "Trial start").
	if (umount2(dir, MNT_DETACH) < 0)
		mask_fail(errno, "detach the tmpfs on %s with the host's cgroup hierarchies on it (they show every Trial's groups and the host's)", dir);
	if (syscall(SYS_move_mount, tmp, "", AT_FDCWD, dir, MOVE_MOUNT_F_EMPTY_PATH) < 0)
		mask_fail(errno, "mount the copy of the tmpfs on %s again (its directories are the cgroup mount points the Trial sees)", dir);
	close(tmp);
	for (int i = 0; i < ntree; i++)
		placed[(*nplaced)++] = show_v1_group(tree[i], group[i], at[i]);
}

// hide_v1_tree is hideV1Tree: 1 when it replaced a tmpfs, -1 when the
// table has no cgroup v1 mount of the host's left, 0 otherwise.
static int hide_v1_tree(char **own, int nown, uint64_t *placed, int *nplaced) {
	char *b = read_mountinfo(), *s = b, *line;
	struct v1_entry *e = NULL;
	struct mount_line m;
	int n = 0, cap = 0, v1 = 0, acted = 0;
	while ((line = next_line(&s))) {
		if (n == cap && !(e = realloc(e, (cap = cap ? 2 * cap : 64) * sizeof *e)))
			mask_fail(ENOMEM, "hide the cgroup v1 hierarchies");
		char *end;
		e[n].id = strtoull(line, &end, 10);
		e[n].parent = strtoull(end, NULL, 10);
		split_line(line, &m);
		if (m.fields < 5)
			continue;
		e[n].kind = m.too_long ? MOUNT_LONG : !m.post ? MOUNT_OTHER : !strncmp(m.post, "cgroup ", 7) ? MOUNT_V1 : !strncmp(m.post, "cgroup2 ", 8) ? MOUNT_V2 : !strncmp(m.post, "tmpfs ", 6) ? MOUNT_TMPFS : MOUNT_OTHER;
		// One whose point is cut short may be a v1 one: the walk fails on it.
		v1 |= (e[n].kind == MOUNT_V1 && !placed_in(e[n].id, placed, *nplaced)) || e[n].kind == MOUNT_LONG;
		if (!(e[n].point = strdup(m.point)))
			mask_fail(ENOMEM, "hide the cgroup v1 hierarchies");
		n++;
	}
	for (int i = 0; v1 && !acted && i < n; i++) {
		if (e[i].kind != MOUNT_V1 || placed_in(e[i].id, placed, *nplaced))
			continue;
		int t = 0;
		while (t < n && e[t].id != e[i].parent)
			t++;
		if (t == n || e[t].kind != MOUNT_TMPFS || !strcmp(e[t].point, "/") || !v1_tree_alone(e, n, t, placed, *nplaced) ||
		    mount_id_at(AT_FDCWD, e[t].point, AT_SYMLINK_NOFOLLOW, e[t].point, V1_WHY) != e[t].id)
			continue;
		replace_v1_tree(e, n, t, own, nown, placed, nplaced);
		acted = 1;
	}
	for (int i = 0; i < n; i++)
		free(e[i].point);
	free(e);
	return acted ? 1 : v1 ? 0 : -1;
}

// hide_v1 is hideV1.
static void hide_v1(char **own, int nown) {
	uint64_t placed[V1_MAX];
	int nplaced = 0;
	for (int acted = 1, pass = 0; acted; pass++) {
		// Each pass uncovers what the last detached: a host has not this
		// many layers, so more means a walk that no longer ends.
		if (pass == V1_MAX)
			mask_fail(ELOOP, "hide the cgroup v1 hierarchies (the mount table still changed after %d passes over it)", V1_MAX);
		int tree = hide_v1_tree(own, nown, placed, &nplaced);
		if (tree < 0)
			return;
		if (tree > 0)
			continue;
		acted = 0;
		char *b = read_mountinfo(), *s = b, *line;
		struct mount_line m;
		char *done[V1_MAX];
		int ndone = 0;
		while ((line = next_line(&s))) {
			uint64_t id = strtoull(line, NULL, 10);
			split_line(line, &m);
			if (!m.post || m.fields < 5 || strncmp(m.post, "cgroup ", 7))
				continue;
			if (m.too_long)
				mask_fail(ENAMETOOLONG, "hide the cgroup v1 hierarchy on %s... (it shows every Trial's groups and the host's)", m.point);
			int skip = placed_in(id, placed, nplaced);
			for (int i = 0; i < ndone; i++)
				skip |= !strcmp(done[i], m.point);
			if (skip || !mount_on_top(id, m.point, AT_SYMLINK_NOFOLLOW, V1_WHY))
				continue;
			if (ndone == V1_MAX)
				mask_fail(E2BIG, "hide the cgroup v1 hierarchy on %s (more than %d cgroup v1 mount points)", m.point, ndone);
			if (!(done[ndone++] = strdup(m.point)))
				mask_fail(ENOMEM, "hide the cgroup v1 hierarchy on %s", m.point);
			acted = 1;
			uint64_t shown = hide_v1_mount(m.point, own, nown);
			if (shown && nplaced == V1_MAX)
				mask_fail(E2BIG, "hide the cgroup v1 hierarchy on %s (more than %d groups of the Trial's shown)", m.point, nplaced);
			if (shown)
				placed[nplaced++] = shown;
		}
		for (int i = 0; i < ndone; i++)
			free(done[i]);
	}
}

// A kind of mount drop_pass detaches: one of fstype whose device is not
// own and, where only is not 0, is only and whose point is beneath none
// of the Trial's own directories (real, their real paths).
struct mount_drop {
	const char *fstype;
	dev_t own, only;
	const char *held;
	char (*real)[PATH_MAX];
};

// mount_head reads a mountinfo line's head, "ID PARENT MAJOR:MINOR ...":
// its mount id, always, and its device; 0 where no device is there.
static int mount_head(const char *line, uint64_t *id, dev_t *dev) {
	char *e;
	*id = strtoull(line, &e, 10);
	strtoull(e, &e, 10);
	unsigned long maj = strtoul(e, &e, 10);
	if (*e != ':')
		return 0;
	*dev = makedev(maj, strtoul(e + 1, NULL, 10));
	return 1;
}

// drop_pass is dropPass: one walk of the mount table that detaches each
// mount of a kind in drops on top at its point; it says whether one was.
static int drop_pass(const struct mount_drop *drops, int ndrops) {
	int acted = 0;
	char *b = read_mountinfo(), *s = b, *line;
	struct mount_line m;
	while ((line = next_line(&s))) {
		uint64_t id;
		dev_t dev;
		if (!mount_head(line, &id, &dev))
			continue;
		split_line(line, &m);
		if (!m.post || m.fields < 5)
			continue;
		const struct mount_drop *d = NULL;
		for (int i = 0; !d && i < ndrops; i++) {
			size_t n = strlen(drops[i].fstype);
			if (!strncmp(m.post, drops[i].fstype, n) && m.post[n] == ' ' && dev != drops[i].own && (!drops[i].only || dev == drops[i].only))
				d = &drops[i];
		}
		if (!d)
			continue;
		if (m.too_long)
			mask_fail(ENAMETOOLONG, "detach the %s on %s... (%s)", d->fstype, m.point, d->held);
		int kept = 0;
		for (int i = 0; d->real && i < n_own_dirs; i++)
			kept |= d->real[i][0] && under(m.point, d->real[i]);
		char why[64];
		snprintf(why, sizeof why, "to detach the host's %s there", d->fstype);
		// Only a mount on top at its point: umount2 takes what is on
		// top, and one covered is out of reach until that goes.
		if (kept || !mount_on_top(id, m.point, AT_SYMLINK_NOFOLLOW, why))
			continue;
		if (umount2(m.point, MNT_DETACH) < 0)
			mask_fail(errno, "detach the %s on %s (%s)", d->fstype, m.point, d->held);
		acted = 1;
	}
	return acted;
}

// foreign is dropForeign's kind: fstype's mounts but the Trial's own on
// own_path.
static struct mount_drop foreign(const char *fstype, const char *own_path, int optional, const char *held) {
	struct stat own;
	if (stat(own_path, &own) < 0) {
		if (!optional || errno != ENOENT)
			mask_fail(errno, "find the Trial's own %s on %s (to tell the host's from it)", fstype, own_path);
		own.st_dev = 0; // no mount has device 0:0
	}
	return (struct mount_drop){.fstype = fstype, .own = own.st_dev, .held = held};
}

// host_shm_dev is hostShmDev.
static dev_t host_shm_dev(void) {
	char real[PATH_MAX];
	if (!realpath("/dev/shm", real))
		return 0; // none: nothing to detach
	uint64_t want = mount_id_at(AT_FDCWD, real, 0, real, "to detach the host's /dev/shm's other mounts");
	char *b = read_mountinfo(), *s = b, *line;
	struct mount_line m;
	dev_t dev = 0;
	while (want && (line = next_line(&s))) {
		uint64_t id;
		dev_t d;
		int head = mount_head(line, &id, &d);
		if (id != want)
			continue;
		split_line(line, &m);
		if (head && m.post && m.fields >= 5 && !m.too_long && !strncmp(m.post, "tmpfs ", 6) && m.root_len == 1 && m.root[0] == '/' && !strcmp(m.point, real))
			dev = d;
		break;
	}
	return dev;
}

#define AUTOFS_WHY "to keep the host's automount daemon from the Trial's lookups"
#define AUTOFS_MAX_KEPT 64

// cover_autofs is coverAutofs: the autofs mount id on point replaced by
// what was mounted beneath it, each at its place on a read-only tmpfs.
static void cover_autofs(const char *point, uint64_t id) {
	char *b = read_mountinfo(), *s = b, *line;
	struct mount_line m;
	char *rel[AUTOFS_MAX_KEPT];
	int tree[AUTOFS_MAX_KEPT], n = 0;
	while ((line = next_line(&s))) {
		char *e;
		strtoull(line, &e, 10);
		if (strtoull(e, NULL, 10) != id)
			continue;
		split_line(line, &m);
		if (m.fields < 5)
			continue;
		if (m.too_long)
			mask_fail(ENAMETOOLONG, "keep what is mounted on %s beneath the autofs on %s (%s)", m.point, point, AUTOFS_WHY);
		if (n == AUTOFS_MAX_KEPT)
			mask_fail(E2BIG, "keep what is mounted beneath the autofs on %s: more than %d mounts (%s)", point, n, AUTOFS_WHY);
		// A copy made before the autofs goes, through no automount.
		tree[n] = syscall(SYS_open_tree, AT_FDCWD, m.point, OPEN_TREE_CLONE | O_CLOEXEC | AT_RECURSIVE | AT_NO_AUTOMOUNT | AT_SYMLINK_NOFOLLOW);
		if (tree[n] < 0)
			mask_fail(errno, "copy what is mounted on %s beneath the autofs on %s (%s)", m.point, point, AUTOFS_WHY);
		if (!(rel[n] = strdup(m.point + strlen(point))))
			mask_fail(ENOMEM, "keep what is mounted on %s", m.point);
		n++;
	}
	if (umount2(point, MNT_DETACH) < 0)
		mask_fail(errno, "detach the autofs on %s (%s)", point, AUTOFS_WHY);
	if (!n)
		return;
	const unsigned long flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
	if (mount("tmpfs", point, "tmpfs", flags, "mode=0755,size=4k") < 0)
		mask_fail(errno, "mount a tmpfs on %s for what the autofs there had mounted (%s)", point, AUTOFS_WHY);
	for (int i = 0; i < n; i++) {
		char at[PATH_MAX * 2], failed[PATH_MAX + 8];
		snprintf(at, sizeof at, "%s%s", point, rel[i]);
		int err = mkdir_all(at, 0755, failed);
		if (err)
			mask_fail(err, "make %s for what was mounted there: %s", at, failed);
		if (syscall(SYS_move_mount, tree[i], "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH) < 0)
			mask_fail(errno, "mount again on %s what the autofs there had mounted (%s)", at, AUTOFS_WHY);
		close(tree[i]);
		free(rel[i]);
	}
	if (mount("", point, "", MS_REMOUNT | MS_RDONLY | flags, "mode=0755,size=4k") < 0)
		mask_fail(errno, "make the tmpfs on %s read-only", point);
}

#define REMOTE_WHY                                                                                                     \
	"every lookup, read and write beneath it is a request to a process or server outside the Trial, which sends its " \
	"names and data past trialnet's proxy"
#define REMOTE_MAX_PASSES 64
#define REMOTE_MAX_KEPT 64

// remote_type is remoteType: the length of the type at the start of post
// if it is trialnet_init_remote_fs's, else 0.
static size_t remote_type(const char *post) {
	size_t n = strcspn(post, " ");
	for (int i = 0; i < n_remote_fs; i++) {
		const char *r = trialnet_init_remote_fs[i];
		size_t rn = strlen(r);
		if (r[rn - 1] == '.' ? n > rn && !strncmp(post, r, rn) : rn == n && !strncmp(post, r, n))
			return n;
	}
	return 0;
}

// hide_remote_fs is hideRemoteFS.
static void hide_remote_fs(void) {
	char cwd[PATH_MAX];
	if (!getcwd(cwd, sizeof cwd) || cwd[0] != '/')
		strcpy(cwd, "/"); // unreachable from the Trial's root: nothing to keep
	// The devices of the file systems on the way, / last.
	dev_t kept[REMOTE_MAX_KEPT];
	int nkept = 0;
	for (char *slash = cwd + strlen(cwd);; slash = strrchr(cwd, '/'), *slash = 0) {
		struct stat st;
		const char *p = slash == cwd ? "/" : cwd;
		// Not found: under a mount of the Trial's own (its /tmp), out of its
		// view, so there is nothing to keep; the launch says why the command
		// cannot start there.
		int found = stat(p, &st) == 0;
		if (!found && errno != ENOENT && errno != ENOTDIR)
			mask_fail(errno, "look at %s, on the way to the working directory of the Trial's first command (to keep the file system holding it)", p);
		int seen = !found;
		for (int i = 0; found && i < nkept; i++)
			seen |= kept[i] == st.st_dev;
		if (!seen && nkept == REMOTE_MAX_KEPT)
			mask_fail(E2BIG, "keep the file systems on the way to the working directory of the Trial's first command: more than %d", nkept);
		if (!seen)
			kept[nkept++] = st.st_dev;
		if (slash == cwd)
			break;
	}
	for (int pass = 0, acted = 1; acted; pass++) {
		if (pass == REMOTE_MAX_PASSES)
			mask_fail(ELOOP, "detach the host's FUSE and network file-system mounts: still one after %d passes (%s)", pass, REMOTE_WHY);
		acted = 0;
		char *b = read_mountinfo(), *s = b, *line;
		struct mount_line m;
		while ((line = next_line(&s))) {
			uint64_t id;
			dev_t dev;
			if (!mount_head(line, &id, &dev))
				continue;
			split_line(line, &m);
			size_t n = m.post && m.fields >= 5 ? remote_type(m.post) : 0;
			int keep = 0;
			for (int i = 0; i < nkept; i++)
				keep |= kept[i] == dev;
			if (!n || keep)
				continue; // not served outside, or the Trial's root or holding its work
			if (m.too_long)
				mask_fail(ENAMETOOLONG, "detach the %.*s mount on %s... (%s)", (int)n, m.post, m.point, REMOTE_WHY);
			// Cached attributes: a server that does not answer must not
			// hold up every Trial's start (CIFS asks its server otherwise;
			// FUSE and NFS ask nothing for a mount id alone).
			if (!mount_on_top(id, m.point, AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC, REMOTE_WHY))
				continue;
			if (umount2(m.point, MNT_DETACH) < 0)
				mask_fail(errno, "detach the %.*s mount on %s (%s)", (int)n, m.post, m.point, REMOTE_WHY);
			acted = 1;
		}
	}
	// Not left on a host mount that the Trial's own may cover.
	if (chdir("/") < 0)
		mask_fail(errno, "change the init's working directory to / (it was the first command's, to keep the mounts holding it)");
}

// hide_autofs is hideAutofs.
static void hide_autofs(void) {
	for (int pass = 0, acted = 1; acted; pass++) {
		if (pass == AUTOFS_MAX_KEPT)
			mask_fail(ELOOP, "detach the host's autofs mounts: still one after %d passes (%s)", pass, AUTOFS_WHY);
		acted = 0;
		char *b = read_mountinfo(), *s = b, *line;
		struct mount_line m;
		while (!acted && (line = next_line(&s))) {
			uint64_t id = strtoull(line, NULL, 10);
			split_line(line, &m);
			if (!m.post || m.fields < 5 || strncmp(m.post, "autofs ", 7))
				continue;
			if (m.too_long)
				mask_fail(ENAMETOOLONG, "detach the autofs on %s... (%s)", m.point, AUTOFS_WHY);
			if (!mount_on_top(id, m.point, AT_SYMLINK_NOFOLLOW, AUTOFS_WHY))
				continue;
			char point[PATH_MAX];
			snprintf(point, sizeof point, "%s", m.point);
			cover_autofs(point, id); // reads the table again: this one is done with
			acted = 1;
		}
	}
}

// vcs, vcsa, vcsu: a console's screen, which login may give its user too.
#define VCS_MAJOR 7
#define TTYS_WHY "a terminal login gave the Trial's uid, the operator's among them"

// tty_majors is ttyMajors: the majors of the kernel's terminal drivers
// but ptys (/proc/tty/drivers), and the consoles' screens', as a bit set.
static void tty_majors(uint64_t set[64]) {
	memset(set, 0, 64 * sizeof *set);
	set[0] |= 1ULL << VCS_MAJOR;
	int fd = open("/proc/tty/drivers", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		mask_fail(errno, "read /proc/tty/drivers (to find the host's terminals)");
	char b[8192];
	size_t len = 0;
	ssize_t r;
	while (len < sizeof b - 1 && (r = read(fd, b + len, sizeof b - 1 - len)) != 0) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			mask_fail(errno, "read /proc/tty/drivers (to find the host's terminals)");
		len += r;
	}
	close(fd);
	b[len] = 0;
	char *s = b, *line;
	while ((line = next_line(&s))) {
		// NAME NODE MAJOR MINORS TYPE
		char *f[5];
		int n = 0;
		for (char *save, *t = strtok_r(line, " ", &save); t && n < 5; t = strtok_r(NULL, " ", &save))
			f[n++] = t;
		if (n < 5 || !strncmp(f[4], "pty:", 4))
			continue;
		unsigned long major = strtoul(f[2], NULL, 10);
		if (major < 64 * 64)
			set[major / 64] |= 1ULL << (major % 64);
	}
}

// covered_misc is coveredMisc: misc devices (major 10) covered whoever
// owns them.
static const struct {
	unsigned int minor;
	const char *name, *why;
} covered_misc[] = {
	{241, "vhost-vsock device", "any process that opens it talks to the host's vsock services as a VM, past every network layer"},
	{223, "uinput device", "through it a process types into the host's display and consoles"},
	{239, "uhid device", "through it a process types into the host's display and consoles"},
};

// cover_devices is coverDevices.
static void cover_devices(const char *dir, const uint64_t majors[64]) {
	DIR *d = opendir(dir);
	if (!d)
		mask_fail(errno, "list %s (to cover the host's terminals there)", dir);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_type != DT_CHR)
			continue;
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISCHR(st.st_mode))
			continue;
		unsigned int major = major(st.st_rdev);
		const char *what = NULL, *why = NULL;
		for (size_t i = 0; i < sizeof covered_misc / sizeof covered_misc[0]; i++)
			if (major == 10 && minor(st.st_rdev) == covered_misc[i].minor) {
				what = covered_misc[i].name;
				why = covered_misc[i].why;
			}
		if (!what && st.st_uid && major < 64 * 64 && (majors[major / 64] & (1ULL << (major % 64)))) {
			what = "terminal";
			why = TTYS_WHY;
		}
		if (!what)
			continue;
		char path[PATH_MAX * 2];
		snprintf(path, sizeof path, "%s/%s", strcmp(dir, "/") ? dir : "", e->d_name);
		if (mount("/dev/null", path, "", MS_BIND, "") < 0)
			mask_fail(errno, "cover the host's %s %s with /dev/null (%s)", what, path, why);
	}
	closedir(d);
}

// hide_host_ttys is hideHostTtys.
static void hide_host_ttys(void) {
	uint64_t majors[64];
	tty_majors(majors);
	char *b = read_mountinfo(), *s = b, *line;
	struct mount_line m;
	int dev_done = 0;
	while ((line = next_line(&s))) {
		uint64_t id = strtoull(line, NULL, 10);
		split_line(line, &m);
		if (!m.post || m.fields < 5 || strncmp(m.post, "devtmpfs ", 9))
			continue;
		if (m.too_long)
			mask_fail(ENAMETOOLONG, "cover the host's terminals in %s... (%s)", m.point, TTYS_WHY);
		if (!mount_on_top(id, m.point, AT_SYMLINK_NOFOLLOW, "to cover the host's terminals there"))
			continue;
		cover_devices(m.point, majors);
		dev_done |= !strcmp(m.point, "/dev");
	}
	// See hideHostTtys: /dev need not be a devtmpfs.
	if (!dev_done)
		cover_devices("/dev", majors);
}

// drop_host_mounts is dropHostMounts.
static void drop_host_mounts(dev_t host_shm) {
	char real[n_own_dirs][PATH_MAX];
	for (int i = 0; i < n_own_dirs; i++)
		if (!host_shm || !realpath(trialnet_init_own_dirs[i].dir, real[i]))
			real[i][0] = 0;
	for (int acted = 1; acted;) {
		struct mount_drop drops[6] = {
		    foreign("devpts", "/dev/pts", 0, DEVPTS_HELD),
		    foreign("proc", "/proc", 0, PROC_HELD),
		    foreign("mqueue", "/dev/mqueue", 1, MQUEUE_HELD),
		    {.fstype = "hugetlbfs", .held = HUGETLBFS_HELD},
		    {.fstype = "cgroup2", .held = CGROUP2_HELD},
		    {.fstype = "tmpfs", .only = host_shm, .held = SHM_HELD, .real = real},
		};
		acted = drop_pass(drops, host_shm ? 6 : 5);
	}
}

// mask_host is maskHost.
static void mask_host(int nested, char **hide, int nhide, char **v1, int nv1, dev_t host_shm) {
	char cg[PATH_MAX];
	cgroup2_mount(cg);
	static const char *const procs[] = {"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"};
	for (size_t i = 0; !nested && i < sizeof procs / sizeof procs[0]; i++) {
		const char *p = procs[i];
		struct stat st;
		if (lstat(p, &st) < 0)
			continue; // not on this kernel: nothing to protect
		if (mount(p, p, "", MS_BIND, "") < 0)
			mask_fail(errno, "bind %s (to make it read-only)", p);
		if (mount("", p, "", MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "") < 0)
			mask_fail(errno, "make %s read-only (a Trial must not change the host's kernel settings)", p);
	}
	// Before /sys is made read-only: a v1 mount detached may uncover
	// mounts below /sys that were out of reach (hide_v1).
	hide_v1(v1, nv1);
	drop_host_mounts(host_shm);
	// Before the autofs mounts: a direct one is reached once what it
	// mounted on its own point is gone.
	hide_remote_fs();
	hide_autofs();
	hide_host_ttys();
	read_only_sys();
	if (mount("cgroup2", cg, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, "") < 0)
		mask_fail(errno, "mount the Trial's own cgroup2 on %s (the host's shows every Trial)", cg);
	if (mount("", cg, "", MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "") < 0)
		mask_fail(errno, "make the Trial's cgroup2 on %s read-only (a Trial must not change its own limits)", cg);
	for (int i = 0; i < nhide; i++) {
		const char *d = hide[i];
		struct stat st;
		if (stat(d, &st) < 0 || !S_ISDIR(st.st_mode))
			continue; // nothing there to hide
		const unsigned long flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
		if (mount("tmpfs", d, "tmpfs", flags, "mode=0755,size=4k") < 0)
			mask_fail(errno, "hide %s (it names other Trials and holds trialnet's sockets)", d);
		if (!strcmp(d, run_dir))
			mount_views(d);
		// Read-only: a uid-0 Trial owns the tmpfs's root.
		if (mount("", d, "", MS_REMOUNT | MS_RDONLY | flags, "mode=0755,size=4k") < 0)
			mask_fail(errno, "make %s read-only (a uid-0 Trial could put a socket where a client looks for trialnet's)", d);
	}
}

// setup_init is setupInit.
static void setup_init(int nested, int transparent, const char *ns_path, char **hide, int nhide, char **v1, int nv1, char **keep, int nkeep) {
	// Private: nothing made here leaks out, and nothing mounted on the
	// host later leaks in.
	if (mount("", "/", "", MS_REC | MS_PRIVATE, "") < 0)
		init_fail(errno, NULL, "make mounts private");
	drop_ns_mounts(ns_path);
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "") < 0)
		init_fail(errno, NULL, "mount the Trial's /proc");
	char data[128];
	snprintf(data, sizeof data, "newinstance,ptmxmode=0666,mode=0620,max=%d", trialnet_init_max_ptys);
	if (mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, data) < 0)
		init_fail(errno, NULL, "mount the Trial's /dev/pts");
	if (mount("/dev/pts/ptmx", "/dev/ptmx", "", MS_BIND, "") < 0)
		init_fail(errno, NULL, "bind the Trial's /dev/ptmx");
	struct stat st;
	if (stat("/dev/mqueue", &st) == 0 && S_ISDIR(st.st_mode) &&
	    mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, "") < 0)
		init_fail(errno, NULL, "mount the Trial's /dev/mqueue");
	dev_t host_shm = host_shm_dev(); // before the Trial's own covers it
	mount_own_dirs(keep, nkeep);
	cover_shared_dirs();
	if (unshare(CLONE_NEWCGROUP) < 0)
		init_fail(errno, NULL, "unshare cgroup namespace");
	mountinfo_forget(); // cgroup mounts' roots are printed from the new one
	char failed[PATH_MAX + 8];
	int e = mkdir_all(run_dir, 0755, failed);
	if (e)
		init_fail(e, NULL, "make %s, where the Trial's own directories are viewed: %s", run_dir, failed);
	if (transparent) {
		int covered = 0;
		for (int i = 0; i < nhide; i++)
			covered |= !strcmp(hide[i], run_dir);
		mount_resolv_conf(covered);
	}
	mask_host(nested, hide, nhide, v1, nv1, host_shm);
}

// drop_capabilities is exec.go's dropCapabilities.
static void drop_capabilities(void) {
	char buf[16] = {0};
	errno = 0; // a short read leaves it as it was
	int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || read(fd, buf, sizeof buf - 1) <= 0)
		init_fail(errno ? errno : EIO, NULL, "read cap_last_cap");
	close(fd);
	int last = trialnet_parse_last_cap(buf);
	if (last < 0)
		init_fail(EINVAL, NULL, "read cap_last_cap");
	for (int c = 0; c <= last; c++)
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0)
			init_fail(errno, NULL, "drop capability %d from the bounding set", c);
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
		init_fail(errno, NULL, "clear ambient capabilities");
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct data[2] = {0};
	if (syscall(SYS_capset, &hdr, data) < 0)
		init_fail(errno, NULL, "clear capabilities");
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		init_fail(errno, NULL, "set no_new_privs");
}

// install_filter is installSeccomp(false), from the filter the launcher
// assembled (seccompProgram): the commands' own.
static void install_filter(void) {
	static struct sock_filter prog[4096];
	// Sealed (seccompMemfd): what is read is what the launcher wrote, and
	// stays so between the size and the read.
	const int seals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
	int got = fcntl(fd_init_filter, F_GET_SEALS);
	if (got < 0 || (got & seals) != seals)
		init_fail(got < 0 ? errno : EPERM, NULL, "the seccomp filter on fd 4 is not a sealed memfd");
	struct stat st;
	if (fstat(fd_init_filter, &st) < 0 || st.st_size <= 0 || st.st_size % sizeof *prog || st.st_size > (off_t)sizeof prog)
		init_fail(0, NULL, "no seccomp filter from the launcher on fd 4");
	errno = 0;
	if (pread(fd_init_filter, prog, st.st_size, 0) != st.st_size)
		init_fail(errno ? errno : EIO, NULL, "read the seccomp filter");
	struct sock_fprog fprog = {.len = st.st_size / sizeof *prog, .filter = prog};
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) < 0)
		init_fail(errno, NULL, "install seccomp filter");
}

void trialnet_init_setup(int argc, char **argv) {
	// initArgs: MODE DNS NETNS HIDE... --v1 V1... -- KEEP...
	int nested = 0, transparent = 0;
	const char *ns_path = "";
	char **args = argv + 1;
	int n = argc - 1;
	if (n > 2) {
		nested = !strcmp(args[0], "nested");
		transparent = !strcmp(args[1], "stub-dns");
		ns_path = args[2];
		args += 3, n -= 3;
	}
	int nfront = 0;
	while (nfront < n && strcmp(args[nfront], "--"))
		nfront++;
	char **keep = nfront < n ? args + nfront + 1 : args + n;
	int nkeep = nfront < n ? n - nfront - 1 : 0;
	int nhide = 0;
	while (nhide < nfront && strcmp(args[nhide], "--v1"))
		nhide++;
	char **v1 = nhide < nfront ? args + nhide + 1 : args + nfront;
	int nv1 = nhide < nfront ? nfront - nhide - 1 : 0;
	setup_init(nested, transparent, ns_path, args, nhide, v1, nv1, keep, nkeep);
	errno = 0;
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "1000", 4) != 4)
		init_fail(errno ? errno : EIO, NULL, "make the Trial the OOM killer's first choice");
	close(fd);
	drop_capabilities();
	install_filter();
	// As runInit: ready once the reaper's exec has begun (the pipe's end
	// comes with it), and nothing the launcher left open lives on in it.
	if (fcntl(fd_ready, F_SETFD, FD_CLOEXEC) < 0)
		init_fail(errno, NULL, "ready pipe");
	if (syscall(SYS_close_range, 4, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
		init_fail(errno, NULL, "close inherited descriptors");
	errno = 0;
	if (write(fd_ready, "", 1) != 1)
		init_fail(errno ? errno : EIO, NULL, "ready pipe");
	char *reaper[] = {"trialnet-init", NULL}, *env[] = {NULL};
	execve("/proc/self/exe", reaper, env);
	int err = errno;
	char msg[32];
	int m = snprintf(msg, sizeof msg, "trialnet-init") + 1;
	m += snprintf(msg + m, sizeof msg - m, "%d", err);
	(void)!write(fd_ready, msg, m);
	_exit(1);
}

// crash_name is sigabbrev_np (glibc's, not musl's) for the signals
// crashed handles.
static const char *crash_name(int sig) {
	switch (sig) {
	case SIGABRT:
		return "ABRT";
	case SIGSEGV:
		return "SEGV";
	case SIGBUS:
		return "BUS";
	case SIGILL:
		return "ILL";
	case SIGFPE:
		return "FPE";
	case SIGSYS:
		return "SYS";
	}
	return NULL;
}

// crashed says which signal ended the reaper, on its stderr, which only
// the launcher that started the init reads (initProc.lastWords), and
// exits: a crash of PID 1 ends the Trial, and the launch says why.
static void crashed(int sig) {
	char msg[64] = "trialnet-init: crashed: signal SIG";
	const char *name = crash_name(sig);
	size_t n = strlen(msg);
	for (; name && *name && n < sizeof msg - 2; name++)
		msg[n++] = *name;
	msg[n++] = '\n';
	(void)!write(2, msg, n);
	// Not raise: the kernel drops a signal PID 1 sends itself without a
	// handler.
	_exit(128 + sig);
}

// trialnet_init_reap is runReaper: the Trial's PID 1 once set up, with no capability,
// under the filter (both survive the exec). Every other signal it could
// catch is ignored, so nothing inside stops it, and SIGCHLD ignored makes
// the kernel reap each orphan as it exits.
void trialnet_init_reap(void) {
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
