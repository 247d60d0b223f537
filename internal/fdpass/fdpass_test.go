//go:build linux

package fdpass

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testkit"
)

type msg struct {
	Kind  string   `json:"kind"`
	Names []string `json:"names"`
}

// A message arrives whole with its files, which are new descriptors of
// the same open files, close-on-exec; messages keep their boundaries.
func TestSendRecvFiles(t *testing.T) {
	a, b := testkit.SeqpacketPair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := Send(a, msg{Kind: "offer", Names: []string{"r", "w"}}, r, w); err != nil {
		t.Fatal(err)
	}
	if err := Send(a, msg{Kind: "second"}); err != nil {
		t.Fatal(err)
	}
	var got msg
	files, err := Recv(b, &got)
	if err != nil {
		t.Fatal(err)
	}
	if got.Kind != "offer" || len(got.Names) != 2 || len(files) != 2 {
		t.Fatalf("got %+v with %d files", got, len(files))
	}
	for _, f := range files {
		defer f.Close()
		flags, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("a received descriptor is not close-on-exec: %v %v", flags, err)
		}
	}
	// The received write end writes into the pipe this test holds.
	if _, err := files[1].Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if n, err := r.Read(buf); n != 1 || err != nil || buf[0] != 'x' {
		t.Fatalf("read %d %q %v", n, buf, err)
	}
	var second msg
	if files, err := Recv(b, &second); err != nil || second.Kind != "second" || len(files) != 0 {
		t.Fatalf("second message: %+v, %d files, %v", second, len(files), err)
	}
}

// What cannot go as one message is refused before anything is sent;
// what arrives broken is an error, its files closed, not leaked.
func TestRefusals(t *testing.T) {
	a, b := testkit.SeqpacketPair(t)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	many := make([]*os.File, MaxFiles+1)
	for i := range many {
		many[i] = f
	}
	if err := Send(a, msg{}, many...); err == nil || !strings.Contains(err.Error(), "at most 250") {
		t.Errorf("%d files in one message: %v", len(many), err)
	}
	if err := Send(a, msg{Names: []string{strings.Repeat("x", maxMessage)}}); err == nil || !strings.Contains(err.Error(), "byte message") {
		t.Errorf("an oversized message: %v", err)
	}
	// Not JSON, with a file attached: an error, and the file closed.
	before := testkit.CountFDs(t)
	rights := unix.UnixRights(int(f.Fd()))
	if _, _, err := a.WriteMsgUnix([]byte("{not json"), rights, nil); err != nil {
		t.Fatal(err)
	}
	var m msg
	if files, err := Recv(b, &m); err == nil || files != nil {
		t.Fatalf("a message that is not JSON: %d files, %v", len(files), err)
	}
	if after := testkit.CountFDs(t); after != before {
		t.Errorf("open descriptors %d before, %d after a refused message", before, after)
	}
	// A closed peer reads as an error, not as an empty message.
	_ = a.Close()
	if _, err := Recv(b, &m); err == nil {
		t.Error("Recv from a closed peer: no error")
	}
}

// ListenAt puts a root-only socket at the path in one rename, replacing
// what was there; root of this PID namespace passes the peer check from
// both ends.
func TestPrivilegedListenAtAndRootPeer(t *testing.T) {
	privtest.Require(t)
	path := filepath.Join(t.TempDir(), "x.sock")
	if err := os.WriteFile(path, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v, want a socket of mode 0600", path, fi.Mode(), err)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.AcceptUnix()
		if err == nil {
			err = CheckPeer(c)
			_ = c.Close()
		}
		accepted <- err
	}()
	c, err := Dial(path)
	if err != nil {
		t.Fatalf("dial as root: %v", err)
	}
	_ = c.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("the listener's check of a root dialer: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".bind-*")); len(m) != 0 {
		t.Errorf("left behind: %v", m)
	}
}

// A peer that is not root, or is root in a PID namespace below this one
// (a Trial's, a container's), is refused by name.
func TestPrivilegedRootPeerRefuses(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "/usr/bin/python3") // Debian's: one uid 65534 can run
	path := filepath.Join(privtest.SharedDir(t, "fdpass-"), "x.sock")
	ln, err := ListenAt("unixpacket", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(path, 0o666); err != nil { // let uid 65534 connect
		t.Fatal(err)
	}
	dial := `import socket,sys,time; s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET); s.connect(sys.argv[1]); time.sleep(5)`
	for _, c := range []struct {
		name string
		attr *syscall.SysProcAttr
		why  string
	}{
		{"uid 65534", &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}, "runs as uid 65534, not root"},
		{"root in a PID namespace below", &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}, "in a PID namespace"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command("/usr/bin/python3", "-c", dial, path)
			cmd.SysProcAttr = c.attr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			if err := ln.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
				t.Fatal(err)
			}
			conn, err := ln.AcceptUnix()
			if err != nil {
				t.Fatalf("the dialer did not connect: %v", err)
			}
			defer conn.Close()
			err = CheckPeer(conn)
			if err == nil || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("the peer check: %v, want %q", err, c.why)
			}
			if errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		})
	}
}
