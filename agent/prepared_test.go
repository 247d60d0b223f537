//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/dnsstub"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// readyShells waits (bounded) until the agent has n shells ready and
// returns their names.
func readyShells(t testing.TB, a *Agent, n int) []string {
	t.Helper()
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		a.shells.mu.Lock()
		var names []string
		for _, sh := range a.shells.ready {
			names = append(names, sh.sh.Name)
		}
		a.shells.mu.Unlock()
		if len(names) == n {
			return names
		}
		if time.Now().After(end) {
			t.Fatalf("%d shells ready, want %d", len(names), n)
		}
	}
}

// v1Groups are the cgroup v1 pool groups named name on this host.
func v1Groups(t *testing.T, name string) []string {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 || g[0] != "cgroup" {
			continue
		}
		dir := filepath.Join(f[4], sandbox.ParentName, name)
		if _, err := os.Stat(dir); err == nil {
			out = append(out, dir)
		}
	}
	return out
}

// A running agent keeps shells ready, a create takes one (its groups
// become the Trial's), the refill makes another, and Close removes them.
func TestPrivilegedAgentTakesAndRefillsShells(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 226)
	a, closeAgent := startAgentToClose(t, w.config(t))
	before := readyShells(t, a, config.DefaultPrepared)
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-shell", Allow: []string{"api.example.test:443"}})
	if err != nil {
		t.Fatal(err)
	}
	after := readyShells(t, a, config.DefaultPrepared)
	taken := ""
	for _, n := range before {
		if !strings.Contains(strings.Join(after, " "), n) {
			taken = n
		}
	}
	if taken == "" {
		t.Fatalf("the create took no shell: ready %v before, %v after", before, after)
	}
	if g := v1Groups(t, taken); len(g) != 0 {
		t.Errorf("the taken shell's groups are still named for it: %v", g)
	}
	if info.Netns != filepath.Join(a.cfg.Host.NetnsDir, "agt-shell") || info.Cgroup != filepath.Join(a.host.Parent, "agt-shell") {
		t.Errorf("paths: netns %s, cgroup %s", info.Netns, info.Cgroup)
	}
	closeAgent(true)
	for _, n := range after {
		if g := v1Groups(t, n); len(g) != 0 {
			t.Errorf("shell %s outlived the agent's Close: %v", n, g)
		}
	}
}

// prepared: 0 keeps no shell, and creates work.
func TestPrivilegedAgentPreparedOff(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 227)
	cfg := w.config(t)
	zero := 0
	cfg.File = &config.File{Prepared: &zero}
	a := startAgent(t, cfg)
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-noshell"}); err != nil {
		t.Fatal(err)
	}
	if a.shells.fillOne() {
		t.Fatal("a shell was made with prepared: 0")
	}
	if n := len(readyShells(t, a, 0)); n != 0 {
		t.Fatalf("%d shells ready with prepared: 0", n)
	}
}

