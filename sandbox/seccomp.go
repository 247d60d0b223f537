//go:build linux

package sandbox

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The seccomp filter every Trial command runs under. It is short and
// assembled here with golang.org/x/net/bpf rather than through a seccomp
// library, because the libraries at hand get two things wrong for this
// filter:
//   - they compare all 64 bits of an argument, while the kernel truncates
//     int and unsigned int arguments to 32 bits: ioctl(fd, 0x1_00005412)
//     is TIOCSTI to the kernel but not to an Equal rule, and
//     socket(0x1_00000028) is AF_VSOCK;
//   - a system call made through another ABI (int 0x80 on x86_64 reaches
//     the i386 table, where socketcall(2) hides the family behind a
//     pointer) falls to the default action, which for this filter is allow.
// So: every foreign ABI and x32 gets ENOSYS, arguments are judged on their
// low 32 bits as the kernel reads them, and families are an allowlist.
// The filter also keeps a Trial from making a user namespace (and so from
// mounting anything), from io_uring, and from the kernel services that act
// outside the Trial on its behalf (the key service's request-key upcall).

// Seccomp data offsets (struct seccomp_data, little-endian).
const (
	seccompNR   = 0
	seccompArch = 4
	seccompArg0 = 16 // low 32 bits of args[0]
	seccompArg1 = 24 // low 32 bits of args[1]
	seccompArg2 = 32 // low 32 bits of args[2]
	seccompArg3 = 40 // low 32 bits of args[3]
)

const (
	retAllow = 0x7fff0000 // SECCOMP_RET_ALLOW
	retErrno = 0x00050000 // SECCOMP_RET_ERRNO | errno
	x32Bit   = 0x40000000 // __X32_SYSCALL_BIT

	sockTypeMask = 0xf // SOCK_TYPE_MASK: the type without SOCK_NONBLOCK, SOCK_CLOEXEC
)

// The only sockets a Trial command can create: unix sockets; TCP, UDP and
// ping sockets; and route netlink (getifaddrs). Any other family fails
// with EAFNOSUPPORT, families the kernel adds later included, and any
// other protocol of these families with EPROTONOSUPPORT. Protocols are an
// allowlist too because asking for one the kernel lacks (SCTP, DCCP, a
// netlink family) makes it load a module on the Trial's behalf: code the
// host never chose to run, reached from inside. MPTCP is left out for the
// same reason of surface; Go and curl fall back to TCP when it is refused.
var (
	inetProtocols    = []uint32{0, unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6}
	netlinkProtocols = []uint32{unix.NETLINK_ROUTE}
)

// refusedCalls fail with ENOSYS, as on a kernel built without them:
//   - the key service: request_key(2) for a key it lacks runs
//     /sbin/request-key as root in the host's namespaces with the Trial's
//     text (a dns_resolver key is a DNS query, its answer readable in
//     the Trial), and keyctl reaches the keyrings a Trial process
//     inherited or shares with its uid outside;
//   - bpf, perf_event_open and userfaultfd, whose reach depends on host
//     sysctls (unprivileged_bpf_disabled, perf_event_paranoid,
//     unprivileged_userfaultfd) a Trial must not rely on;
//   - io_setup: kernel AIO contexts come from one host-wide pool
//     (fs.aio-max-nr) that no per-Trial limit bounds; one Trial took all
//     65,536 and host processes got EAGAIN. glibc's POSIX AIO uses
//     threads, and libaio users fall back on ENOSYS;
//   - pidfd_getfd: a pidfd needs no pid (SO_PEERPIDFD gives one of an
//     allowed unix socket's server), and only Landlock, Yama or the LSM
//     layer stand between it and a same-uid process's sockets: on 6.12
//     with none of them in lsm= (Yama's scope 0, Debian's default) a
//     Trial took the server's TCP socket.
var refusedCalls = []uint32{unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_KEYCTL,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD, unix.SYS_IO_SETUP, unix.SYS_PIDFD_GETFD}

