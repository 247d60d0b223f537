//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Exit codes of the probe that runs inside a Trial.
const (
	probeOK      = 0
	probeRefused = 1 // EPERM: what the eBPF hooks answer
	probeOther   = 2
)

// probe performs one network attempt from inside a Trial and reports the
// errno, so tests can tell an eBPF refusal (EPERM) from anything else.
func probe(args []string) int {
	if len(args) < 1 {
		fmt.Println("usage: probe ACTION [TARGET]")
		return probeOther
	}
	target := ""
	if len(args) > 1 {
		target = args[1]
	}
	var err error
	switch args[0] {
	case "tcp", "udp-connect":
		err = inetConnect(args[0], target)
	case "udp-sendto":
		err = inetSendto(target)
	case "raw4":
		err = socketOnly(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	case "raw6":
		err = socketOnly(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)
	case "ping4":
		err = socketOnly(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)
	case "ping6":
		err = socketOnly(unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_ICMPV6)
	case "unix":
		err = unixConnect(unix.SOCK_STREAM, target)
	case "unix-sendto":
		err = unixSendto(target)
	case "status":
		return status()
	case "listen":
		return listenOnce(target)
	case "bench-connect":
		return benchConnect(target, args[2])
	case "socket":
		err = rawSocket(target, args[2:])
	case "syscall":
		err = bareSyscall(target)
	case "ioctl0":
		err = ioctlStdin(target)
	case "io_uring":
		err = ioUringSetup()
	case "userns":
		err = unix.Unshare(unix.CLONE_NEWUSER | unix.CLONE_NEWNS)
	case "clone-userns":
		err = cloneUserns()
	case "kill0", "pidfd-getfd", "ptrace", "procmem":
		err = reach(args[0], target)
	case "procs":
		return procs()
	case "swap-init":
		return swapInit()
	case "ls":
		return list(target)
	case "rdev":
		var st unix.Stat_t
		if err = unix.Stat(target, &st); err == nil {
			fmt.Printf("%d:%d\n", unix.Major(st.Rdev), unix.Minor(st.Rdev))
			return probeOK
		}
	case "open-write":
		err = openWrite(target)
	case "vhost-vsock":
		err = vhostVsockGuest(target)
	case "uinput":
		err = uinputKeyboard(target)
	case "stdin-tamper":
		return stdinTamper()
	case "stdin-grow":
		return stdinGrow()
	case "read":
		var b []byte
		if b, err = os.ReadFile(target); err == nil {
			fmt.Print(string(b))
		}
	case "umount":
		err = unix.Unmount(target, unix.MNT_DETACH)
	case "write":
		err = os.WriteFile(target, []byte(args[2]), 0)
	case "bind-unix":
		err = unixBind(target)
	case "unix-self":
		err = unixSelf(target, args[2], args[3])
	case "unix-hold":
		err = unixHold(target)
	case "symlink":
		err = os.Symlink(target, args[2])
	case "link":
		err = os.Link(target, args[2])
	case "rm":
		err = os.Remove(target)
	case "mkfifo":
		err = unix.Mkfifo(target, 0o600)
	case "ptys":
		err = openPtys(target)
		if len(args) > 2 && args[2] == "hold" {
			fmt.Println(errName(err))
			holdOpen()
			return probeOK
		}
	case "ptycycle":
		err = cyclePtys(target, args[2])
	case "fill":
		err = fill(target)
	case "alloc":
		err = alloc(target)
	case "tcp-hold":
		err = tcpHold(target)
	case "hugepage":
		err = hugePage()
	default:
		fmt.Println("unknown probe", args[0])
		return probeOther
	}
	fmt.Println(errName(err))
	var errno unix.Errno
	switch {
	case err == nil:
		return probeOK
	case errors.Is(err, unix.EPERM):
		return probeRefused
	case errors.As(err, &errno):
		return probeOther
	default:
		return probeOther
	}
}

// errName is what the probe prints for err: ok, an errno's name, or the
// error.
func errName(err error) string {
	var errno unix.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &errno):
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

func sockaddr(target string) (unix.Sockaddr, int, error) {
	ap, err := netip.ParseAddrPort(target)
	if err != nil {
		return nil, 0, err
	}
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, unix.AF_INET, nil
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}, unix.AF_INET6, nil
}

