//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/internal/privtest"
)

// hostSockets serves a stream and a datagram socket of the host that any
// uid may open (mode 0666, in a directory every uid can search), counting
// what reaches them: what the Trial must not reach except by trialnet's
// refusal.
type hostSockets struct {
	dir, stream, dgram string
	streamHits         *atomic.Int64
	dgramHits          atomic.Int64
}

func newHostSockets(t *testing.T) *hostSockets {
	t.Helper()
	h := &hostSockets{dir: privtest.SharedDir(t, "hostsock-")}
	h.stream, h.dgram = filepath.Join(h.dir, "host.sock"), filepath.Join(h.dir, "host.dgram")
	h.streamHits = privtest.ServeUnix(t, h.stream, "")
	pc, err := net.ListenPacket("unixgram", h.dgram)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	if err := os.Chmod(h.dgram, 0o666); err != nil {
		t.Fatal(err)
	}
	go func() {
		var b [64]byte
		for {
			if _, _, err := pc.ReadFrom(b[:]); err != nil {
				return
			}
			h.dgramHits.Add(1)
		}
	}()
	return h
}

// hits is how often the Trial reached the host's sockets.
func (h *hostSockets) hits() int64 { return h.streamHits.Load() + h.dgramHits.Load() }

// A Trial's own unix sockets work, of every type, in each of its own
// directories, and are not counted as refusals; no host process sees
// them.
func TestPrivilegedOwnUnixSockets(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	before, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ownDirs {
		for typ := range unixTypes {
			p := filepath.Join(d.dir, "own-"+typ)
			if code, out := runProbeAs(t, tr, nobody, Command{}, "unix-self", typ, p, p); code != probeOK {
				t.Errorf("a Trial's own %s socket at %s: %d %q, want ok", typ, p, code, out)
			}
		}
	}
	after, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"unix_connect_denied", "unix_sendmsg_denied", "unix_identity_denied", "egress_other_packets"} {
		if n := after.Map()[c] - before.Map()[c]; n != 0 {
			t.Errorf("%s rose by %d for the Trial's own sockets, want 0", c, n)
		}
	}
	// Counted where the cgroup unix hooks exist (Linux 6.7+); before them,
	// the LSM layer alone judges, and counts only refusals.
	if n := after.Map()["unix_connect_allowed"] - before.Map()["unix_connect_allowed"]; h.BPF.UnixHooks() && n < 6 {
		t.Errorf("unix_connect_allowed rose by %d, want at least 6 (stream and seqpacket in three directories)", n)
	}

	// Bound in the Trial's /tmp, and left there: the host's /tmp has no
	// such file, and the Trial's next command still finds it.
	name := "/tmp/left-" + randSuffix() + ".sock"
	if code, out := runProbeAs(t, tr, nobody, Command{}, "bind-unix", name); code != probeOK {
		t.Fatalf("bind %s: %d %q", name, code, out)
	}
	if _, err := os.Lstat(name); !os.IsNotExist(err) {
		t.Errorf("the host sees %s, which the Trial bound in its own /tmp (%v)", name, err)
	}
	if code, out := runProbeAs(t, tr, nobody, Command{}, "ls", "/tmp"); code != probeOK || !strings.Contains(out, filepath.Base(name)) {
		t.Errorf("the Trial's next command lists /tmp as %q, want %s in it", out, filepath.Base(name))
	}
}

// A path that starts in the Trial's own directories but leads to a host
// socket is refused: by a symlink (to the socket, or to its directory),
// by a socket the Trial bound then replaced with a symlink, by "..", or
// by a hard link. Nothing reaches the host socket.
//
// Where the LSM layer runs, its peer check refuses these, and the cases
// run again with it detached (where the unix hooks exist to confine
// without it): the hooks' views alone.
func TestPrivilegedOwnDirsCannotLeadOut(t *testing.T) {
	h := newHost(t)
	hs := newHostSockets(t)
	leadOut(t, h, hs)
	if h.BPF.LSM() && h.BPF.UnixHooks() {
		t.Run("without the LSM layer", func(t *testing.T) {
			if err := h.BPF.DetachLSM(); err != nil {
				t.Fatal(err)
			}
			leadOut(t, h, hs)
		})
	}
}