// A shell that cannot be made, or that is refused when taken, fails no
// create: the agent makes the Trial afresh and logs why.
func TestPrivilegedAgentShellFailuresFallBack(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 228)
	cfg := w.config(t)
	var journal lockedBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&journal, nil))
	a := startAgent(t, cfg)
	ready := readyShells(t, a, config.DefaultPrepared)

	// Refused when taken: a process put into every ready shell's pids
	// group.
	var intruders []*exec.Cmd
	for _, n := range ready {
		for _, g := range v1Groups(t, n) {
			if !strings.Contains(g, "/pids/") {
				continue
			}
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			if err := os.WriteFile(filepath.Join(g, "cgroup.procs"), []byte(fmt.Sprint(cmd.Process.Pid)), 0); err != nil {
				t.Fatal(err)
			}
			intruders = append(intruders, cmd)
		}
	}
	if len(intruders) == 0 {
		t.Log("no cgroup v1 pids hierarchy: shells have no group to enter; only the failure to make one is tested")
	}
	a.shells.mu.Lock()
	a.shells.prepare = func(bool) (*prepShell, error) { return nil, errors.New("test: no shell") }
	a.shells.mu.Unlock()
	for i := range 3 {
		id := fmt.Sprintf("agt-fallback-%d", i)
		if _, err := a.Create(context.Background(), trialspec.Request{ID: id}); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if _, err := a.Destroy(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	for _, cmd := range intruders {
		if st, _ := cmd.Process.Wait(); st == nil || st.Exited() {
			t.Errorf("the process put into a shell was not killed: %v", st)
		}
	}
	log := journal.String()
	if len(intruders) > 0 && !strings.Contains(log, "a prepared Trial shell was refused") {
		t.Errorf("no refused shell in the log:\n%s", log)
	}
	// The refill tries once the agent is quiet.
	for end := time.Now().Add(10 * time.Second); !strings.Contains(log, "test: no shell"); log = journal.String() {
		if time.Now().After(end) {
			t.Fatalf("the failure to prepare a shell is not in the log:\n%s", log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A connection waiting on a transparent shell's stub socket, which only a
// process in its namespace can make, refuses the shell; the create makes
// the Trial afresh.
func TestPrivilegedAgentTransparentShellWithWaitingConnection(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 229)
	cfg := w.config(t)
	var journal lockedBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&journal, nil))
	a := startAgent(t, cfg)
	readyShells(t, a, config.DefaultPrepared)
	a.shells.mu.Lock()
	ready := slices.Clone(a.shells.ready)
	a.shells.prepare = func(bool) (*prepShell, error) { return nil, errors.New("test: no more shells") }
	a.shells.mu.Unlock()
	for _, p := range ready {
		var c net.Conn
		if err := netns.Do(p.sh.NetnsPath(), func() (err error) {
			c, err = net.Dial("tcp", dnsstub.DefaultListen)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
	}
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-waiting"})
	if err != nil {
		t.Fatal(err)
	}
	if !info.Transparent {
		t.Fatal("the Trial is not transparent")
	}
	if log := journal.String(); !strings.Contains(log, "a prepared Trial shell was refused") || !strings.Contains(log, "waiting on its transparent socket") {
		t.Fatalf("no refused shell in the log:\n%s", log)
	}
}

// A reload applies a new prepared at once: shells over it are removed,
// and a larger number is made.
func TestPrivilegedAgentReloadPrepared(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 230)
	cfg, path := reloadable(t, w, "prepared: 1\n")
	a := startAgent(t, cfg)
	first := readyShells(t, a, 1)
	writeConfig(t, path, "prepared: 0\n")
	if _, err := a.Reload(context.Background(), client.ReloadRequest{}); err != nil {
		t.Fatal(err)
	}
	readyShells(t, a, 0)
	for end := time.Now().Add(10 * time.Second); len(v1Groups(t, first[0])) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the shell dropped by the reload is left: %v", v1Groups(t, first[0]))
		}
	}
	// The Trials' files kept beside the shells go with them.
	for end := time.Now().Add(10 * time.Second); len(shellEntries(t, a.cfg.DataDir))+len(shellEntries(t, a.cfg.Host.StateDir)) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the Trial's files dropped by the reload are left: %v %v", shellEntries(t, a.cfg.DataDir), shellEntries(t, a.cfg.Host.StateDir))
		}
	}
	writeConfig(t, path, "prepared: 3\n")
	if _, err := a.Reload(context.Background(), client.ReloadRequest{}); err != nil {
		t.Fatal(err)
	}
	readyShells(t, a, 3)
}

// preparedInodes waits (bounded) until a has as many Trials' files
// ready as shells to keep, and returns the inodes of their decision logs
// and ledgers.
func preparedInodes(t *testing.T, a *Agent) (logs, ledgers map[uint64]string) {
	t.Helper()
	logs, ledgers = map[uint64]string{}, map[uint64]string{}
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		a.shells.mu.Lock()
		if len(a.shells.files) == a.file.Load().PreparedShells() {
			break
		}
		a.shells.mu.Unlock()
		if time.Now().After(end) {
			t.Fatal("the Trials' files to keep are not ready")
		}
	}
	defer a.shells.mu.Unlock()
	for _, f := range a.shells.files {
		logs[inode(t, filepath.Join(a.cfg.DataDir, f.name, decisionsFile))] = f.name
		ledgers[inode(t, filepath.Join(a.cfg.Host.StateDir, f.name+".ledgers", fmt.Sprint(os.Getpid())))] = f.name
	}
	return logs, ledgers
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// shellEntries are the names in dir that prepared files have.
func shellEntries(t *testing.T, dir string) []string {
	t.Helper()
	return namesWithPrefix(t, dir, sandbox.ShellPrefix)
}

