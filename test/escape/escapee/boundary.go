//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	victimPid     = flag.Int("victim-pid", 0, "boundary: the process outside the Trial that holds sockets")
	victimFds     = flag.String("victim-fds", "", "boundary: its unconnected TCP sockets, comma-separated")
	victimBoxes   = flag.String("victim-boxes", "", "boundary: its mailbox addresses (hex), comma-separated")
	listenUnix    = flag.String("listen-unix", "", "victim: a unix socket path to serve (the allowed socket of a Trial)")
	targets       = flag.String("targets", "", "victim and boundary: host listeners, comma-separated, one per socket")
	allowedUnix   = flag.String("allowed-unix", "", "boundary: the unix socket path the Trial may use")
	forbiddenUnix = flag.String("forbidden-unix", "", "boundary: a unix socket it may not")
	victimIPC     = flag.String("victim-ipc", "", "boundary: the victim's IPC objects, shmid,shmfile,mqname,keydesc")
	keySecret     = flag.String("key-secret", "", "victim: the payload of its user key")
	sharedFile    = flag.String("shared-file", "", "boundary: a file to make in the host's /run/lock, where another Trial would read it")
)

// The message typed into a terminal by TIOCSTI; the test looks for it in
// the operator's terminal input.
const injected = "echo trialnet-pwned\n"

// boundary tries the ways out that go around the network layers.
func boundary() {
	enc := json.NewEncoder(os.Stdout)
	fds, boxes, tg := splitInts(*victimFds, 10), splitInts(*victimBoxes, 16), strings.Split(*targets, ",")
	if len(fds) < victimSockets || len(boxes) < 3 || len(tg) < victimSockets {
		fmt.Fprintf(os.Stderr, "boundary needs -victim-pid, %d -victim-fds and -targets, 3 -victim-boxes\n", victimSockets)
		os.Exit(2)
	}
	report(enc, "steal-socket-pidfd", func() error { return stealAndConnect(*victimPid, int(fds[0]), tg[0]) }())
	report(enc, "victim-ptrace-poke", ptracePoke(*victimPid, uintptr(boxes[1])))
	report(enc, "victim-proc-mem", procMemWrite(*victimPid, boxes[2]))
	report(enc, "tiocsti", tiocsti())
	// A pidfd needs no pid: the peer of a unix socket gives one.
	report(enc, "steal-via-stdio-peer", stealFromPeer(0, int(fds[3]), tg[3]))
	report(enc, "handed-socket-connect", handedSocketConnect(tg[handedSocket]))
	report(enc, "steal-via-allowed-unix-peer", func() error {
		fd, err := dialAllowed()
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return stealFromPeer(fd, int(fds[4]), tg[4])
	}())
	// A pidfd needs no pid for a signal either (SIGUSR1, which the victim
	// answers by connecting its socket).
	report(enc, "signal-via-allowed-unix-peer", func() error {
		fd, err := dialAllowed()
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		pidfd, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, soPeerPidfd)
		if err != nil {
			return fmt.Errorf("SO_PEERPIDFD: %w", err)
		}
		defer unix.Close(pidfd)
		return unix.PidfdSendSignal(pidfd, unix.SIGUSR1, nil, 0)
	}())
	for _, f := range []struct {
		name   string
		family int
	}{{"vsock", unix.AF_VSOCK}, {"tipc", unix.AF_TIPC}, {"rds", unix.AF_RDS}, {"can", unix.AF_CAN},
		{"bluetooth", unix.AF_BLUETOOTH}, {"xdp", unix.AF_XDP}, {"qipcrtr", unix.AF_QIPCRTR}, {"mctp", unix.AF_MCTP}} {
		report(enc, "socket-"+f.name, anySocket(f.family))
	}
	report(enc, "userns-bind-mount-unix", bindMountViaUserns())
	unixSpellings(enc)
	ipcAttempts(enc)
	report(enc, "shared-dir-file", func() error {
		f, err := os.OpenFile(*sharedFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		_, err = f.WriteString(ipcMark)
		return errors.Join(err, f.Close())
	}())
	// The control: the allowed socket itself is reachable.
	report(enc, "allowed-unix-connect", func() error {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Connect(fd, &unix.SockaddrUnix{Name: *allowedUnix})
	}())
}