func leadOut(t *testing.T, h *Host, hs *hostSockets) {
	t.Helper()
	tr := newTrial(t, h, trial.Spec{})
	probe := func(args ...string) (int, string) {
		t.Helper()
		return runProbeAs(t, tr, nobody, Command{}, args...)
	}
	refused := func(what string, code int, out string) {
		t.Helper()
		// ELOOP: the view followed no symlink. EPERM: the hooks, or the
		// LSM layer's peer check, refused.
		if code == probeOK || (out != "ELOOP" && out != "EPERM") {
			t.Errorf("%s: %d %q, want refused (ELOOP or EPERM)", what, code, out)
		}
	}
	// The host sockets themselves, by their own paths: refused.
	code, out := probe("unix", hs.stream)
	refused("the host socket by its path", code, out)

	for _, d := range ownDirs {
		link := filepath.Join(d.dir, "to-host")
		if code, out := probe("symlink", hs.stream, link); code != probeOK {
			t.Fatalf("symlink in %s: %d %q", d.dir, code, out)
		}
		code, out := probe("unix", link)
		refused("connect through a symlink in "+d.dir, code, out)
		dgramLink := filepath.Join(d.dir, "to-host-dgram")
		if code, out := probe("symlink", hs.dgram, dgramLink); code != probeOK {
			t.Fatalf("symlink in %s: %d %q", d.dir, code, out)
		}
		code, out = probe("unix-sendto", dgramLink)
		refused("sendto through a symlink in "+d.dir, code, out)

		dirLink := filepath.Join(d.dir, "dir")
		if code, out := probe("symlink", hs.dir, dirLink); code != probeOK {
			t.Fatalf("symlink in %s: %d %q", d.dir, code, out)
		}
		code, out = probe("unix", filepath.Join(dirLink, filepath.Base(hs.stream)))
		refused("connect through a directory symlink in "+d.dir, code, out)
		code, out = probe("unix-sendto", filepath.Join(dirLink, filepath.Base(hs.dgram)))
		refused("sendto through a directory symlink in "+d.dir, code, out)

		// Climbing out with "..": the view is a mount, and ".." at its root
		// climbs to where it is mounted.
		up := d.dir + strings.Repeat("/..", 6) + hs.stream
		code, out = probe("unix", up)
		refused("connect to "+up, code, out)

		// A hard link cannot cross into the Trial's tmpfs.
		hard := filepath.Join(d.dir, "hard")
		if code, out := probe("link", hs.stream, hard); code == probeOK || out != "EXDEV" {
			t.Errorf("hard link of the host socket into %s: %d %q, want EXDEV", d.dir, code, out)
		}
	}

	// A socket the Trial bound, then replaced with a symlink to the host's.
	own := "/tmp/swapped.sock"
	if code, out := probe("bind-unix", own); code != probeOK {
		t.Fatalf("bind %s: %d %q", own, code, out)
	}
	if code, out := probe("rm", own); code != probeOK {
		t.Fatalf("rm %s: %d %q", own, code, out)
	}
	if code, out := probe("symlink", hs.stream, own); code != probeOK {
		t.Fatalf("symlink %s: %d %q", own, code, out)
	}
	code, out = probe("unix", own)
	refused("connect to a bound socket swapped for a symlink", code, out)

	if n := hs.hits(); n != 0 {
		t.Errorf("the host sockets were reached %d times from the Trial", n)
	}
	stats, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if n := stats.Map()["egress_other_packets"]; n != 0 {
		t.Errorf("direct egress %d, want 0", n)
	}
}

// With the LSM layer, no task outside a Trial reaches a socket the Trial
// made, at any path: here the host's way into the Trial's own /tmp,
// /proc/PID/root. A Trial without unix confinement keeps its trade.
func TestPrivilegedNoHostClientReachesTrialSockets(t *testing.T) {
	h := newHost(t)
	privtest.RequireLSM(t, h.BPF.LSM(), h.BPF.LSMError())
	for _, open := range []bool{false, true} {
		tr := newTrial(t, h, trial.Spec{UnixOpen: open})
		stdinR, stdinW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		var out privtest.SyncBuffer
		p, err := tr.Start(Command{Args: []string{probeExe(t), "unix-hold", "/tmp/srv.sock"}, Env: []string{"TRIALNET_PROBE=1"},
			UID: nobody, GID: nobody, Stdin: stdinR, Stdout: &out, Stderr: &out})
		_ = stdinR.Close()
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "ready"); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the Trial's server did not start: %q", out.String())
			}
		}
		before, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		path := fmt.Sprintf("/proc/%d/root/tmp/srv.sock", p.cmd.Process.Pid)
		c, dialErr := net.Dial("unix", path)
		if dialErr == nil {
			_ = c.Close()
		}
		after, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		counted := after.UnixIdentityDenied - before.UnixIdentityDenied
		switch {
		case !open && (!errors.Is(dialErr, syscall.EPERM) || counted != 1):
			t.Errorf("a host client connecting to %s: %v (counted %d), want EPERM, counted once", path, dialErr, counted)
		case open && dialErr != nil:
			t.Errorf("a host client connecting to a socket of a Trial without unix confinement: %v, want it reached (the trade)", dialErr)
		}
		_ = stdinW.Close()
		if code, err := p.Wait(); code != 0 || err != nil {
			t.Errorf("server: %d %v: %s", code, err, out.String())
		}
	}
}