// A create takes a Trial's files made ahead: its decision log and
// ledger are the prepared ones, renamed to the Trial's; Close removes
// the ones not taken.
func TestPrivilegedAgentTakesPreparedFiles(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 232)
	a, closeAgent := startAgentToClose(t, w.config(t))
	readyShells(t, a, config.DefaultPrepared)
	logs, ledgers := preparedInodes(t, a)
	time.Sleep(50 * time.Millisecond) // the prepared files' times are before this
	start := time.Now()
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-files"}); err != nil {
		t.Fatal(err)
	}
	// Dated as made now: the retention rule reads these times.
	for _, p := range []string{filepath.Join(a.cfg.DataDir, "agt-files"), filepath.Join(a.cfg.DataDir, "agt-files", decisionsFile)} {
		if st, err := os.Stat(p); err != nil || st.ModTime().Before(start.Add(-10*time.Millisecond)) {
			t.Errorf("%s: modified %v, before the create at %v (%v)", p, st.ModTime(), start, err)
		}
	}
	name, ok := logs[inode(t, filepath.Join(a.cfg.DataDir, "agt-files", decisionsFile))]
	if !ok {
		t.Fatal("the Trial's decision log is not a prepared one")
	}
	if _, ok := ledgers[inode(t, filepath.Join(a.cfg.Host.StateDir, "agt-files.ledgers", fmt.Sprint(os.Getpid())))]; !ok {
		t.Fatal("the Trial's ledger is not a prepared one")
	}
	for _, p := range []string{filepath.Join(a.cfg.DataDir, name), filepath.Join(a.cfg.Host.StateDir, name+".ledgers")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the taken files' %s is left: %v", p, err)
		}
	}
	readyShells(t, a, config.DefaultPrepared)
	closeAgent(true)
	for _, d := range []string{a.cfg.DataDir, a.cfg.Host.StateDir} {
		if left := shellEntries(t, d); len(left) > 0 {
			t.Errorf("prepared files outlived the agent's Close in %s: %v", d, left)
		}
	}
}

// Prepared files that something wrote to before a create took them are
// refused: the Trial's decision log starts empty and its ledger is a new
// one, and what was planted is moved aside as an earlier Trial's data.
func TestPrivilegedAgentTouchedPreparedFilesRefused(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 233)
	cfg := w.config(t)
	var journal lockedBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&journal, nil))
	a := startAgent(t, cfg)
	logs, _ := preparedInodes(t, a)
	planted := `{"schema":1,"decision":"allow","target":"planted.example:443"}` + "\n"
	for _, name := range logs {
		if err := os.WriteFile(filepath.Join(a.cfg.DataDir, name, decisionsFile), []byte(planted), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(filepath.Join(a.cfg.Host.StateDir, name+".ledgers", fmt.Sprint(os.Getpid())), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.WriteAt([]byte{1}, 64)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-forged"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(a.cfg.DataDir, "agt-forged", decisionsFile))
	if err != nil || len(b) != 0 {
		t.Errorf("the Trial's decision log holds %q (%v); want it empty", b, err)
	}
	if l, err := os.ReadFile(filepath.Join(a.cfg.Host.StateDir, "agt-forged.ledgers", fmt.Sprint(os.Getpid()))); err != nil || len(l) < 65 || l[64] != 0 {
		t.Errorf("the Trial's ledger is not a new one (%v)", err)
	}
	aside, _ := filepath.Glob(filepath.Join(a.cfg.DataDir, "agt-forged.*", decisionsFile))
	if len(aside) != 1 {
		t.Errorf("the changed data directory moved aside: %v", aside)
	}
	log := journal.String()
	for _, want := range []string{"a prepared Trial data directory was changed before it was taken", "a prepared tunnel ledger was refused"} {
		if !strings.Contains(log, want) {
			t.Errorf("%q is not in the log:\n%s", want, log)
		}
	}
}

// A starting agent removes the prepared files of agents that are gone,
// and leaves those of a process that runs.
func TestPrivilegedAgentSweepsPreparedFiles(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 234)
	cfg := w.config(t)
	zero := 0
	cfg.File = &config.File{Prepared: &zero}
	if err := os.MkdirAll(cfg.Host.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	onlyLive := leavePreparedFiles(t, cfg.DataDir, cfg.Host.StateDir)
	startAgent(t, cfg)
	onlyLive("the start")
}

// leavePreparedFiles makes in dataDir and stateDir the files prepared
// for Trials that a stopped agent (a pid no process has) and a running
// one (pid 1) would have, and returns a check, after when, that only
// the running one's are left.
func leavePreparedFiles(t *testing.T, dataDir, stateDir string) (onlyLive func(when string)) {
	t.Helper()
	dead, live := fmt.Sprintf("%s%d-7", sandbox.ShellPrefix, 1<<22-1), sandbox.ShellPrefix+"1-7"
	for _, name := range []string{dead, live} {
		for _, p := range []string{filepath.Join(dataDir, name, decisionsFile), filepath.Join(stateDir, name+ledgersSuffix, "1")} {
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return func(when string) {
		t.Helper()
		for _, d := range []string{dataDir, stateDir} {
			if got := shellEntries(t, d); len(got) != 1 || !strings.HasPrefix(got[0], live) {
				t.Errorf("prepared files in %s after %s: %v; want only %s's", d, when, got, live)
			}
		}
	}
}