func splitInts(s string, base int) []uint64 {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		if v, err := strconv.ParseUint(strings.TrimPrefix(f, "0x"), base, 64); err == nil {
			out = append(out, v)
		}
	}
	return out
}

func sockaddrOf(target string) (unix.Sockaddr, error) {
	ap, err := netip.ParseAddrPort(target)
	if err != nil {
		return nil, err
	}
	return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, nil
}

// stealAndConnect takes the victim's socket with pidfd_getfd and connects
// it to a listener in the host's namespace, where the socket was made.
func stealAndConnect(pid, fd int, target string) error {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	return useStolen(pidfd, fd, target)
}

// useStolen takes descriptor fd of the process pidfd refers to, connects
// it to target and writes through it.
func useStolen(pidfd, fd int, target string) error {
	s, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return fmt.Errorf("pidfd_getfd: %w", err)
	}
	defer unix.Close(s)
	return connectAndWrite(s, target, "stolen")
}

// connectAndWrite connects socket s, got by way of how, to target and
// writes through it.
func connectAndWrite(s int, target, how string) error {
	sa, err := sockaddrOf(target)
	if err != nil {
		return err
	}
	if err := unix.Connect(s, sa); err != nil {
		return fmt.Errorf("connect the %s socket: %w", how, err)
	}
	_, err = unix.Write(s, []byte(how))
	return err
}

// dialAllowed connects a stream socket to the allowed unix socket.
func dialAllowed() (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: *allowedUnix}); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("connect the allowed socket: %w", err)
	}
	return fd, nil
}

// handedSocketConnect asks the service behind the allowed unix socket for a
// descriptor, as a host service that passes sockets (systemd's socket
// activation, a privileged helper) would hand one: a TCP socket made
// outside the Trial, in the host's namespace, which it connects to target.
func handedSocketConnect(target string) error {
	fd, err := dialAllowed()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// A victim that cannot answer must not hang the suite.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 10}); err != nil {
		return err
	}
	if _, err := unix.Write(fd, []byte("give")); err != nil {
		return err
	}
	oob := make([]byte, unix.CmsgSpace(4))
	// With SO_RCVTIMEO set, a signal (the Go runtime's preemption)
	// interrupts the wait even under SA_RESTART: wait again.
	var oobn int
	for {
		_, oobn, _, _, err = unix.Recvmsg(fd, make([]byte, 1), oob, 0)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("receive a descriptor: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return fmt.Errorf("no descriptor handed: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return fmt.Errorf("no descriptor handed: %v", err)
	}
	defer unix.Close(fds[0])
	return connectAndWrite(fds[0], target, "handed")
}

// soPeerPidfd is SO_PEERPIDFD (Linux 6.5): a pidfd of a unix socket's peer.
const soPeerPidfd = 77

// stealFromPeer gets a pidfd of the process at the other end of the unix
// socket sock, takes its descriptor fd with pidfd_getfd and connects it.
func stealFromPeer(sock, fd int, target string) error {
	pidfd, err := unix.GetsockoptInt(sock, unix.SOL_SOCKET, soPeerPidfd)
	if err != nil {
		return fmt.Errorf("SO_PEERPIDFD on fd %d: %w", sock, err)
	}
	defer unix.Close(pidfd)
	return useStolen(pidfd, fd, target)
}

