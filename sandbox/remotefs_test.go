//go:build linux

package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/trial"
)

func TestRemoteType(t *testing.T) {
	for fstype, want := range map[string]bool{
		"fuse": true, "fuse.sshfs": true, "fuse.fuse-overlayfs": true, "fuseblk": true, "fuseblk.ntfs-3g": true,
		"nfs": true, "nfs4": true, "cifs": true, "smb3": true, "9p": true, "ceph": true,
		// The hypervisor host's shared folders: its disk, as the VM's is.
		"virtiofs": false, "vboxsf": false, "prl_fs": false, "vmhgfs": false,
		"fuse.": false, "fusectl": false, "fuseblkx": false, "nfsd": false, "rpc_pipefs": false,
		"tmpfs": false, "ext4": false, "overlay": false, "autofs": false, "": false,
	} {
		if got := remoteType(fstype); got != want {
			t.Errorf("remoteType(%q) = %v, want %v", fstype, got, want)
		}
	}
}

// fuseMount is a fuse-overlayfs mount served by a daemon of the test's,
// which logs every name it is asked to look up.
type fuseMount struct {
	dir    string
	log    *os.File
	daemon *os.Process
}

// newFUSEMount mounts fuse-overlayfs with allow_other, as root, on a
// directory in /run (which a Trial sees: its /tmp is its own), over a
// lower directory holding mark; the mount, the daemon and the
// directories go at cleanup.
func newFUSEMount(t *testing.T) *fuseMount {
	t.Helper()
	privtest.Require(t)
	bin, err := exec.LookPath("fuse-overlayfs")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no fuse-overlayfs (make test-deps installs it)")
		}
		t.Skip("no fuse-overlayfs (make test-deps installs it)")
	}
	top, err := os.MkdirTemp("/run", "trialnet-test-fuse-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(top) })
	for _, d := range []string{"", "/lower", "/upper", "/work", "/mnt"} {
		if err := os.MkdirAll(top+d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(top+d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(top+"/lower/mark", []byte("served"), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(top + "/daemon.log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = log.Close() })
	m := &fuseMount{dir: top + "/mnt", log: log}
	// debug keeps it in the foreground, logging each lookup's name.
	cmd := exec.Command(bin, "-o", "debug,allow_other,lowerdir="+top+"/lower,upperdir="+top+"/upper,workdir="+top+"/work", m.dir)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m.daemon = cmd.Process
	t.Cleanup(func() {
		_ = unix.Unmount(m.dir, unix.MNT_DETACH)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// Bounded: the daemon mounts at once, or has failed.
	for i := 0; ; i++ {
		var st unix.Statfs_t
		if err := unix.Statfs(m.dir, &st); err == nil && st.Type == unix.FUSE_SUPER_MAGIC {
			return m
		}
		if i == 200 {
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("fuse-overlayfs did not mount on %s: %s", m.dir, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// asked reports whether the daemon was asked to look name up.
func (m *fuseMount) asked(t *testing.T, name string) bool {
	t.Helper()
	b, err := os.ReadFile(m.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(b, []byte("name="+name+")"))
}

// mounted reports whether the mountinfo text mi lists a mount on dir.
func mounted(mi, dir string) bool {
	return strings.Contains(mi, " "+dir+" ")
}

// A lookup beneath a FUSE mount hands the name to the daemon serving it,
// outside the Trial (sshfs, rclone, s3fs send it on to their remote): a
// Trial of uid nobody did so through a root fuse-overlayfs mount with
// allow_other. The init detaches every FUSE and network mount but the
// root's and those holding the first command's working directory, which
// the Trial keeps for its later commands; another one is gone there too.
func TestPrivilegedNoFUSELookupFromTheTrial(t *testing.T) {
	m := newFUSEMount(t)
	// The control: a lookup on the host reaches the daemon's log.
	if _, err := os.Stat(m.dir + "/host-control"); err == nil || !m.asked(t, "host-control") {
		t.Fatalf("a host lookup beneath %s: %v, and the daemon logged no host-control", m.dir, err)
	}
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	code, out := runProbeAs(t, tr, nobody, Command{}, "read", m.dir+"/exfiltrated.example.com")
	if m.asked(t, "exfiltrated.example.com") {
		t.Errorf("a Trial's lookup reached the FUSE daemon outside it (the probe: %d %q)", code, out)
	}
	if code, out := runProbeAs(t, tr, nobody, Command{}, "read", "/proc/self/mountinfo"); code != probeOK || mounted(out, m.dir) {
		t.Errorf("the Trial's mounts (%d): %s\nwant none on %s", code, out, m.dir)
	}

	// Where the first command works beneath one, that one is kept for
	// every command of the Trial; another is detached all the same.
	other := newFUSEMount(t)
	kept := newTrial(t, h, trial.Spec{})
	if code, out := runProbeAs(t, kept, nobody, Command{Dir: m.dir}, "read", "mark"); code != probeOK || !strings.HasPrefix(out, "served") {
		t.Errorf("the mark beneath the first command's working directory %s: %d %q, want it read", m.dir, code, out)
	}
	if code, out := runProbeAs(t, kept, nobody, Command{}, "read", m.dir+"/mark"); code != probeOK || !strings.HasPrefix(out, "served") {
		t.Errorf("the mark beneath %s, from a later command of the Trial: %d %q, want it read", m.dir, code, out)
	}
	code, out = runProbeAs(t, kept, nobody, Command{}, "read", other.dir+"/kept.example.com")
	if other.asked(t, "kept.example.com") {
		t.Errorf("a lookup beneath another FUSE mount reached its daemon (the probe: %d %q)", code, out)
	}
}

// The Go set-up's hideRemoteFS, run on a thread in a mount namespace of
// its own working beneath one FUSE mount: that one is kept, and a bind
// of it elsewhere (the same daemon), the other detached, and the working
// directory is / after.
func TestPrivilegedGoHideRemoteFS(t *testing.T) {
	work, other := newFUSEMount(t), newFUSEMount(t)
	bound := filepath.Join(filepath.Dir(work.dir), "bound")
	if err := os.Mkdir(bound, 0o755); err != nil {
		t.Fatal(err)
	}
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		if err := unix.Mount(work.dir, bound, "", unix.MS_BIND, ""); err != nil {
			return []string{err.Error()}
		}
		if err := unix.Chdir(work.dir); err != nil {
			return []string{err.Error()}
		}
		if err := hideRemoteFS(); err != nil {
			return []string{err.Error()}
		}
		mi, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			return []string{err.Error()}
		}
		if !mounted(string(mi), work.dir) {
			bad = append(bad, "the FUSE mount holding the working directory was detached: "+work.dir)
		}
		if !mounted(string(mi), bound) {
			bad = append(bad, "a bind of the FUSE mount holding the working directory was detached: "+bound)
		}
		if mounted(string(mi), other.dir) {
			bad = append(bad, "a FUSE mount is left: "+other.dir)
		}
		if wd, err := unix.Getwd(); wd != "/" {
			bad = append(bad, fmt.Sprintf("the working directory after: %q %v, want /", wd, err))
		}
		return bad
	})
}

// Its working directory under a mount that covers it (the Trial's own
// /tmp over a host directory there) is out of view: nothing of it to
// keep, and the FUSE mounts are detached all the same; the walk failed
// the start.
func TestPrivilegedGoHideRemoteFSCoveredWorkdir(t *testing.T) {
	other := newFUSEMount(t)
	top := t.TempDir()
	dir := filepath.Join(top, "work")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		if err := unix.Chdir(dir); err != nil {
			return []string{err.Error()}
		}
		if err := unix.Mount("tmpfs", top, "tmpfs", 0, "size=4k"); err != nil {
			return []string{err.Error()}
		}
		if err := hideRemoteFS(); err != nil {
			return []string{err.Error()}
		}
		mi, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			return []string{err.Error()}
		}
		if mounted(string(mi), other.dir) {
			bad = append(bad, "a FUSE mount is left: "+other.dir)
		}
		return bad
	})
}

// A FUSE daemon that does not answer (stopped here; a network file
// server gone away is the same) holds up no Trial's start: the init
// finds what is mounted on its point from cached attributes, asking
// the daemon nothing.
func TestPrivilegedStoppedFUSEDaemonHoldsNoTrial(t *testing.T) {
	m := newFUSEMount(t)
	if err := m.daemon.Signal(unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	if code, out := runProbeAs(t, tr, nobody, Command{}, "read", "/proc/self/mountinfo"); code != probeOK || mounted(out, m.dir) {
		t.Errorf("the Trial's mounts (%d): %s\nwant none on %s", code, out, m.dir)
	}
}

// An allowed unix socket on a FUSE mount, which the init detaches, is
// refused at create, not silently out of reach; one on the root's file
// system is not.
func TestPrivilegedUnixAllowOnFUSEIsRefused(t *testing.T) {
	m := newFUSEMount(t)
	h := &Host{NetnsDir: t.TempDir()}
	p := m.dir + "/agent.sock"
	if err := h.checkSpec(trial.Spec{ID: "u", UnixAllow: []string{p}, UnixOpen: true}); err == nil || !strings.Contains(err.Error(), "fuse.fuse-overlayfs mount, which trialnet detaches") {
		t.Errorf("%s: %v, want a refusal naming the FUSE mount", p, err)
	}
	if err := checkUnixPathsOffRemoteFS([]string{"/run/trialnet-test-none/a.sock"}); err != nil {
		t.Errorf("a path on the root's file system: %v", err)
	}
	// Beneath an own directory too: the init binds such a socket into
	// the Trial's own /tmp, and the bind, of the FUSE mount's inode, is
	// a FUSE mount that hideRemoteFS detaches all the same.
	own, err := os.MkdirTemp("/tmp", "trialnet-test-fuse-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(own) })
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() []string {
		if err := unix.Mount(m.dir, own, "", unix.MS_BIND, ""); err != nil {
			return []string{err.Error()}
		}
		p := own + "/agent.sock"
		if err := checkUnixPathsOffRemoteFS([]string{p}); err == nil || !strings.Contains(err.Error(), "fuse.fuse-overlayfs mount, which trialnet detaches") {
			return []string{fmt.Sprintf("%s, beneath the Trial's own /tmp: %v, want a refusal naming the FUSE mount", p, err)}
		}
		return nil
	})
}
