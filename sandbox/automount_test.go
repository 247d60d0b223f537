//go:build linux

package sandbox

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// autofsIocFail is AUTOFS_IOC_FAIL: the daemon's answer that a mount failed.
const autofsIocFail = 0x9361

// autofsDaemon is the automount daemon's side of an indirect autofs mount
// at a directory of its own under /run: it records each name a lookup
// asked it to mount, and fails it. The test process is the daemon (its
// process group's lookups trigger nothing).
type autofsDaemon struct {
	dir   string
	mu    sync.Mutex
	names []string
}

func newAutofsDaemon(t *testing.T) *autofsDaemon {
	t.Helper()
	if b, _ := os.ReadFile("/proc/filesystems"); !bytes.Contains(b, []byte("\tautofs\n")) {
		if out, err := exec.Command("modprobe", "autofs4").CombinedOutput(); err != nil {
			privtest.RequireKernel(t, fmt.Errorf("no autofs (modprobe autofs4: %v %s)", err, out))
		}
	}
	dir, err := os.MkdirTemp("/run", "trialnet-test-autofs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("fd=%d,pgrp=%d,minproto=5,maxproto=5,indirect", w.Fd(), unix.Getpgrp())
	err = unix.Mount("trialnet-test", dir, "autofs", 0, opts)
	w.Close()
	if err != nil {
		r.Close()
		t.Fatalf("mount autofs on %s: %v", dir, err)
	}
	ioctlFd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := &autofsDaemon{dir: dir}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// struct autofs_v5_packet: hdr (proto, type), token, dev, ino,
		// uid, gid, pid, tgid, len, name[256]; 304 bytes as the kernel
		// writes it.
		pkt := make([]byte, 304)
		for {
			n, err := r.Read(pkt)
			if err != nil || n < 300 {
				return
			}
			token := binary.NativeEndian.Uint32(pkt[8:])
			l := binary.NativeEndian.Uint32(pkt[40:])
			d.mu.Lock()
			d.names = append(d.names, string(pkt[44:44+min(l, 255)]))
			d.mu.Unlock()
			_ = unix.IoctlSetInt(ioctlFd, autofsIocFail, int(token))
		}
	}()
	t.Cleanup(func() {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		_ = unix.Close(ioctlFd)
		r.Close()
		<-done
	})
	return d
}

// mountKept mounts what the daemon would have mounted for a lookup (a
// home on NFS): a tmpfs with a mark, at kept (its group may make the
// point), and returns its path.
func (d *autofsDaemon) mountKept(t *testing.T) string {
	t.Helper()
	kept := d.dir + "/kept"
	if err := os.Mkdir(kept, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", kept, "tmpfs", 0, "mode=0755,size=16k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(kept, unix.MNT_DETACH) })
	if err := os.WriteFile(kept+"/mark", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	return kept
}

func (d *autofsDaemon) asked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.names...)
}

// A lookup under an autofs mount point hands the name to the host's
// automount daemon (root, in the host's namespaces), which acts on it
// outside the Trial: with the -hosts map it resolves the name by DNS and
// asks that host for its NFS exports; a wildcard map asks the NFS server
// for the name, an LDAP map the directory. The Trial's mount namespace
// keeps no autofs mount, so no name reaches the daemon.
func TestPrivilegedNoAutomountFromTheTrial(t *testing.T) {
	d := newAutofsDaemon(t)
	kept := d.mountKept(t)
	// The control: a host process outside the daemon's group reaches it.
	if out, err := exec.Command("setsid", "ls", d.dir+"/host-control/").CombinedOutput(); err == nil {
		t.Fatalf("ls of an autofs key that fails: %s", out)
	}
	before := d.asked()
	if len(before) == 0 || slices.ContainsFunc(before, func(n string) bool { return n != "host-control" }) {
		t.Fatalf("the daemon was asked %q, want the host's control lookup", before)
	}

	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	code, out := runProbeAs(t, tr, nobody, Command{}, "ls", d.dir+"/exfiltrated.example.com/")
	time.Sleep(100 * time.Millisecond) // a packet already written is read by now
	if got := d.asked(); len(got) != len(before) {
		t.Errorf("a Trial's lookup reached the automount daemon outside it: asked %q (the probe: %d %q)", got[len(before):], code, strings.TrimSpace(out))
	}
	if code, out := runProbeAs(t, tr, nobody, Command{}, "read", kept+"/mark"); code != probeOK || !strings.HasPrefix(out, "kept") {
		t.Errorf("what was mounted beneath the autofs, in the Trial: %d %q, want its mark", code, out)
	}
	if code, out := runProbeAs(t, tr, nobody, Command{}, "ls", d.dir); code != probeOK || out != "kept" {
		t.Errorf("the autofs point in the Trial: %d %q, want only what was mounted there", code, out)
	}
}

// The Go set-up's hideAutofs, run on a thread in a mount namespace of its
// own: no autofs mount is left, and what was mounted beneath one is
// still there, alone.
func TestPrivilegedGoHideAutofs(t *testing.T) {
	d := newAutofsDaemon(t)
	kept := d.mountKept(t)
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		if err := hideAutofs(); err != nil {
			bad = append(bad, err.Error())
			return
		}
		mi, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			bad = append(bad, err.Error())
			return
		}
		for _, l := range strings.Split(string(mi), "\n") {
			if _, post, _ := strings.Cut(l, " - "); strings.HasPrefix(post, "autofs ") {
				bad = append(bad, "an autofs mount is left: "+l)
			}
		}
		if b, err := os.ReadFile(kept + "/mark"); err != nil || string(b) != "kept" {
			bad = append(bad, fmt.Sprintf("what was mounted beneath the autofs: %q %v, want its mark", b, err))
		}
		if names, err := dirNames(d.dir); err != nil || names != "kept" {
			bad = append(bad, fmt.Sprintf("%s: %q %v, want only what was mounted there", d.dir, names, err))
		}
		return bad
	})
}