func inetConnect(kind, target string) error {
	sa, family, err := sockaddr(target)
	if err != nil {
		return err
	}
	typ := unix.SOCK_STREAM
	if kind == "udp-connect" {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(family, typ, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, sa); err != nil {
		return err
	}
	if typ == unix.SOCK_DGRAM {
		_, err = unix.Write(fd, []byte("probe"))
	}
	return err
}

func inetSendto(target string) error {
	sa, family, err := sockaddr(target)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Sendto(fd, []byte("probe"), 0, sa)
}

func socketOnly(family, typ, proto int) error {
	fd, err := unix.Socket(family, typ, proto)
	if err == nil {
		_ = unix.Close(fd)
	}
	return err
}

func unixConnect(typ int, path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, typ, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Connect(fd, &unix.SockaddrUnix{Name: path})
}

func unixSendto(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Sendto(fd, []byte("probe"), 0, &unix.SockaddrUnix{Name: path})
}

// status prints what confines this process: capabilities, no_new_privs,
// ids, its cgroup as it sees it, and its open descriptors.
func status() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		fmt.Println(err)
		return probeOther
	}
	for _, line := range strings.Split(string(b), "\n") {
		for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Uid", "Gid"} {
			if strings.HasPrefix(line, k+":") {
				fmt.Println(strings.Join(strings.Fields(line), " "))
			}
		}
	}
	cg, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		if strings.HasPrefix(line, "0::") {
			fmt.Println("cgroup " + line)
		}
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		target, _ := os.Readlink("/proc/self/fd/" + fd.Name())
		fmt.Println("fd", fd.Name(), target)
	}
	return probeOK
}

// benchConnect connects and closes n times and prints ns per connect.
func benchConnect(target, count string) int {
	n, err := strconv.Atoi(count)
	if err != nil {
		fmt.Println(err)
		return probeOther
	}
	sa, family, err := sockaddr(target)
	if err != nil {
		fmt.Println(err)
		return probeOther
	}
	// Only connect() itself is timed: it runs the connect hook and, for the
	// SYN and SYN-ACK on loopback, the egress hook.
	var spent time.Duration
	for range n {
		fd, err := unix.Socket(family, unix.SOCK_STREAM, 0)
		if err == nil {
			start := time.Now()
			err = unix.Connect(fd, sa)
			spent += time.Since(start)
			// Reset on close: no TIME_WAIT, so ports never run out.
			_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1})
			_ = unix.Close(fd)
		}
		if err != nil {
			fmt.Println(err)
			return probeOther
		}
	}
	fmt.Println(float64(spent.Nanoseconds()) / float64(n))
	return probeOK
}

// listenOnce listens on target and waits up to two seconds for one
// inbound connection to complete.
func listenOnce(target string) int {
	ln, err := net.Listen("tcp", target)
	if err != nil {
		fmt.Println(err)
		if errors.Is(err, unix.EPERM) {
			return probeRefused
		}
		return probeOther
	}
	defer ln.Close()
	fmt.Println("listening")
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(2 * time.Second))
	if c, err := ln.Accept(); err == nil {
		_ = c.Close()
		fmt.Println("accepted")
	} else {
		fmt.Println("no connection")
	}
	return probeOK
}

// rawSocket calls socket(2) with a family given as a 64-bit number, so
// that high bits the kernel ignores reach the seccomp filter.
// rawSocket makes a socket of family (a SOCK_STREAM with protocol 0
// unless the type and protocol follow).
func rawSocket(family string, typeProto []string) error {
	nums := []uint64{0, unix.SOCK_STREAM, 0}
	for i, s := range append([]string{family}, typeProto...) {
		n, err := strconv.ParseUint(s, 0, 64)
		if err != nil || i > 2 {
			return fmt.Errorf("socket FAMILY [TYPE PROTO]: %q", s)
		}
		nums[i] = n
	}
	fd, _, errno := unix.RawSyscall(unix.SYS_SOCKET, uintptr(nums[0]), uintptr(nums[1]), uintptr(nums[2]))
	if errno != 0 {
		return fmt.Errorf("socket: %w", errno)
	}
	return unix.Close(int(fd))
}

// ioctlStdin sends a terminal ioctl (given as a 64-bit number) with one
// byte to stdin: TIOCSTI would type it into the terminal.
func ioctlStdin(cmd string) error {
	c, err := strconv.ParseUint(cmd, 0, 64)
	if err != nil {
		return err
	}
	b := byte('#')
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, 0, uintptr(c), uintptr(unsafe.Pointer(&b))); errno != 0 {
		return fmt.Errorf("ioctl: %w", errno)
	}
	return nil
}

