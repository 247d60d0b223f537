//go:build linux

package bpf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// childMain serves the commands of child (lsm_test.go) on one locked
// thread (ptrace wants its tracer to stay one thread).
func childMain() int {
	runtime.LockOSThread()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		detail, err := childCommand(f[0], f[1:])
		switch e := err.(type) {
		case nil:
			fmt.Printf("ok %s\n", detail)
		case syscall.Errno:
			fmt.Printf("err %d %v\n", int(e), e)
		default:
			if errno, ok := unwrapErrno(err); ok {
				fmt.Printf("err %d %v\n", int(errno), err)
			} else {
				fmt.Printf("err 0 %v\n", err)
			}
		}
	}
	return 0
}

func unwrapErrno(err error) (syscall.Errno, bool) {
	var e syscall.Errno
	for err != nil {
		if x, ok := err.(syscall.Errno); ok {
			return x, true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return e, false
		}
		err = u.Unwrap()
	}
	return e, false
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// held are the descriptors the child's pty commands keep open.
var held []int

func childCommand(cmd string, args []string) (string, error) {
	switch cmd {
	case "cookie":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return strconv.FormatUint(c, 10), err
	case "lo-up":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq("lo")
		if err != nil {
			return "", err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
			return "", err
		}
		ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
		return "", unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
	case "connectfd":
		ap, err := net.ResolveTCPAddr("tcp4", args[1])
		if err != nil {
			return "", err
		}
		sa := &unix.SockaddrInet4{Port: ap.Port}
		copy(sa.Addr[:], ap.IP.To4())
		return "", unix.Connect(atoi(args[0]), sa)
	case "connect":
		// In the child's own netns, with no route: nothing can leave.
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		return childCommand("connectfd", []string{strconv.Itoa(fd), args[0]})
	case "sendfd":
		_, err := unix.Write(atoi(args[0]), []byte("x"))
		return "", err
	case "selfconnect":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		defer ln.Close()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return "", err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return "", err
	case "abstract":
		name := fmt.Sprintf("@trialnet-bpftest-%d", os.Getpid())
		ln, err := net.Listen("unix", name)
		if err != nil {
			return "", err
		}
		defer ln.Close()
		c, err := net.Dial("unix", name)
		if err != nil {
			return "", err
		}
		return "", c.Close()
	case "socket":
		fd, err := unix.Socket(atoi(args[0]), atoi(args[1]), atoi(args[2]))
		if err == nil {
			_ = unix.Close(fd)
		}
		return "", err
	case "getfd":
		pidfd, err := unix.PidfdOpen(atoi(args[0]), 0)
		if err != nil {
			return "", fmt.Errorf("pidfd_open: %w", err)
		}
		defer unix.Close(pidfd)
		fd, err := unix.PidfdGetfd(pidfd, 0, 0)
		if err == nil {
			_ = unix.Close(fd)
		}
		return "", err
	case "ptrace":
		pid := atoi(args[0])
		if err := unix.PtraceAttach(pid); err != nil {
			return "", err
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WALL, nil)
		return "", unix.PtraceDetach(pid)
	case "procmem":
		f, err := os.Open(fmt.Sprintf("/proc/%s/mem", args[0]))
		if err == nil {
			_ = f.Close()
		}
		return "", err
	case "ioctl":
		return "", ioctlByte(atoi(args[0]), uint(atoi(args[1])))
	case "unixconnect":
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		return "", unix.Connect(fd, &unix.SockaddrUnix{Name: args[0]})
	case "unixsend":
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		return "", unix.Sendto(fd, []byte("x"), 0, &unix.SockaddrUnix{Name: args[0]})
	case "blackhole":
		return "", addBlackholeRoute()
	case "devpts":
		// A devpts instance of its own, as bwrap --dev mounts one (no
		// max=), kept from propagating back to the host's namespace.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return "", err
		}
		return "", unix.Mount("devpts", args[0], "devpts", 0, "newinstance,ptmxmode=0666")
	case "ptyopen", "opath":
		flags := unix.O_RDWR | unix.O_NOCTTY | unix.O_CLOEXEC
		if cmd == "opath" {
			flags = unix.O_PATH | unix.O_CLOEXEC
		}
		fd, err := unix.Open(args[0], flags, 0)
		if err != nil {
			return "", err
		}
		held = append(held, fd)
		return strconv.Itoa(fd), nil
	case "ptysend":
		// Hands the last master opened out through the unix socket args[0],
		// and closes this copy.
		fd := held[len(held)-1]
		held = held[:len(held)-1]
		defer unix.Close(fd)
		return "", unix.Sendmsg(atoi(args[0]), []byte("m"), unix.UnixRights(fd), nil, 0)
	case "ptyclose":
		for _, fd := range held {
			_ = unix.Close(fd)
		}
		held = nil
		return "", nil
	case "bindmount":
		// The child has a mount namespace of its own; keep it from
		// propagating anything back to the host's.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return "", err
		}
		return "", unix.Mount(args[0], args[1], "", unix.MS_BIND, "")
	}
	return "", fmt.Errorf("unknown command %q", cmd)
}

// addBlackholeRoute asks route netlink for a blackhole route to
// 192.0.2.0/24 in the caller's network namespace (a write the LSM layer
// refuses a Trial task, CAP_NET_ADMIN or not), and returns the kernel's
// answer.
func addBlackholeRoute() error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	const hdr, rtmsg, attr = unix.SizeofNlMsghdr, unix.SizeofRtMsg, 8
	b := make([]byte, hdr+rtmsg+attr)
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:], unix.RTM_NEWROUTE)
	binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	r := b[hdr:]
	r[0], r[1], r[4], r[5], r[6], r[7] = unix.AF_INET, 24, unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RT_SCOPE_UNIVERSE, unix.RTN_BLACKHOLE
	a := b[hdr+rtmsg:]
	binary.NativeEndian.PutUint16(a[0:], attr)
	binary.NativeEndian.PutUint16(a[2:], unix.RTA_DST)
	copy(a[4:], []byte{192, 0, 2, 0})
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	ack := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, ack, 0)
	if err != nil {
		return err
	}
	if n < hdr+4 || binary.NativeEndian.Uint16(ack[4:]) != unix.NLMSG_ERROR {
		return fmt.Errorf("no netlink ack (%d bytes)", n)
	}
	if e := int32(binary.NativeEndian.Uint32(ack[hdr:])); e != 0 {
		return syscall.Errno(-e)
	}
	return nil
}

// ioctlByte calls ioctl(fd, cmd, &b) with a one-byte argument, as TIOCSTI
// (the byte to push) and TIOCLINUX (the subcode) take.
func ioctlByte(fd int, cmd uint) error {
	b := byte(6) // TIOCLINUX: TIOCL_GETSHIFTSTATE; TIOCSTI: an ACK byte
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(cmd), uintptr(unsafe.Pointer(&b)))
	if e != 0 {
		return e
	}
	return nil
}