// ptracePoke attaches to the victim and writes its mailbox, which makes
// the victim connect its own socket for us.
func ptracePoke(pid int, box uintptr) error {
	// Every ptrace request must come from the thread that attached: on
	// another, the detach fails and the victim stays stopped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceAttach(pid); err != nil {
		return fmt.Errorf("ptrace attach %d: %w", pid, err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil {
		return fmt.Errorf("wait for the tracee: %w", err)
	}
	defer unix.PtraceDetach(pid)
	one := make([]byte, 8)
	one[0] = 1
	if _, err := unix.PtracePokeData(pid, box, one); err != nil {
		return fmt.Errorf("poke: %w", err)
	}
	return nil
}

// procMemWrite writes the victim's mailbox through /proc/PID/mem.
func procMemWrite(pid int, box uint64) error {
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	one := make([]byte, 8)
	one[0] = 1
	_, err = f.WriteAt(one, int64(box))
	return err
}

// tiocsti types a command into every terminal it can reach: its stdio
// and its controlling terminal. Whether it reached the operator's is for
// the test to see in that terminal's input.
func tiocsti() error {
	var errs []error
	typed := 0
	fds := []int{0, 1, 2}
	if tty, err := unix.Open("/dev/tty", unix.O_RDWR|unix.O_NOCTTY, 0); err == nil {
		defer unix.Close(tty)
		fds = append(fds, tty)
	}
	for _, fd := range fds {
		ok := true
		for i := range len(injected) {
			c := injected[i]
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSTI, uintptr(unsafe.Pointer(&c))); errno != 0 {
				errs = append(errs, fmt.Errorf("fd %d: %w", fd, errno))
				ok = false
				break
			}
		}
		if ok {
			typed++
		}
	}
	if typed == 0 {
		return errors.Join(errs...)
	}
	return nil
}

// anySocket makes a socket of family with any type the family offers.
func anySocket(family int) error {
	var last error
	for _, typ := range []int{unix.SOCK_STREAM, unix.SOCK_DGRAM, unix.SOCK_SEQPACKET, unix.SOCK_RAW, unix.SOCK_RDM} {
		fd, err := unix.Socket(family, typ, 0)
		if err == nil {
			_ = unix.Close(fd)
			return nil
		}
		last = err
	}
	return last
}

