//go:build linux

// Package fdpass sends JSON messages with open files attached
// (SCM_RIGHTS) over unix SOCK_SEQPACKET sockets, between root processes
// of this PID namespace: the agent handing its listeners to its
// successor, and the keeper that holds them across a crash. A packet
// socket keeps each message and its files together; a stream socket
// could merge or split them.
package fdpass

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// MaxFiles is how many files one message carries at most: the kernel's
// SCM_MAX_FD is 253; callers batch beyond it.
const MaxFiles = 250

// maxMessage bounds one message's JSON. The largest is a hand-over's
// offer: each Trial's log size and open count, and MaxFiles names.
const maxMessage = 1 << 20

// bufs are Recv's buffers: a message's bytes are decoded before Recv
// returns, and a buffer this large is worth keeping.
var bufs = sync.Pool{New: func() any { b := make([]byte, maxMessage); return &b }}

// Listen makes a root-only packet socket at path (see ListenAt).
func Listen(path string) (*net.UnixListener, error) { return ListenAt("unixpacket", path) }

// ListenAt makes a root-only unix socket of network ("unix",
// "unixpacket") and puts it at path in one rename, replacing whatever
// was there: a process that still listens on the socket it replaces keeps
// serving the connections that socket has, and every connection from
// then on comes here. A socket's peer credentials are its creator's, so a
// process that takes over a socket path makes its own rather than
// inheriting one. It is created under umask 0177, so that no other user
// can connect before the rename.
func ListenAt(network, path string) (*net.UnixListener, error) {
	ln, tmp, err := ListenTemp(network, path)
	if err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = ln.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return ln, nil
}

// ListenTemp is ListenAt's first half: the socket, bound at a temporary
// path beside path (returned), for the caller to rename. It is bound in a
// directory of its own, mode 0700, so that no other user can connect
// before it is chmod 0600; the process's umask is left alone.
func ListenTemp(network, path string) (*net.UnixListener, string, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	private, err := os.MkdirTemp(dir, ".bind-")
	if err != nil {
		return nil, "", err
	}
	defer os.Remove(private)
	bound := filepath.Join(private, "s")
	ln, err := net.ListenUnix(network, &net.UnixAddr{Name: bound, Net: network})
	if err != nil {
		return nil, "", fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false) // the path is renamed; its owner removes it
	tmp := fmt.Sprintf("%s.%d.new", path, os.Getpid())
	err = os.Chmod(bound, 0o600)
	if err == nil {
		err = os.Rename(bound, tmp)
	}
	if err != nil {
		_ = ln.Close()
		_ = os.Remove(bound)
		return nil, "", fmt.Errorf("listen on %s: %w", path, err)
	}
	return ln, tmp, nil
}

// Dial connects to the packet socket at path and checks that root of this
// PID namespace listens there (CheckPeer).
func Dial(path string) (*net.UnixConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	if err := CheckPeer(c); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// CheckPeer refuses a peer that is not root in this PID namespace: only
// such a process may give or take listeners that serve Trials.
func CheckPeer(c *net.UnixConn) error {
	why, err := RootPeer(c)
	if err == nil && why != "" {
		err = errors.New("the peer " + why)
	}
	return err
}

// RootPeer says why the process at the other end of c is not root in
// this PID namespace ("": it is), from its credentials (SO_PEERCRED: of
// the process that made the socket, for a listener) and /proc. A process
// in a Trial runs in a PID namespace below this one.
func RootPeer(c *net.UnixConn) (why string, err error) {
	cred, err := peerCred(c)
	if err != nil {
		return "", err
	}
	switch {
	case cred.Uid != 0:
		return fmt.Sprintf("runs as uid %d, not root", cred.Uid), nil
	case cred.Pid == 0:
		return "runs in a PID namespace this one cannot see", nil
	}
	// NSpid lists the pid in every PID namespace from this /proc's down:
	// more than one, and the process lives in a namespace below this one.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cred.Pid))
	if err != nil {
		return fmt.Sprintf("is process %d, which cannot be read (%v)", cred.Pid, err), nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "NSpid:" && len(f) != 2 {
			return fmt.Sprintf("runs in a PID namespace below this one (a Trial's, or a container's): process %d", cred.Pid), nil
		}
	}
	return "", nil
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, cerr
}

// PeerPID is the pid of the process at the other end of c (0: unknown).
func PeerPID(c *net.UnixConn) int {
	if cred, err := peerCred(c); err == nil {
		return int(cred.Pid)
	}
	return 0
}

// Ways PeerPidfd can take a peer's pidfd, as it reports them.
const (
	pidfdFromSocket = "SO_PEERPIDFD"
	pidfdFromPID    = "pidfd_open of its pid (no SO_PEERPIDFD: a kernel before 6.5)"
)

// SocketPidfd is the kernel's pidfd (close-on-exec) of the process that
// made c's other end (SO_PEERPIDFD, Linux 6.5): it names that process
// even once it has exited and its pid is reused. A kernel without it
// gives ENOPROTOOPT.
func SocketPidfd(c *net.UnixConn) (int, error) { return socketPidfd(c, unix.SO_PEERPIDFD) }

func socketPidfd(c *net.UnixConn, opt int) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var serr error
	if err := raw.Control(func(s uintptr) { fd, serr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, opt) }); err != nil {
		return -1, err
	}
	return fd, serr
}

