//go:build linux

package fdpass

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// pidfdPID is the pid a pidfd names, from /proc/self/fdinfo (-1: the
// process has ended and been reaped).
func pidfdPID(t *testing.T, fd int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pid:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("fd %d is no pidfd:\n%s", fd, b)
	return ""
}

// connectedChild starts a child process that connects to a packet socket
// of this test, and returns this end of the connection and the child.
func connectedChild(t *testing.T) (*net.UnixConn, *exec.Cmd) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeerPidfdChild$")
	cmd.Env = append(os.Environ(), "FDPASS_CHILD_SOCKET="+path)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	w, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.Close() // the child exits on its stdin's end
		_ = cmd.Wait()
	})
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, cmd
}

// TestPeerPidfdChild is the child of connectedChild: it connects, then
// waits for its stdin to end.
func TestPeerPidfdChild(t *testing.T) {
	path := os.Getenv("FDPASS_CHILD_SOCKET")
	if path == "" {
		t.Skip("only as connectedChild's child")
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = os.Stdin.Read(make([]byte, 1))
}

// The peer's pidfd names the process that connected, taken the kernel's
// way where it has SO_PEERPIDFD (6.5 and later) and from its pid where it
// has not; both name the same live process. Once that process has ended,
// the kernel's pidfd still names it, ended: never a process that took its
// pid since.
func TestPeerPidfd(t *testing.T) {
	c, child := connectedChild(t)
	want := fmt.Sprint(child.Process.Pid)
	fd, how, err := PeerPidfd(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("this kernel: %s", how)
	if kernelHasPeerPidfd(t, c) && how != pidfdFromSocket {
		t.Errorf("this kernel has SO_PEERPIDFD, and the pidfd was taken by %s", how)
	}
	if got := pidfdPID(t, fd); got != want {
		t.Errorf("the pidfd (%s) names pid %s, the peer is %s", how, got, want)
	}
	_ = unix.Close(fd)
	// The older kernels' way, whatever this kernel has.
	fd, how, err = peerPidfd(c, -1)
	if err != nil || how != pidfdFromPID {
		t.Fatalf("without the socket option: %q, %v", how, err)
	}
	if got := pidfdPID(t, fd); got != want {
		t.Errorf("the pidfd from the pid names pid %s, the peer is %s", got, want)
	}
	_ = unix.Close(fd)

	// The peer ends and is reaped; its pid is free to be reused.
	_ = child.Process.Kill()
	_ = child.Wait()
	fd, how, err = PeerPidfd(c)
	switch {
	case how == pidfdFromPID:
		t.Logf("no SO_PEERPIDFD on this kernel: a pidfd of an ended peer is taken from its pid (%v)", err)
	case err != nil:
		t.Logf("SO_PEERPIDFD of a reaped peer: %v (this kernel makes no pidfd for it: the hand-over stops there)", err)
	default:
		if got := pidfdPID(t, fd); got != "-1" {
			t.Errorf("SO_PEERPIDFD of a reaped peer names pid %s, want the ended process (-1)", got)
		}
		_ = unix.Close(fd)
	}
}

// kernelHasPeerPidfd asks the kernel for SO_PEERPIDFD on c directly.
func kernelHasPeerPidfd(t *testing.T, c *net.UnixConn) bool {
	t.Helper()
	fd, err := SocketPidfd(c)
	if err == nil {
		_ = unix.Close(fd)
	}
	return !errors.Is(err, unix.ENOPROTOOPT)
}