// The setsockopt option ranges refused with EPERM. Netfilter's tables
// and IPVS: IPT_SO_SET_*, ARPT_SO_SET_*, EBT_SO_SET_*, IP_VS_SO_SET_* on
// SOL_IP; IP6T_SO_SET_* on SOL_IPV6. TCP-AO's keys (TCP_AO_ADD_KEY 38 to
// TCP_AO_REPAIR 42 on SOL_TCP; x/sys has no names for them): a key names
// its hash algorithm, and one the kernel lacks is a
// request_module("crypto-<name>") for any caller, the module loading that
// AF_ALG (refused) would give. IPv6 routing headers, which any uid may
// set: IPV6_RTHDR (a segment routing header), and IPV6_2292PKTOPTIONS,
// whose control messages stick to the socket, TCP's too (a Mobile IPv6
// type 2 header on kernels built with CONFIG_IPV6_MIP6, Debian's). The
// kernel sends to the header's address, not to the one connect and
// sendmsg name, so a socket the connect6 hook let through to [::1] sends
// to any address (the namespace and the egress hook stop it there).
// IPV6_2292RTHDR is only the old API's ask to receive them. No socket
// option a program needs lies in them.
var refusedOpts = []struct {
	level uint32
	opts  [][2]uint32
}{
	{unix.SOL_IP, [][2]uint32{{64, 67}, {96, 99}, {128, 131}, {1152, 1167}}},
	// 66, 67: IPV6_RECVTCLASS, IPV6_TCLASS
	{unix.SOL_IPV6, [][2]uint32{{unix.IPV6_2292PKTOPTIONS, unix.IPV6_2292PKTOPTIONS}, {unix.IPV6_RTHDR, unix.IPV6_RTHDR}, {64, 65}}},
	{unix.SOL_TCP, [][2]uint32{{38, 42}}},
}

// netConfigIoctls are the socket ioctls that change the network (routes,
// interface settings, ARP, bridges, VLANs, bonds, tunnels and the other
// device-private requests, hardware timestamps) and tun's
// TUNSETIFF: refused with EPERM. A nested Trial holds CAP_NET_ADMIN over
// network namespaces it makes, and some (SIOCBRADDBR, SIOCSIFVLAN) load a
// module for any caller; the requests that only read stay allowed.
var netConfigIoctls = [][2]uint32{
	{unix.SIOCADDRT, unix.SIOCDELRT},
	{unix.SIOCSIFLINK, unix.SIOCSIFLINK},
	{unix.SIOCSIFFLAGS, unix.SIOCSIFFLAGS},
	{unix.SIOCSIFADDR, unix.SIOCSIFADDR},
	{unix.SIOCSIFDSTADDR, unix.SIOCSIFDSTADDR},
	{unix.SIOCSIFBRDADDR, unix.SIOCSIFBRDADDR},
	{unix.SIOCSIFNETMASK, unix.SIOCSIFNETMASK},
	{unix.SIOCSIFMETRIC, unix.SIOCSIFMETRIC},
	{unix.SIOCSIFMEM, unix.SIOCSIFMEM},
	{unix.SIOCSIFMTU, unix.SIOCSIFHWADDR}, // and SIOCSIFNAME
	{unix.SIOCSIFENCAP, unix.SIOCSIFENCAP},
	{unix.SIOCADDMULTI, unix.SIOCDELMULTI},
	{unix.SIOCSIFPFLAGS, unix.SIOCSIFPFLAGS},
	{unix.SIOCDIFADDR, unix.SIOCSIFHWBROADCAST},
	{unix.SIOCSIFTXQLEN, unix.SIOCSIFTXQLEN},
	{unix.SIOCSMIIREG, unix.SIOCWANDEV},
	{unix.SIOCDARP, unix.SIOCDARP},
	{unix.SIOCSARP, unix.SIOCSARP},
	{unix.SIOCDRARP, unix.SIOCDRARP},
	{unix.SIOCSRARP, unix.SIOCSRARP},
	{unix.SIOCSIFMAP, unix.SIOCSIFMAP},
	{unix.SIOCADDDLCI, unix.SIOCDELDLCI},
	{unix.SIOCSIFVLAN, unix.SIOCSIFVLAN},
	{unix.SIOCBONDENSLAVE, unix.SIOCBONDCHANGEACTIVE}, // the bonding requests
	{unix.SIOCBRADDBR, unix.SIOCBRDELIF},              // the bridge requests
	{unix.SIOCSHWTSTAMP, unix.SIOCSHWTSTAMP},
	{unix.SIOCPROTOPRIVATE, unix.SIOCDEVPRIVATE + 15}, // tunnels and the rest
	{unix.TUNSETIFF, unix.TUNSETIFF},
}