// bindMountViaUserns makes a user and mount namespace with unshare(1),
// bind-mounts the forbidden socket over the allowed path there and
// connects to it (bindConnect, in the child).
func bindMountViaUserns() error {
	if *allowedUnix == "" || *forbiddenUnix == "" {
		return errSkip("no -allowed-unix/-forbidden-unix")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	out, err := exec.Command("unshare", "-Urm", "--", self, "-mode", "bindconnect",
		"-allowed-unix", *allowedUnix, "-forbidden-unix", *forbiddenUnix).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// unixSpellings connects to the forbidden socket by other spellings of
// its path: through procfs (the process's root and cwd, an O_PATH
// descriptor of its directory or of the socket itself), relative to the
// working directory, and through the Trial's own /tmp (a symlink to the
// socket or to its directory, "..").
func unixSpellings(enc *json.Encoder) {
	dir, base := filepath.Dir(*forbiddenUnix), filepath.Base(*forbiddenUnix)
	connect := func(path string) error {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Connect(fd, &unix.SockaddrUnix{Name: path})
	}
	inDir := func(path string) error {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if err := os.Chdir(dir); err != nil {
			return err
		}
		defer func() { _ = os.Chdir(wd) }()
		return connect(path)
	}
	opath := func(name, path string) error {
		fd, err := unix.Open(name, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return connect(fmt.Sprintf("/proc/self/fd/%d%s", fd, path))
	}
	own, err := os.MkdirTemp("/tmp", "spell-")
	if err != nil {
		own = "/tmp"
	}
	defer os.RemoveAll(own)
	linked := func(target, link, path string) error {
		if err := os.Symlink(target, link); err != nil {
			return err
		}
		return connect(path)
	}
	report(enc, "unix-via-proc-root", connect("/proc/self/root"+*forbiddenUnix))
	report(enc, "unix-via-proc-cwd", inDir("/proc/self/cwd/"+base))
	report(enc, "unix-relative", inDir(base))
	report(enc, "unix-via-opath-dir", opath(dir, "/"+base))
	report(enc, "unix-via-opath-socket", opath(*forbiddenUnix, ""))
	report(enc, "unix-tmp-symlink", linked(*forbiddenUnix, own+"/s", own+"/s"))
	report(enc, "unix-tmp-dir-symlink", linked(dir, own+"/d", own+"/d/"+base))
	report(enc, "unix-tmp-dotdot", connect("/tmp/.."+*forbiddenUnix))
}

// bindConnect runs inside the user namespace: bind the forbidden socket
// over the allowed path, then connect to "the allowed one".
func bindConnect() int {
	if err := unix.Mount(*forbiddenUnix, *allowedUnix, "", unix.MS_BIND, ""); err != nil {
		fmt.Println("bind mount:", err)
		return 1
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err == nil {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: *allowedUnix})
	}
	if err == nil {
		_, err = unix.Write(fd, []byte("bound"))
	}
	if err != nil {
		fmt.Println("connect through the bind mount:", err)
		return 1
	}
	return 0
}

// mailboxes are written from outside (ptrace, /proc/PID/mem); a Go heap
// object never moves, so their addresses hold.
var mailboxes [3]uint64

// victimSockets is how many unconnected TCP sockets the victim holds, one
// per attempt that takes one: pidfd, ptrace, /proc/PID/mem, the peer of
// the Trial's stdio and of its allowed unix socket, the one it hands
// over, and the one it connects when a signal comes.
const (
	victimSockets = 7
	handedSocket  = 5
	signalSocket  = 6
)

// victim is a process outside the Trial of the same uid, holding
// unconnected TCP sockets and, with -listen-unix, serving a unix socket
// (keeping every connection open). It prints its pid, the sockets'
// descriptors and its mailboxes' addresses, then connects socket i to
// target i as soon as mailbox i is written. It ends after a minute.
func victim() {
	tg := strings.Split(*targets, ",")
	// The last socket is the one handed to whoever asks on the unix socket.
	handed := make(chan int, 1)
	if *listenUnix != "" {
		ln, err := net.Listen("unix", *listenUnix)
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go serveVictimConn(c.(*net.UnixConn), handed)
			}
		}()
	}
	var fds []string
	for i := range victimSockets {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fds = append(fds, strconv.Itoa(fd))
		if i == handedSocket {
			handed <- fd
		}
	}
	var boxes []string
	for i := range mailboxes {
		boxes = append(boxes, fmt.Sprintf("%x", uintptr(unsafe.Pointer(&mailboxes[i]))))
	}
	ipc, err := victimIPCObjects(*keySecret)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	// SIGUSR1 (else the end of the victim) is the sign that a Trial
	// signalled it: it connects that socket.
	signalled := make(chan os.Signal, 1)
	signal.Notify(signalled, syscall.SIGUSR1)
	go func() {
		<-signalled
		fd, _ := strconv.Atoi(fds[signalSocket])
		if sa, err := sockaddrOf(tg[signalSocket]); err == nil && unix.Connect(fd, sa) == nil {
			_, _ = unix.Write(fd, []byte("victim"))
		}
	}()
	fmt.Printf("%d %s %s %s\n", os.Getpid(), strings.Join(fds, ","), strings.Join(boxes, ","), ipc)
	done := [3]bool{}
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		for i := range mailboxes {
			if done[i] || atomic.LoadUint64(&mailboxes[i]) == 0 || i >= len(tg) {
				continue
			}
			done[i] = true
			fd, _ := strconv.Atoi(fds[i])
			if sa, err := sockaddrOf(tg[i]); err == nil && unix.Connect(fd, sa) == nil {
				_, _ = unix.Write(fd, []byte("victim"))
			}
		}
	}
}

// serveVictimConn holds a connection to the victim's unix socket open
// until the peer closes it; a peer that writes "give" gets the handed
// socket, passed as SCM_RIGHTS.
func serveVictimConn(c *net.UnixConn, handed chan int) {
	defer c.Close()
	buf := make([]byte, 4)
	if n, err := io.ReadFull(c, buf); err != nil || string(buf[:n]) != "give" {
		_, _ = io.Copy(io.Discard, c)
		return
	}
	fd := <-handed
	handed <- fd
	_, _, _ = c.WriteMsgUnix([]byte{0}, unix.UnixRights(fd), nil)
	_, _ = io.Copy(io.Discard, c)
}
