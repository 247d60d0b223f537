//go:build linux

package sandbox

import (
	"encoding/binary"
	"runtime"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestSeccompProgram runs the filter in a classic-BPF interpreter for the
// calls a kernel test cannot make without side effects: a protocol the
// kernel would load a module for (the module would load on the test
// host) has to be refused before the kernel sees it.
// A nested Trial's filter differs in one thing: CLONE_NEWUSER.
func TestSeccompProgram(t *testing.T) {
	for _, nested := range []bool{false, true} {
		t.Run(map[bool]string{false: "trial", true: "nested"}[nested], func(t *testing.T) { testSeccomp(t, nested) })
	}
}

func testSeccomp(t *testing.T, nested bool) {
	raw, err := seccompProgram(nested)
	if err != nil {
		t.Fatal(err)
	}
	prog, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("the filter has instructions the interpreter cannot decode")
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	arch, err := auditArch()
	if err != nil {
		t.Fatal(err)
	}
	// run judges one call whose arguments' high halves are 0.
	run := func(nr uint32, args ...uint32) uint32 {
		return run64(vm, t, arch, nr, widen(args)...)
	}
	protoRefused := retErrno | uint32(unix.EPROTONOSUPPORT)
	for _, c := range []struct {
		name             string
		family, typ, pro uint32
		want             uint32
	}{
		{"tcp", unix.AF_INET, unix.SOCK_STREAM, 0, retAllow},
		{"tcp6 by number", unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_TCP, retAllow},
		{"udp by number", unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_UDP, retAllow},
		{"ping6", unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_ICMPV6, retAllow},
		{"unix, any protocol", unix.AF_UNIX, unix.SOCK_STREAM, 7, retAllow},
		{"route netlink", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE, retAllow},
		{"sctp", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP, protoRefused},
		{"sctp6 seqpacket", unix.AF_INET6, unix.SOCK_SEQPACKET, unix.IPPROTO_SCTP, protoRefused},
		{"dccp", unix.AF_INET, unix.SOCK_DCCP, unix.IPPROTO_DCCP, protoRefused},
		{"udplite", unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_UDPLITE, protoRefused},
		{"l2tp", unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_L2TP, protoRefused},
		{"mptcp", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP, protoRefused},
		{"netlink crypto", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_CRYPTO, protoRefused},
		{"netlink netfilter", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER, protoRefused},
		{"netlink rdma", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_RDMA, protoRefused},
		{"vsock", unix.AF_VSOCK, unix.SOCK_STREAM, 0, retErrno | uint32(unix.EAFNOSUPPORT)},
		// The kernel makes these as AF_PACKET (inet6 has no such type).
		{"packet through inet's SOCK_PACKET", unix.AF_INET, unix.SOCK_PACKET, 0, retErrno | uint32(unix.EAFNOSUPPORT)},
		{"SOCK_PACKET with flags", unix.AF_INET, unix.SOCK_PACKET | unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK, 0, retErrno | uint32(unix.EAFNOSUPPORT)},
		{"SOCK_PACKET of inet6", unix.AF_INET6, unix.SOCK_PACKET, 0, retErrno | uint32(unix.EAFNOSUPPORT)},
		{"tcp with flags", unix.AF_INET, unix.SOCK_STREAM | unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK, 0, retAllow},
	} {
		for _, call := range []uint32{unix.SYS_SOCKET, unix.SYS_SOCKETPAIR} {
			if got := run(call, c.family, c.typ, c.pro); got != c.want {
				t.Errorf("%s (syscall %d): filter returns %#x, want %#x", c.name, call, got, c.want)
			}
		}
	}
	for _, nr := range refusedCalls {
		if got := run(nr); got != retErrno|uint32(unix.ENOSYS) {
			t.Errorf("syscall %d: filter returns %#x, want ENOSYS", nr, got)
		}
	}
	// Named, not only listed: a pidfd of a host process reaches the Trial
	// without a pid, and without Landlock nothing else refuses its fds.
	if got := run(unix.SYS_PIDFD_GETFD, 3, 3, 0); got != retErrno|uint32(unix.ENOSYS) {
		t.Errorf("pidfd_getfd: filter returns %#x, want ENOSYS", got)
	}
	for _, nr := range []uint32{unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER} {
		if got := run(nr, 3); got != retErrno|uint32(unix.ENOSYS) {
			t.Errorf("io_uring syscall %d: filter returns %#x, want ENOSYS (a ring handed in works as its maker)", nr, got)
		}
	}
	// Every foreign ABI: i386's socketcall(2) (102) takes the family in
	// memory, where no rule sees it, and its socket (359) would be judged
	// by numbers of another table. And x32, whose socket is 41 with
	// __X32_SYSCALL_BIT on the native arch.
	foreign := map[string]uint32{"amd64": unix.AUDIT_ARCH_I386, "arm64": unix.AUDIT_ARCH_ARM}[runtime.GOARCH]
	for _, nr := range []uint32{102, 359, unix.SYS_GETPID} {
		if got := run64(vm, t, foreign, nr, 1, 0x7ffd0000); got != retErrno|uint32(unix.ENOSYS) {
			t.Errorf("syscall %d of audit arch %#x: filter returns %#x, want ENOSYS", nr, foreign, got)
		}
	}
	if runtime.GOARCH == "amd64" {
		for _, nr := range []uint32{unix.SYS_SOCKET, unix.SYS_GETPID} {
			if got := run(x32Bit|nr, unix.AF_PACKET, unix.SOCK_RAW, 0); got != retErrno|uint32(unix.ENOSYS) {
				t.Errorf("x32 syscall %d: filter returns %#x, want ENOSYS", nr, got)
			}
		}
	}
	if got := run(unix.SYS_GETPID); got != retAllow {
		t.Errorf("getpid: filter returns %#x, want allow", got)
	}
	for _, c := range []struct {
		level, opt uint32
		want       uint32
	}{
		{unix.SOL_IP, 64, retErrno | uint32(unix.EPERM)},   // IPT_SO_SET_REPLACE
		{unix.SOL_IP, 96, retErrno | uint32(unix.EPERM)},   // ARPT_SO_SET_REPLACE
		{unix.SOL_IP, 128, retErrno | uint32(unix.EPERM)},  // EBT_SO_SET_ENTRIES
		{unix.SOL_IP, 1153, retErrno | uint32(unix.EPERM)}, // IP_VS_SO_SET_ADD
		{unix.SOL_IPV6, 64, retErrno | uint32(unix.EPERM)}, // IP6T_SO_SET_REPLACE
		{unix.SOL_IPV6, unix.IPV6_RTHDR, retErrno | uint32(unix.EPERM)},
		{unix.SOL_IPV6, unix.IPV6_2292PKTOPTIONS, retErrno | uint32(unix.EPERM)},
		{unix.SOL_IPV6, unix.IPV6_2292RTHDR, retAllow},    // 5: a receive flag
		{unix.SOL_IPV6, unix.IPV6_RTHDRDSTOPTS, retAllow}, // 55, beside 57: CAP_NET_RAW's
		{unix.SOL_IPV6, unix.IPV6_TCLASS, retAllow},
		{unix.SOL_IPV6, unix.IPV6_RECVTCLASS, retAllow},
		{unix.SOL_IP, 1167, retErrno | uint32(unix.EPERM)}, // IP_VS_SO_SET_ZERO
		{unix.SOL_IP, unix.IP_TOS, retAllow},
		{unix.SOL_IP, unix.IP_LOCAL_PORT_RANGE, retAllow},
		{unix.SOL_IP, 68, retAllow},
		{unix.SOL_IPV6, unix.IPV6_V6ONLY, retAllow},
		{unix.SOL_IPV6, unix.IPV6_TRANSPARENT, retAllow},
		{unix.SOL_TCP, 64, retAllow},
		{unix.SOL_TCP, 37, retAllow},                      // TCP_TX_DELAY
		{unix.SOL_TCP, 38, retErrno | uint32(unix.EPERM)}, // TCP_AO_ADD_KEY
		{unix.SOL_TCP, 42, retErrno | uint32(unix.EPERM)}, // TCP_AO_REPAIR
		{unix.SOL_TCP, unix.TCP_MD5SIG, retAllow},
		{unix.SOL_TCP, unix.TCP_NODELAY, retAllow},
		{unix.SOL_SOCKET, unix.SO_REUSEADDR, retAllow},
	} {
		if got := run(unix.SYS_SETSOCKOPT, 3, c.level, c.opt); got != c.want {
			t.Errorf("setsockopt(level %d, option %d): filter returns %#x, want %#x", c.level, c.opt, got, c.want)
		}
	}
	for req, want := range map[uint32]uint32{
		unix.SIOCADDRT: retErrno | uint32(unix.EPERM), unix.SIOCSIFFLAGS: retErrno | uint32(unix.EPERM),
		unix.SIOCBRADDBR: retErrno | uint32(unix.EPERM), unix.SIOCSIFVLAN: retErrno | uint32(unix.EPERM),
		unix.SIOCDEVPRIVATE + 1: retErrno | uint32(unix.EPERM), unix.TUNSETIFF: retErrno | uint32(unix.EPERM),
		unix.SIOCSIFNAME: retErrno | uint32(unix.EPERM), unix.SIOCETHTOOL: retErrno | uint32(unix.EOPNOTSUPP),
		unix.SIOCGIFFLAGS: retAllow, unix.SIOCGIFINDEX: retAllow, unix.SIOCGIFCONF: retAllow,
		unix.SIOCGSTAMP: retAllow, unix.SIOCSPGRP: retAllow, unix.TIOCGWINSZ: retAllow,
	} {
		if got := run(unix.SYS_IOCTL, 3, req); got != want {
			t.Errorf("ioctl %#x: filter returns %#x, want %#x", req, got, want)
		}
	}
	// Huge pages from the host's pool are refused as an empty pool
	// refuses them; normal pages and the other flags pass.
	enomem := retErrno | uint32(unix.ENOMEM)
	const mapHuge2MB = 21 << 26 // MAP_HUGE_2MB
	for _, c := range []struct {
		name string
		nr   uint32
		args []uint32
		want uint32
	}{
		{"mmap MAP_HUGETLB", unix.SYS_MMAP, []uint32{0, 1 << 21, unix.PROT_READ, unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_HUGETLB}, enomem},
		{"mmap MAP_HUGETLB|MAP_HUGE_2MB", unix.SYS_MMAP, []uint32{0, 1 << 21, unix.PROT_READ, unix.MAP_SHARED | unix.MAP_ANONYMOUS | unix.MAP_HUGETLB | mapHuge2MB}, enomem},
		{"mmap anonymous", unix.SYS_MMAP, []uint32{0, 1 << 21, unix.PROT_READ, unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_NORESERVE}, retAllow},
		{"shmget SHM_HUGETLB", unix.SYS_SHMGET, []uint32{0, 1 << 21, shmHugetlb | unix.IPC_CREAT | 0o600}, enomem},
		{"shmget", unix.SYS_SHMGET, []uint32{0, 1 << 21, unix.IPC_CREAT | 0o600}, retAllow},
		{"memfd_create MFD_HUGETLB", unix.SYS_MEMFD_CREATE, []uint32{0x1000, unix.MFD_CLOEXEC | unix.MFD_HUGETLB}, enomem},
		{"memfd_create", unix.SYS_MEMFD_CREATE, []uint32{0x1000, unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING}, retAllow},
	} {
		if got := run(c.nr, c.args...); got != c.want {
			t.Errorf("%s: filter returns %#x, want %#x", c.name, got, c.want)
		}
	}
	userns := uint32(retErrno | uint32(unix.EPERM))
	if nested {
		userns = retAllow
	}
	for _, nr := range []uint32{unix.SYS_UNSHARE, unix.SYS_CLONE} {
		if got := run(nr, unix.CLONE_NEWUSER|unix.CLONE_NEWNS); got != userns {
			t.Errorf("syscall %d with CLONE_NEWUSER: filter returns %#x, want %#x", nr, got, userns)
		}
		if got := run(nr, unix.CLONE_NEWNS); got != retAllow {
			t.Errorf("syscall %d without CLONE_NEWUSER: filter returns %#x, want allow", nr, got)
		}
	}
	for nr, want := range map[uint32]uint32{unix.SYS_SETNS: retErrno | uint32(unix.EPERM), unix.SYS_CLONE3: retErrno | uint32(unix.ENOSYS)} {
		if got := run(nr); got != want {
			t.Errorf("syscall %d: filter returns %#x, want %#x whether nested or not", nr, got, want)
		}
	}
	// The core size limit is kept: a change of it "succeeds" unmade
	// (retErrno, errno 0), reads and other limits pass.
	const ptr = 0x1000
	for _, c := range []struct {
		name string
		nr   uint32
		args []uint32
		want uint32
	}{
		{"setrlimit core", unix.SYS_SETRLIMIT, []uint32{unix.RLIMIT_CORE, ptr}, retErrno},
		{"setrlimit nofile", unix.SYS_SETRLIMIT, []uint32{unix.RLIMIT_NOFILE, ptr}, retAllow},
		{"prlimit64 core, set", unix.SYS_PRLIMIT64, []uint32{0, unix.RLIMIT_CORE, ptr, 0}, retErrno},
		{"prlimit64 core of another, set", unix.SYS_PRLIMIT64, []uint32{7, unix.RLIMIT_CORE, ptr, 0}, retErrno},
		{"prlimit64 core, set and read", unix.SYS_PRLIMIT64, []uint32{0, unix.RLIMIT_CORE, ptr, ptr}, retErrno | uint32(unix.EPERM)},
		{"prlimit64 core, read", unix.SYS_PRLIMIT64, []uint32{0, unix.RLIMIT_CORE, 0, ptr}, retAllow},
		{"prlimit64 nofile, set", unix.SYS_PRLIMIT64, []uint32{0, unix.RLIMIT_NOFILE, ptr, ptr}, retAllow},
	} {
		if got := run(c.nr, c.args...); got != c.want {
			t.Errorf("%s: filter returns %#x, want %#x", c.name, got, c.want)
		}
	}
	// A pointer is 64 bits: one whose low half is 0 (memory mapped at
	// 0x7f00_0000_0000) is no NULL, for new_limit nor old_limit.
	const high = 0x7f00_0000_0000
	for _, c := range []struct {
		name string
		args []uint64
		want uint32
	}{
		{"prlimit64 core, set from a high pointer", []uint64{0, unix.RLIMIT_CORE, high, 0}, retErrno},
		{"prlimit64 core, set and read into a high pointer", []uint64{0, unix.RLIMIT_CORE, ptr, high}, retErrno | uint32(unix.EPERM)},
		{"prlimit64 core, read into a high pointer", []uint64{0, unix.RLIMIT_CORE, 0, high}, retAllow},
	} {
		if got := run64(vm, t, arch, unix.SYS_PRLIMIT64, c.args...); got != c.want {
			t.Errorf("%s: filter returns %#x, want %#x", c.name, got, c.want)
		}
	}
}

// run64 judges one call with 64-bit arguments. The kernel loads struct
// seccomp_data in native order and the interpreter in network order: the
// fields are written big-endian at their native offsets, each argument's
// halves where a little-endian kernel keeps them (low, then high).
func run64(vm *bpf.VM, t *testing.T, arch, nr uint32, args ...uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[seccompNR:], nr)
	binary.BigEndian.PutUint32(data[seccompArch:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[seccompArg0+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[seccompArg0+8*i+4:], uint32(a>>32))
	}
	v, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(v)
}

func widen(args []uint32) []uint64 {
	out := make([]uint64, len(args))
	for i, a := range args {
		out[i] = uint64(a)
	}
	return out
}