// shmHugetlb is shmget's SHM_HUGETLB (linux/shm.h), which x/sys/unix
// does not name.
const shmHugetlb = 0o4000

// refusedIoctls would let a Trial type into a terminal or read its
// screen, or attach a line discipline to its terminal (TIOCSETD: rarely
// used code, HDLC, GSM mux and the like, loaded as modules on demand).
var refusedIoctls = []uint32{unix.TIOCSTI, unix.TIOCLINUX, unix.TIOCSETD}

func auditArch() (uint32, error) {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64, nil
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64, nil
	}
	return 0, fmt.Errorf("seccomp: no filter for %s; trialnet supports amd64 and arm64", runtime.GOARCH)
}

// seccompProgram assembles the filter; userns allows CLONE_NEWUSER (a
// nested Trial). Jumps are written to labels and resolved at the end, so
// that the program reads top to bottom.
func seccompProgram(userns bool) ([]bpf.RawInstruction, error) {
	arch, err := auditArch()
	if err != nil {
		return nil, err
	}
	var a asm
	a.ins(bpf.LoadAbsolute{Off: seccompArch, Size: 4})
	a.jumpIfNot(arch, "enosys")
	a.ins(bpf.LoadAbsolute{Off: seccompNR, Size: 4})
	if runtime.GOARCH == "amd64" {
		a.jumpIf(bpf.JumpGreaterOrEqual, x32Bit, "enosys")
	}
	a.jumpIf(bpf.JumpEqual, unix.SYS_SOCKET, "family")
	a.jumpIf(bpf.JumpEqual, unix.SYS_SOCKETPAIR, "family")
	a.jumpIf(bpf.JumpEqual, unix.SYS_IOCTL, "ioctl")
	a.jumpIf(bpf.JumpEqual, unix.SYS_SETSOCKOPT, "setsockopt")
	// io_uring can create a socket of any family (IORING_OP_SOCKET)
	// without calling socket(2): no ring, no way around the allowlist.
	// Nor one made outside and handed in (through an allowed socket's
	// service): its work runs as its maker's, outside the Trial.
	a.jumpIf(bpf.JumpEqual, unix.SYS_IO_URING_SETUP, "enosys")
	a.jumpIf(bpf.JumpEqual, unix.SYS_IO_URING_ENTER, "enosys")
	a.jumpIf(bpf.JumpEqual, unix.SYS_IO_URING_REGISTER, "enosys")
	a.jumpIf(bpf.JumpEqual, unix.SYS_UNSHARE, "userns")
	a.jumpIf(bpf.JumpEqual, unix.SYS_CLONE, "userns")
	// clone3 passes its flags in memory, out of the filter's sight; libc
	// falls back to clone on ENOSYS, where they are visible.
	a.jumpIf(bpf.JumpEqual, unix.SYS_CLONE3, "enosys")
	// No joining a namespace either: a namespace file that reached the
	// Trial (passed, or bind-mounted on the host) must lead nowhere.
	a.jumpIf(bpf.JumpEqual, unix.SYS_SETNS, "eperm")
	for _, nr := range refusedCalls {
		a.jumpIf(bpf.JumpEqual, nr, "enosys")
	}
	a.jumpIf(bpf.JumpEqual, unix.SYS_MMAP, "mmap")
	a.jumpIf(bpf.JumpEqual, unix.SYS_SHMGET, "shmget")
	a.jumpIf(bpf.JumpEqual, unix.SYS_MEMFD_CREATE, "memfd")
	a.jumpIf(bpf.JumpEqual, unix.SYS_SETRLIMIT, "setrlimit")
	a.jumpIf(bpf.JumpEqual, unix.SYS_PRLIMIT64, "prlimit")
	a.ret(retAllow)

	// The core size limit stays at CoreLimit: 0 would not stop a dump
	// where core_pattern pipes to a helper (the kernel ignores the limit
	// for a pipe, but for 1), which runs as root outside the Trial. A
	// change is answered 0 and made to nothing, as lowering needs no
	// privilege and programs that hold keys (ssh-agent) exit if it fails;
	// no core is dumped either way. A prlimit64 that also asks for the
	// old limit gets EPERM: it would not be filled in.
	a.label("setrlimit")
	a.ins(bpf.LoadAbsolute{Off: seccompArg0, Size: 4})
	a.jumpIf(bpf.JumpEqual, unix.RLIMIT_CORE, "unchanged")
	a.ret(retAllow)
	a.label("prlimit")
	a.ins(bpf.LoadAbsolute{Off: seccompArg1, Size: 4})
	a.jumpIfNot(unix.RLIMIT_CORE, "allow")
	a.ins(bpf.LoadAbsolute{Off: seccompArg2, Size: 4}) // new_limit: NULL only reads
	a.jumpIf(bpf.JumpNotEqual, 0, "core_set")
	a.ins(bpf.LoadAbsolute{Off: seccompArg2 + 4, Size: 4})
	a.jumpIf(bpf.JumpNotEqual, 0, "core_set")
	a.ret(retAllow)
	a.label("core_set")
	a.ins(bpf.LoadAbsolute{Off: seccompArg3, Size: 4}) // old_limit
	a.jumpIf(bpf.JumpNotEqual, 0, "eperm")
	a.ins(bpf.LoadAbsolute{Off: seccompArg3 + 4, Size: 4})
	a.jumpIf(bpf.JumpNotEqual, 0, "eperm")
	a.label("unchanged")
	a.ret(retErrno) // errno 0: the call "succeeds", unmade

	// No huge pages from the host's reserved pool (vm.nr_hugepages): no
	// cgroup of the Trial's bounds its share, and one Trial could take
	// the pages a host database or DPDK reserved. Refused with ENOMEM, as
	// on a host whose pool is empty (most hosts): programs fall back to
	// normal pages. Transparent huge pages are not the pool's.
	a.label("mmap")
	a.ins(bpf.LoadAbsolute{Off: seccompArg3, Size: 4})
	a.jumpIf(bpf.JumpBitsSet, unix.MAP_HUGETLB, "enomem")
	a.ret(retAllow)
	a.label("shmget")
	a.ins(bpf.LoadAbsolute{Off: seccompArg2, Size: 4})
	a.jumpIf(bpf.JumpBitsSet, shmHugetlb, "enomem")
	a.ret(retAllow)
	a.label("memfd")
	a.ins(bpf.LoadAbsolute{Off: seccompArg1, Size: 4})
	a.jumpIf(bpf.JumpBitsSet, unix.MFD_HUGETLB, "enomem")
	a.ret(retAllow)

	// No user namespace: inside one a Trial would hold CAP_SYS_ADMIN over
	// mounts of its own and could bind another socket over an allowed
	// unix path, or replay any other mount trick. Both calls take the
	// flags in the low 32 bits of their first argument.
	a.label("userns")
	if !userns {
		a.ins(bpf.LoadAbsolute{Off: seccompArg0, Size: 4})
		a.jumpIf(bpf.JumpBitsSet, unix.CLONE_NEWUSER, "eperm")
	}
	a.ret(retAllow)

	a.label("family")
	a.ins(bpf.LoadAbsolute{Off: seccompArg0, Size: 4})
	a.jumpIf(bpf.JumpEqual, unix.AF_UNIX, "allow")
	a.jumpIf(bpf.JumpEqual, unix.AF_INET, "inet")
	a.jumpIf(bpf.JumpEqual, unix.AF_INET6, "inet")
	a.jumpIf(bpf.JumpEqual, unix.AF_NETLINK, "netlink")
	a.ret(retErrno | uint32(unix.EAFNOSUPPORT))

	// SOCK_PACKET asked of AF_INET is made as AF_PACKET: the kernel swaps
	// the family before it looks it up (loading af_packet's module where
	// it is one), so the family above is not the one the kernel makes.
	a.label("inet")
	a.ins(bpf.LoadAbsolute{Off: seccompArg1, Size: 4})
	a.ins(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: sockTypeMask})
	a.jumpIf(bpf.JumpEqual, unix.SOCK_PACKET, "eafnosupport")
	a.ins(bpf.LoadAbsolute{Off: seccompArg2, Size: 4})
	for _, p := range inetProtocols {
		a.jumpIf(bpf.JumpEqual, p, "allow")
	}
	a.ret(retErrno | uint32(unix.EPROTONOSUPPORT))

	a.label("netlink")
	a.ins(bpf.LoadAbsolute{Off: seccompArg2, Size: 4})
	for _, p := range netlinkProtocols {
		a.jumpIf(bpf.JumpEqual, p, "allow")
	}
	a.ret(retErrno | uint32(unix.EPROTONOSUPPORT))

	a.label("ioctl")
	a.ins(bpf.LoadAbsolute{Off: seccompArg1, Size: 4})
	for _, c := range refusedIoctls {
		a.jumpIf(bpf.JumpEqual, c, "eperm")
	}
	for i, r := range netConfigIoctls {
		a.refuseRange(r, fmt.Sprintf("netcfg_%d", i))
	}
	// ethtool: what a loopback answers anyway, so that readers of link
	// speed (psutil) carry on.
	a.jumpIf(bpf.JumpEqual, unix.SIOCETHTOOL, "eopnotsupp")
	a.ret(retAllow)

	// Netfilter's table replacement (iptables, ip6tables, arptables,
	// ebtables) and IPVS, through setsockopt on any IPv4 or IPv6 socket:
	// reachable with CAP_NET_ADMIN over a network namespace a nested
	// Trial made, and a classic way from a user namespace to the kernel.
	// And TCP-AO's keys (refusedOpts).
	a.label("setsockopt")
	a.ins(bpf.LoadAbsolute{Off: seccompArg1, Size: 4})
	for _, l := range refusedOpts {
		a.jumpIf(bpf.JumpEqual, l.level, fmt.Sprintf("sockopt_%d", l.level))
	}
	a.ret(retAllow)
	for _, l := range refusedOpts {
		a.label(fmt.Sprintf("sockopt_%d", l.level))
		a.ins(bpf.LoadAbsolute{Off: seccompArg2, Size: 4})
		for i, r := range l.opts {
			a.refuseRange(r, fmt.Sprintf("sockopt_%d_%d", l.level, i))
		}
		a.ret(retAllow)
	}

	a.label("eperm")
	a.ret(retErrno | uint32(unix.EPERM))
	a.label("eafnosupport")
	a.ret(retErrno | uint32(unix.EAFNOSUPPORT))
	a.label("enomem")
	a.ret(retErrno | uint32(unix.ENOMEM))
	a.label("eopnotsupp")
	a.ret(retErrno | uint32(unix.EOPNOTSUPP))
	a.label("enosys")
	a.ret(retErrno | uint32(unix.ENOSYS))
	a.label("allow")
	a.ret(retAllow)
	return a.assemble()
}

