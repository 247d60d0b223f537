//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// viaShells makes newTrial take a prepared shell (CreateFrom) instead of
// creating afresh: TRIALNET_TEST_SHELLS=1 runs every test that way.
var viaShells = os.Getenv("TRIALNET_TEST_SHELLS") == "1"

// createViaShell is Create through a shell made for it.
func createViaShell(t testing.TB, h *Host, spec trial.Spec, ep Endpoint) (*Trial, error) {
	t.Helper()
	s, err := h.Prepare(spec.Transparent)
	if err != nil {
		t.Fatal(err)
	}
	return h.CreateFrom(s, spec, ep)
}

// lnEndpoint serves nothing and keeps the listeners it is given.
type lnEndpoint struct {
	mu  sync.Mutex
	lns []net.Listener
}

func (e *lnEndpoint) Serve(lns []net.Listener) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lns = lns
	return nil
}

func (e *lnEndpoint) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, l := range e.lns {
		_ = l.Close()
	}
}

func (e *lnEndpoint) addrs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, l := range e.lns {
		out = append(out, l.Addr().String())
	}
	return out
}

func proxyHost(t testing.TB) *Host {
	h := newHost(t)
	h.Proxy = []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:3128"), netip.MustParseAddrPort("[::1]:3128")}
	h.StateDir = t.TempDir()
	return h
}

// shellGroups are the cgroup v1 groups named name on this host.
func shellGroups(h *Host, name string) []string {
	var out []string
	for _, c := range controllersFor(h.Parent) {
		if c.dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(c.dir, name)); err == nil {
			out = append(out, filepath.Join(c.dir, name))
		}
	}
	return out
}

// A Trial made from a shell is one Create would have made: its paths,
// record, policy entry, zero counters, pool groups and bounds, loopback
// and proxy listeners are the same kind as a fresh Trial's, and nothing
// of the shell is left.
func TestPrivilegedShellTakenEqualsFresh(t *testing.T) {
	for _, transparent := range []bool{false, true} {
		t.Run(fmt.Sprint("transparent=", transparent), func(t *testing.T) {
			h := proxyHost(t)
			s, err := h.Prepare(transparent)
			if err != nil {
				t.Fatal(err)
			}
			name := s.Name
			var epTaken, epFresh lnEndpoint
			taken, err := h.CreateFrom(s, trial.Spec{ID: "taken-" + randSuffix(), UnixOpen: true, Transparent: transparent}, &epTaken)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = taken.Close() })
			fresh, err := h.Create(trial.Spec{ID: "fresh-" + randSuffix(), UnixOpen: true, Transparent: transparent}, &epFresh)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = fresh.Close() })

			for _, tr := range []*Trial{taken, fresh} {
				if tr.Netns.Path != filepath.Join(h.NetnsDir, tr.ID) || tr.Cgroup != filepath.Join(h.Parent, tr.ID) {
					t.Errorf("%s: netns %s, cgroup %s: not at its id's paths", tr.ID, tr.Netns.Path, tr.Cgroup)
				}
				if ns, err := netns.Open(h.NetnsDir, tr.ID); err != nil || ns.Cookie != tr.Netns.Cookie {
					t.Errorf("%s: its mounted namespace is not the one it serves (%v)", tr.ID, err)
				}
				if c, err := tr.Counters(); err != nil || c != (bpf.Counters{}) {
					t.Errorf("%s: counters %+v (%v), want zero", tr.ID, c, err)
				}
				if !h.BPF.HasTrial(tr.CgroupID) {
					t.Errorf("%s: no policy entry", tr.ID)
				}
				rec, err := h.readRecord(tr.ID)
				if err != nil || rec.Phase != PhaseLive || rec.Netns != tr.Netns.Path || rec.CgroupID != tr.CgroupID {
					t.Errorf("%s: record %+v (%v)", tr.ID, rec, err)
				}
			}
			if a, b := epTaken.addrs(), epFresh.addrs(); !slices.Equal(a, b) || len(a) == 0 {
				t.Errorf("listeners: taken %v, fresh %v", a, b)
			}
			if a, b := loAddrsOf(t, taken), loAddrsOf(t, fresh); !slices.Equal(a, b) {
				t.Errorf("lo: taken %v, fresh %v", a, b)
			}
			if a, b := taken.PoolUse(), fresh.PoolUse(); !slices.Equal(a, b) {
				t.Errorf("pools: taken %+v, fresh %+v", a, b)
			}
			for _, c := range taken.controllers() {
				if dir, _ := taken.poolDir(c); c.dir != "" {
					if _, err := os.Stat(dir); err != nil {
						t.Errorf("the taken Trial's %s group: %v", c.name, err)
					}
				}
			}
			if g := shellGroups(h, name); len(g) != 0 {
				t.Errorf("the shell's groups are left: %v", g)
			}
			if ids, _ := netns.List(h.NetnsDir); len(ids) != 2 {
				t.Errorf("namespaces mounted: %v, want the two Trials'", ids)
			}
		})
	}
}