func ioUringSetup() error {
	var params [120]byte // struct io_uring_params
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		return fmt.Errorf("io_uring_setup: %w", errno)
	}
	return unix.Close(int(fd))
}

// reach tries to get at process pid (a process outside the Trial, as the
// test passes it) the ways a Trial could steal its sockets or memory.
func reach(how, pid string) error {
	p, err := strconv.Atoi(pid)
	if err != nil {
		return err
	}
	switch how {
	case "kill0":
		err = unix.Kill(p, 0)
	case "pidfd-getfd":
		var fd int
		if fd, err = unix.PidfdOpen(p, 0); err == nil {
			var got int
			got, err = unix.PidfdGetfd(fd, 0, 0)
			if err == nil {
				_ = unix.Close(got)
			}
			_ = unix.Close(fd)
		}
	case "ptrace":
		if _, _, errno := unix.RawSyscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(p), 0, 0, 0, 0); errno != 0 {
			err = errno
		} else {
			_, _, _ = unix.RawSyscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, uintptr(p), 0, 0, 0, 0)
		}
	case "procmem":
		var f *os.File
		if f, err = os.Open(fmt.Sprintf("/proc/%d/mem", p)); err == nil {
			_ = f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("%s %d: %w", how, p, err)
	}
	return nil
}

// procs prints how many processes this process can see and what PID 1 is.
func procs() int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	cmdline, _ := os.ReadFile("/proc/1/cmdline")
	fmt.Printf("procs %d pid1 %s self %d\n", n, strings.SplitN(string(cmdline), "\x00", 2)[0], os.Getpid())
	return probeOK
}

// swapInit tries to change the file PID 1 runs (runc's CVE-2019-5736
// wrote the host's runtime through it) and says what each try got: what
// /proc/1/exe names, then the open's error, or each change's.
func swapInit() int {
	exe, err := os.Readlink("/proc/1/exe")
	if err != nil {
		exe = errName(err)
	}
	line := "exe " + exe
	f, err := os.OpenFile("/proc/1/exe", os.O_RDWR, 0)
	if err != nil {
		fmt.Println(line + " open " + errName(err))
		return probeOK
	}
	defer f.Close()
	_, err = f.WriteAt([]byte("#!/bin/sh\n"), 0)
	line += " write " + errName(err)
	line += " truncate " + errName(f.Truncate(0))
	line += " chmod " + errName(f.Chmod(0))
	fmt.Println(line)
	return probeOK
}

// cloneUserns forks a child into a new user namespace with clone(2), as
// the filter sees it, and reaps it.
func cloneUserns() error {
	pid, _, errno := unix.RawSyscall6(unix.SYS_CLONE, uintptr(unix.CLONE_NEWUSER|unix.SIGCHLD), 0, 0, 0, 0, 0)
	if errno != 0 {
		return fmt.Errorf("clone: %w", errno)
	}
	if pid == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	var ws unix.WaitStatus
	_, err := unix.Wait4(int(pid), &ws, 0, nil)
	return err
}

// bareSyscall makes system call nr with every argument 0: whatever it
// then fails with, only ENOSYS says the filter refused it (these calls
// reject zero arguments with EINVAL, EFAULT or ENOKEY).
func bareSyscall(nr string) error {
	n, err := strconv.ParseUint(nr, 0, 64)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall6(uintptr(n), 0, 0, 0, 0, 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// list prints the names in dir, one a line.
func list(dir string) int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		fmt.Println(err)
		return probeOther
	}
	for _, e := range entries {
		fmt.Println(e.Name())
	}
	return probeOK
}

// openWrite opens path for writing and writes nothing: the open is what
// the boundary must refuse, and the host's value stays as it is.
func openWrite(path string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		_ = unix.Close(fd)
	}
	return err
}