// seccompFiles hold the commands' filter (plain, then nested) once per
// process, each in a sealed memfd that every trialnet-exec gets as its
// fd 5: early.c, which runs before the Go runtime and cannot assemble it,
// installs the filter from there. Sealed, since every launch shares it.
var seccompFiles = [2]func() (*os.File, error){
	sync.OnceValues(func() (*os.File, error) { return seccompMemfd(false) }),
	sync.OnceValues(func() (*os.File, error) { return seccompMemfd(true) }),
}

// seccompFile is the memfd holding the commands' filter (seccompFiles).
func seccompFile(userns bool) (*os.File, error) {
	if userns {
		return seccompFiles[1]()
	}
	return seccompFiles[0]()
}

func seccompMemfd(userns bool) (*os.File, error) {
	prog, err := seccompProgram(userns)
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("trialnet-seccomp", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("seccomp filter memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "trialnet-seccomp")
	// bpf.RawInstruction is struct sock_filter, field for field.
	b := unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), len(prog)*int(unsafe.Sizeof(prog[0])))
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("seccomp filter memfd: %w", err)
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("seal the seccomp filter memfd: %w", err)
	}
	return f, nil
}

// installSeccomp loads the filter on the calling thread, which must then
// exec: the filter is kept across execve and inherited by every child.
// no_new_privs must already be set (dropPrivileges does).
func installSeccomp(userns bool) error {
	prog, err := seccompProgram(userns)
	if err != nil {
		return err
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: (*unix.SockFilter)(unsafe.Pointer(&prog[0]))}
	if _, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return fmt.Errorf("install seccomp filter: %w", errno)
	}
	runtime.KeepAlive(prog)
	return nil
}

