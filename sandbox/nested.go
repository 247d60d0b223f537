//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// A nested Trial (Spec.Nested) lets its commands make user namespaces, so
// that they can run sandboxes of their own: bwrap, as the seed runs every
// Harness, and Harnesses that sandbox their tool calls. Inside a user
// namespace a process holds capabilities over namespaces it made: it can
// mount, and make network, PID and mount namespaces. What changes, and
// what keeps each guarantee:
//
//   - The seccomp filter allows CLONE_NEWUSER; everything else it refuses
//     stays refused (setns, socket families and protocols, io_uring, bpf,
//     perf_event_open, userfaultfd, the key service, TIOCSTI).
//   - A mount could put a host socket at a path the cgroup hooks allow, so
//     nesting needs the BPF LSM layer, which judges the socket a path leads
//     to, whatever mounts are on the way (unix_peer_verdict), and refuses
//     every task outside a Trial a socket the Trial made (no way in).
//   - Landlock refuses mount to a task whose domain handles any filesystem
//     access, so a nested Trial's commands keep only its scopes (ptrace and
//     signals stay inside the domain); where sockets may be made is the LSM
//     layer's concern there (see above).
//   - A new /proc in a user namespace is refused while the Trial's /proc
//     has mounts over its directories, so a nested Trial's /proc is not
//     masked (/proc/sys and the rest stay root's, 0644 or tighter), and no
//     command of it runs as uid 0, which owns those files.
//   - The network namespaces it makes hold nothing but their own loopback;
//     the cgroup hooks give sockets there the Trial's policy, and any packet
//     through another device is dropped and counted as direct egress.
//   - Mounts copied into its mount namespaces are locked by the kernel: the
//     hidden directories stay hidden and read-only mounts read-only.
//   - A devpts instance it mounts (bwrap --dev) has no max= of ours: the
//     LSM layer holds the Trial's tasks to MaxPtys pty masters from any
//     instance, so the host's pool stays for others.

// ErrNestingUnavailable is wrapped by Create when a nested Trial cannot be
// made on this host.
var ErrNestingUnavailable = errors.New("nested sandboxes are not available here")

// canNest reports whether this host can run nested Trials, and why not.
func (h *Host) canNest() error {
	if !h.BPF.LSM() {
		return fmt.Errorf("%w: they need the BPF LSM layer (%v), which judges the socket a unix path leads to whatever a user namespace mounts over it; run without nesting, or on a kernel with bpf in its active LSM list", ErrNestingUnavailable, h.BPF.LSMError())
	}
	return UserNamespacesAllowed()
}

// UserNamespacesAllowed reads the sysctls that let an unprivileged process
// make a user namespace.
func UserNamespacesAllowed() error {
	for _, s := range []struct {
		file string
		bad  func(int) bool
		why  string
	}{
		{"/proc/sys/user/max_user_namespaces", func(n int) bool { return n == 0 }, "is 0"},
		{"/proc/sys/kernel/unprivileged_userns_clone", func(n int) bool { return n == 0 }, "is 0"},
		{"/proc/sys/kernel/apparmor_restrict_unprivileged_userns", func(n int) bool { return n != 0 }, "is set (AppArmor refuses user namespaces to unconfined programs)"},
	} {
		b, err := os.ReadFile(s.file)
		if errors.Is(err, os.ErrNotExist) {
			continue // not this kernel's knob
		}
		if err != nil {
			return fmt.Errorf("%w: read %s: %v", ErrNestingUnavailable, s.file, err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrNestingUnavailable, s.file, err)
		}
		if s.bad(n) {
			return fmt.Errorf("%w: %s %s, so no unprivileged process may make a user namespace; change it, or run without nesting", ErrNestingUnavailable, s.file, s.why)
		}
	}
	return nil
}