// vhostVsockGuest makes the caller a vsock guest through vhost-vsock's
// device at path: it owns the device and takes a CID, with which a VMM
// (this process) talks to the host's vsock services.
func vhostVsockGuest(path string) error {
	const (
		vhostSetOwner      = 0xaf01     // _IO(VHOST_VIRTIO, 0x01)
		vhostVsockSetGuest = 0x4008af60 // _IOW(VHOST_VIRTIO, 0x60, __u64)
	)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, vhostSetOwner, 0); err != nil {
		return fmt.Errorf("VHOST_SET_OWNER: %w", err)
	}
	cid := uint64(0x7e57)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), vhostVsockSetGuest, uintptr(unsafe.Pointer(&cid))); errno != 0 {
		return fmt.Errorf("VHOST_VSOCK_SET_GUEST_CID: %w", errno)
	}
	fmt.Println("a guest of vsock, CID", cid)
	return nil
}

// uinputKeyboard makes a keyboard through uinput's device at path, whose
// keys would reach whatever has the focus on the host.
func uinputKeyboard(path string) error {
	const (
		uiSetEvBit   = 0x40045564 // _IOW('U', 100, int)
		uiSetKeyBit  = 0x40045565 // _IOW('U', 101, int)
		uiDevSetup   = 0x405c5503 // _IOW('U', 3, struct uinput_setup)
		uiDevCreate  = 0x5501     // _IO('U', 1)
		uiDevDestroy = 0x5502     // _IO('U', 2)
		keyA         = 30
	)
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, uiSetEvBit, unix.EV_KEY); err != nil {
		return fmt.Errorf("UI_SET_EVBIT: %w", err)
	}
	if err := unix.IoctlSetInt(fd, uiSetKeyBit, keyA); err != nil {
		return fmt.Errorf("UI_SET_KEYBIT: %w", err)
	}
	var setup [92]byte // struct uinput_setup: input_id, name[80], ff_effects_max
	copy(setup[8:], "trialnet-probe")
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uiDevSetup, uintptr(unsafe.Pointer(&setup[0]))); errno != 0 {
		return fmt.Errorf("UI_DEV_SETUP: %w", errno)
	}
	if err := unix.IoctlSetInt(fd, uiDevCreate, 0); err != nil {
		return fmt.Errorf("UI_DEV_CREATE: %w", err)
	}
	_ = unix.IoctlSetInt(fd, uiDevDestroy, 0)
	fmt.Println("a keyboard of its own")
	return nil
}

// openPtys opens new ptys until n are open or one fails, and says how
// many it got before what error.
func openPtys(n string) error {
	want, err := strconv.Atoi(n)
	if err != nil {
		return err
	}
	for i := range want {
		if _, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY, 0); err != nil {
			fmt.Printf("%d ", i)
			return err
		}
	}
	fmt.Printf("%d ", want)
	return nil
}

// cyclePtys opens n pty masters and closes them, rounds times; it prints
// how many it opened in all.
func cyclePtys(n, rounds string) error {
	want, err := strconv.Atoi(n)
	if err != nil {
		return err
	}
	r, err := strconv.Atoi(rounds)
	if err != nil {
		return err
	}
	opened := 0
	defer func() { fmt.Printf("%d ", opened) }()
	for range r {
		fds := make([]int, 0, want)
		for range want {
			fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY, 0)
			if err != nil {
				return err
			}
			fds = append(fds, fd)
			opened++
		}
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	return nil
}

// holdOpen keeps what the probe opened until its stdin ends.
func holdOpen() { _, _ = io.Copy(io.Discard, os.Stdin) }

// alloc allocates and touches mib MiB.
func alloc(mib string) error {
	n, err := strconv.Atoi(mib)
	if err != nil {
		return err
	}
	var keep [][]byte
	for range n {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		keep = append(keep, b)
	}
	fmt.Printf("%d ", len(keep))
	return nil
}

// tcpHold opens n TCP connections over the Trial's own loopback whose
// receivers never read, writes into each until its buffers take no more,
// and prints the MiB that the kernel holds queued for them.
func tcpHold(conns string) error {
	n, err := strconv.Atoi(conns)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	buf := make([]byte, 64<<10)
	queued := 0
	for range n {
		c, err := net.Dial("tcp4", l.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		a, err := l.Accept()
		if err != nil {
			return err
		}
		defer a.Close()
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			return err
		}
		// Until EAGAIN: send and receive buffers both full.
		if cerr := raw.Write(func(fd uintptr) bool {
			for {
				w, err := unix.Write(int(fd), buf)
				if err != nil {
					return true
				}
				queued += w
			}
		}); cerr != nil {
			return cerr
		}
	}
	fmt.Printf("%d ", queued>>20)
	return nil
}