// PeerPidfd is a pidfd (close-on-exec) of the process at the other end of
// c, and how it was taken: SocketPidfd's, or on a kernel without it one
// opened from the pid, which names whatever process has that pid by then.
func PeerPidfd(c *net.UnixConn) (fd int, how string, err error) {
	return peerPidfd(c, unix.SO_PEERPIDFD)
}

// peerPidfd is PeerPidfd asking for socket option opt: a test names one
// no kernel has, to take the older kernels' way.
func peerPidfd(c *net.UnixConn, opt int) (int, string, error) {
	fd, serr := socketPidfd(c, opt)
	how := pidfdFromSocket
	if errors.Is(serr, unix.ENOPROTOOPT) {
		how = pidfdFromPID
		fd, serr = -1, nil
		if pid := PeerPID(c); pid <= 0 {
			serr = errors.New("the peer's pid is unknown")
		} else {
			fd, serr = unix.PidfdOpen(pid, 0) // close-on-exec, as every pidfd
		}
	}
	if serr != nil {
		return -1, how, fmt.Errorf("pidfd of the peer (%s): %w", how, serr)
	}
	return fd, how, nil
}

// Send writes msg as one message, with files attached (at most MaxFiles).
// The files stay open here: the receiver gets its own descriptors.
func Send(c *net.UnixConn, msg any, files ...*os.File) error {
	if len(files) > MaxFiles {
		return fmt.Errorf("fdpass: %d files in one message, at most %d", len(files), MaxFiles)
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	if len(b) > maxMessage {
		return fmt.Errorf("fdpass: a %d-byte message, at most %d", len(b), maxMessage)
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			// Not f.Fd(): it makes the descriptor blocking, and the flag
			// belongs to the open socket, which a listener shares: its
			// Accept would then block in the kernel, and Close with it.
			raw, err := f.SyscallConn()
			if err != nil {
				return err
			}
			if err := raw.Control(func(fd uintptr) { fds[i] = int(fd) }); err != nil {
				return err
			}
		}
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	if err == nil && (n != len(b) || oobn != len(oob)) {
		err = fmt.Errorf("fdpass: short write (%d of %d bytes)", n, len(b))
	}
	return err
}

// Recv reads one message into msg and returns the files that came with
// it, which the caller owns. A message cut short (larger than the buffer,
// or more files than the control buffer holds) is an error, and its
// files are closed.
func Recv(c *net.UnixConn, msg any) ([]*os.File, error) {
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	buf := *bp
	oob := make([]byte, unix.CmsgSpace(MaxFiles*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	files, ferr := parseRights(oob[:oobn])
	switch {
	case ferr != nil:
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		ferr = errors.New("fdpass: a message was cut short")
	case n == 0:
		ferr = errors.New("fdpass: the peer closed the connection")
	default:
		ferr = json.Unmarshal(buf[:n], msg)
	}
	if ferr != nil {
		for _, f := range files {
			_ = f.Close()
		}
		return nil, ferr
	}
	return files, nil
}

func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	scms, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	for _, m := range scms {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			// Go's ReadMsgUnix asks for MSG_CMSG_CLOEXEC: no command a
			// Trial runs inherits these.
			files = append(files, os.NewFile(uintptr(fd), "fdpass"))
		}
	}
	return files, nil
}