// asm is a tiny label-resolving assembler for classic BPF.
type asm struct {
	prog   []bpf.Instruction
	labels map[string]int
	fixups []fixup
}

type fixup struct {
	at    int
	label string
	false bool // the label is the false branch (jumpIfNot)
}

func (a *asm) ins(i bpf.Instruction) { a.prog = append(a.prog, i) }

func (a *asm) ret(v uint32) { a.ins(bpf.RetConstant{Val: v}) }

func (a *asm) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	a.labels[name] = len(a.prog)
}

// refuseRange goes to "eperm" when the accumulator is within r; next
// names the label after the test.
func (a *asm) refuseRange(r [2]uint32, next string) {
	a.jumpIf(bpf.JumpLessThan, r[0], next)
	a.jumpIf(bpf.JumpLessOrEqual, r[1], "eperm")
	a.label(next)
}

// jumpIf goes to label when the condition holds, else on.
func (a *asm) jumpIf(cond bpf.JumpTest, val uint32, label string) {
	a.fixups = append(a.fixups, fixup{at: len(a.prog), label: label})
	a.ins(bpf.JumpIf{Cond: cond, Val: val})
}

// jumpIfNot goes to label unless the accumulator equals val.
func (a *asm) jumpIfNot(val uint32, label string) {
	a.fixups = append(a.fixups, fixup{at: len(a.prog), label: label, false: true})
	a.ins(bpf.JumpIf{Cond: bpf.JumpEqual, Val: val})
}

func (a *asm) assemble() ([]bpf.RawInstruction, error) {
	for _, f := range a.fixups {
		to, ok := a.labels[f.label]
		skip := to - f.at - 1
		if !ok || skip < 0 || skip > 255 {
			return nil, fmt.Errorf("seccomp: bad jump to %q", f.label)
		}
		j := a.prog[f.at].(bpf.JumpIf)
		if f.false {
			j.SkipFalse = uint8(skip)
		} else {
			j.SkipTrue = uint8(skip)
		}
		a.prog[f.at] = j
	}
	return bpf.Assemble(a.prog)
}