// hugePage maps a huge page from the host's pool and touches it.
func hugePage() error {
	b, err := unix.Mmap(-1, 0, 2<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB)
	if err != nil {
		return err
	}
	b[0] = 1
	return unix.Munmap(b)
}

// fill writes to path until the write fails, and says how many MiB it
// wrote before what error.
func fill(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range 1 << 12 { // 4 GiB at most
		if _, err := f.Write(buf); err != nil {
			fmt.Printf("%d ", i)
			return err
		}
	}
	return nil
}

// unixTypes are the socket types unix-self takes, by name.
var unixTypes = map[string]int{"stream": unix.SOCK_STREAM, "seqpacket": unix.SOCK_SEQPACKET, "dgram": unix.SOCK_DGRAM}

// unixSelf binds a socket of typ at bind, then reaches it through
// connect (a path that should lead to it) from a second socket: connect
// and a byte across for stream and seqpacket, sendto and a byte received
// for dgram. What reaches it is the process's own socket.
func unixSelf(typ, bind, connect string) error {
	st, ok := unixTypes[typ]
	if !ok {
		return fmt.Errorf("unknown socket type %q", typ)
	}
	srv, err := unix.Socket(unix.AF_UNIX, st, 0)
	if err != nil {
		return err
	}
	defer unix.Close(srv)
	if err := unix.Bind(srv, &unix.SockaddrUnix{Name: bind}); err != nil {
		return err
	}
	defer os.Remove(bind)
	cl, err := unix.Socket(unix.AF_UNIX, st, 0)
	if err != nil {
		return err
	}
	defer unix.Close(cl)
	if st == unix.SOCK_DGRAM {
		if err := unix.Sendto(cl, []byte{7}, 0, &unix.SockaddrUnix{Name: connect}); err != nil {
			return err
		}
	} else {
		if err := unix.Listen(srv, 1); err != nil {
			return err
		}
		if err := unix.Connect(cl, &unix.SockaddrUnix{Name: connect}); err != nil {
			return err
		}
		nfd, _, err := unix.Accept(srv)
		if err != nil {
			return err
		}
		defer unix.Close(nfd)
		srv = nfd
		if _, err := unix.Write(cl, []byte{7}); err != nil {
			return err
		}
	}
	var b [1]byte
	if n, _, err := unix.Recvfrom(srv, b[:], 0); err != nil || n != 1 || b[0] != 7 {
		return fmt.Errorf("no byte across (%d, %v)", n, err)
	}
	return nil
}

// unixHold listens on path, says "ready", and holds the socket until its
// stdin ends.
func unixHold(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return err
	}
	if err := unix.Listen(fd, 8); err != nil {
		return err
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

func unixBind(path string) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Bind(fd, &unix.SockaddrUnix{Name: path})
}

// stdinTamper tries what a Trial could do to the caller's stdin, were it
// handed in: open it again for writing and put a line in it, move its
// offset back, and make it non-blocking for whoever reads it next.
func stdinTamper() int {
	var out []string
	f, err := os.OpenFile("/proc/self/fd/0", os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString("INJECTED\n")
		_ = f.Close()
	}
	out = append(out, fmt.Sprintf("write-back: %v", err))
	_, err = unix.Seek(0, 0, io.SeekStart)
	out = append(out, fmt.Sprintf("seek: %v", err))
	fl, err := unix.FcntlInt(0, unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(0, unix.F_SETFL, fl|unix.O_NONBLOCK)
	}
	out = append(out, fmt.Sprintf("nonblock: %v", err))
	fmt.Println(strings.Join(out, "; "))
	return probeOK
}

// stdinGrow makes its stdin pipe longer, as any holder of a pipe may,
// gives the relay time to see room in it, then reads one line of it, a
// byte at a time, as a shell's read does.
func stdinGrow() int {
	if _, err := unix.FcntlInt(0, unix.F_SETPIPE_SZ, 1<<20); err != nil {
		fmt.Println("grow:", err)
		return probeOther
	}
	time.Sleep(200 * time.Millisecond)
	var line []byte
	b := make([]byte, 1)
	for {
		if n, err := unix.Read(0, b); n != 1 || err != nil {
			break
		}
		if line = append(line, b[0]); b[0] == '\n' {
			break
		}
	}
	fmt.Print(string(line))
	return probeOK
}