// A Trial's description that sets pool bounds gets them on a shell's
// groups, which were made at the defaults.
func TestPrivilegedShellTakenKeepsPoolBounds(t *testing.T) {
	h := newHost(t)
	tr, err := createViaShell(t, h, trial.Spec{ID: "bounds-" + randSuffix(), UnixOpen: true, Limits: &trial.Limits{PoolLimits: trial.PoolLimits{MaxPids: 77}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = tr.Close() })
	for _, u := range tr.PoolUse() {
		if u.Pool == PoolPids && strings.Contains(u.Bound, "controller") && u.Max != 77 {
			t.Fatalf("pids bound %d, want 77", u.Max)
		}
	}
	for _, c := range tr.controllers() {
		if c.name != PoolPids || !c.bounded() {
			continue
		}
		dir, _ := tr.poolDir(c)
		if b, _ := os.ReadFile(filepath.Join(dir, "pids.max")); strings.TrimSpace(string(b)) != "77" {
			t.Fatalf("pids.max = %q, want 77", b)
		}
	}
}

// A process put into a shell's group before a create takes it is killed
// and the shell refused: the create fails with ErrShell and leaves
// nothing, and Create (the agent's fallback) then makes the Trial.
func TestPrivilegedShellEnteredBeforeTakenIsRefused(t *testing.T) {
	h := proxyHost(t)
	s, err := h.Prepare(false)
	if err != nil {
		t.Fatal(err)
	}
	var pids string
	for _, p := range s.pools {
		if p.c.name == PoolPids {
			pids = p.dir
		}
	}
	if pids == "" {
		s.Close()
		t.Skip("no cgroup v1 pids hierarchy: a shell has no group to enter (its cgroup is made when it is taken)")
	}
	intruder := exec.Command("sleep", "60")
	if err := intruder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = intruder.Process.Kill(); _ = intruder.Wait() })
	if err := os.WriteFile(filepath.Join(pids, "cgroup.procs"), []byte(fmt.Sprint(intruder.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	id := "entered-" + randSuffix()
	tr, err := h.CreateFrom(s, trial.Spec{ID: id, UnixOpen: true}, &lnEndpoint{})
	if err == nil {
		_, _ = tr.Close()
		t.Fatal("a shell with a process in its pids group was taken")
	}
	if !errors.Is(err, ErrShell) {
		t.Fatalf("error %v does not wrap ErrShell", err)
	}
	t.Log(err)
	if st, _ := intruder.Process.Wait(); st == nil || !st.Sys().(syscall.WaitStatus).Signaled() {
		t.Fatalf("the process in the shell was not killed: %v", st)
	}
	if _, err := os.Stat(filepath.Join(h.Parent, id)); !os.IsNotExist(err) {
		t.Error("the refused create left a cgroup")
	}
	if ids, _ := netns.List(h.NetnsDir); len(ids) != 0 {
		t.Errorf("the refused create left namespaces: %v", ids)
	}
	if g := shellGroups(h, s.Name); len(g) != 0 {
		t.Errorf("the refused shell's groups are left: %v", g)
	}
	tr, err = h.Create(trial.Spec{ID: id, UnixOpen: true}, &lnEndpoint{})
	if err != nil {
		t.Fatalf("a create after the refused shell: %v", err)
	}
	_, _ = tr.Close()
}

// A connection waiting on a shell's listener, which only a process in its
// namespace can make, refuses the shell: the Trial's proxy would
// otherwise serve it as the Trial's.
func TestPrivilegedShellWithWaitingConnectionIsRefused(t *testing.T) {
	h := proxyHost(t)
	s, err := h.Prepare(false)
	if err != nil {
		t.Fatal(err)
	}
	var c net.Conn
	if err := netns.Do(s.ns.Path(), func() (err error) {
		c, err = net.Dial("tcp", "127.0.0.1:3128")
		return err
	}); err != nil {
		s.Close()
		t.Fatal(err)
	}
	defer c.Close()
	tr, err := h.CreateFrom(s, trial.Spec{ID: "waiting-" + randSuffix(), UnixOpen: true}, &lnEndpoint{})
	if err == nil {
		_, _ = tr.Close()
	}
	if !errors.Is(err, ErrShell) {
		t.Fatalf("a shell with a connection waiting was taken: %v", err)
	}
	t.Log(err)
}

// Close removes a shell that was never taken.
func TestPrivilegedShellCloseLeavesNothing(t *testing.T) {
	h := proxyHost(t)
	s, err := h.Prepare(true)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if g := shellGroups(h, s.Name); len(g) != 0 {
		t.Fatalf("groups left: %v", g)
	}
	if ids, _ := netns.List(h.NetnsDir); len(ids) != 0 {
		t.Fatalf("namespaces left: %v", ids)
	}
}

// SweepShells removes the groups a process that died left of its shells,
// and nothing else: not a live process's shell, not a Trial's group.
func TestPrivilegedSweepShellsIsExact(t *testing.T) {
	h := newHost(t)
	if !slices.ContainsFunc(controllersFor(h.Parent), func(c controller) bool { return c.dir != "" }) {
		t.Skip("no cgroup v1 pool hierarchy: a crashed agent's shells leave nothing to sweep")
	}
	// A process that prepares a shell and is killed before it closes it.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TRIALNET_SHELL_HELPER="+h.Parent)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	dead := strings.TrimSpace(string(out))
	if g := shellGroups(h, dead); len(g) == 0 {
		t.Fatalf("the helper's shell %q left no groups to sweep", dead)
	}
	t.Cleanup(func() {
		for _, g := range shellGroups(h, dead) {
			_ = removeShellGroup(g)
		}
	})
	live, err := h.Prepare(false)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	// Alive as the agent says it: other processes' shells on this host
	// (another test's agent) are not this test's to remove.
	h.SweepShells(func(pid int) bool { return !errors.Is(unix.Kill(pid, 0), unix.ESRCH) })
	if g := shellGroups(h, dead); len(g) != 0 {
		t.Errorf("the dead process's shell groups are left: %v", g)
	}
	if g := shellGroups(h, live.Name); len(g) == 0 {
		t.Error("the sweep removed a live process's shell")
	}
	for _, c := range tr.controllers() {
		if dir, _ := tr.poolDir(c); c.dir != "" {
			if _, err := os.Stat(dir); err != nil {
				t.Errorf("the sweep removed the Trial's %s group: %v", c.name, err)
			}
		}
	}
}

// shellHelper prepares a shell on the host whose parent cgroup is
// parent, prints its name and dies without closing it (TestMain).
func shellHelper(parent string) int {
	s, err := (&Host{Parent: parent}).Prepare(false)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(s.Name)
	return 0
}

// The escape suite's refusals hold for a Trial made from a shell.
func TestPrivilegedTakenShellRefusesEveryWayOut(t *testing.T) {
	was := viaShells
	viaShells = true
	t.Cleanup(func() { viaShells = was })
	TestPrivilegedTrialRefusesEveryWayOut(t)
}

// A description that raises the memory bound above the default gets it
// on a shell's groups too: cgroup v1 refuses a memory.limit_in_bytes
// above the group's memory.memsw.limit_in_bytes, which a shell set at the
// default, so the bounds are raised swap-first.
func TestPrivilegedShellTakenRaisesMemoryBound(t *testing.T) {
	h := newHost(t)
	want := defaultMaxMemory() + 1<<30
	tr, err := createViaShell(t, h, trial.Spec{ID: "raise-" + randSuffix(), UnixOpen: true, Limits: &trial.Limits{PoolLimits: trial.PoolLimits{MaxMemory: want}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = tr.Close() })
	for _, c := range tr.controllers() {
		if c.name != PoolMemory || c.dir == "" {
			continue
		}
		dir, _ := tr.poolDir(c)
		for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if errors.Is(err, os.ErrNotExist) && strings.Contains(f, "sw") {
				continue
			}
			// The kernel rounds down to a page.
			if got := strings.TrimSpace(string(b)); err != nil || got != fmt.Sprint(want&^int64(os.Getpagesize()-1)) {
				t.Errorf("%s = %q (%v), want %d", f, got, err, want)
			}
		}
	}
}

// A datagram of no bytes waiting on a shell's UDP socket (the stub's) is
// waiting all the same: SIOCINQ, the first datagram's length, says 0 for
// it.
func TestWaitingSeesAnEmptyDatagram(t *testing.T) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n, err := Waiting(c); err != nil || n != 0 {
		t.Fatalf("an untouched socket: %d waiting (%v)", n, err)
	}
	s, err := net.DialUDP("udp", nil, c.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write(nil); err != nil {
		t.Fatal(err)
	}
	// The datagram is queued on loopback before the write returns.
	if n, err := Waiting(c); err != nil || n == 0 {
		t.Fatalf("an empty datagram queued: %d waiting (%v), want it seen", n, err)
	}
}
