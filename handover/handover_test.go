//go:build linux

package handover

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/internal/lname"
)

// The test binary, started again with roleEnv set, is the other agent of
// a hand-over, a process of its own: one that dies, or breaks the
// protocol, while the test is the agent that must cope.
const (
	roleEnv = "HANDOVER_TEST_ROLE"
	sockEnv = "HANDOVER_TEST_SOCK"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		if err := otherAgent(role, os.Getenv(sockEnv)); err != nil {
			fmt.Fprintln(os.Stderr, role+":", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var testPaths = map[string]string{"socket": "/run/test.sock", "state_dir": "/var/lib/test"}

func otherAgent(role, sock string) error {
	switch role {
	case "successor-dies": // takes the offer, and exits without serving
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
		if err != nil {
			return err
		}
		_, _, err = Take(c, Config{Paths: testPaths})
		return err
	case "predecessor-dies": // hands over, then dies while it drains
		c, err := acceptOne(sock)
		if err != nil {
			return err
		}
		g := newTestGiver(nil, 1)
		s, err := Give(c, g, Config{Paths: testPaths})
		if err != nil {
			return err
		}
		go func() { _ = s.Drain(g, time.Hour) }()
		g.forward("t1", []byte(`{"n":1}`))
		time.Sleep(50 * time.Millisecond) // a moment into the drain
		os.Exit(3)
	case "stopped-twice": // says it stopped twice, then lives until killed
		c, err := acceptOne(sock)
		if err != nil {
			return err
		}
		if _, _, err := Recv(c); err != nil {
			return err
		}
		if err := Send(c, Offer{Version: Version, PID: os.Getpid()}); err != nil {
			return err
		}
		if err := awaitKind(c, KindServing); err != nil {
			return err
		}
		for range 2 {
			if err := Send(c, Stopped{}); err != nil {
				return err
			}
		}
		time.Sleep(time.Hour)
	}
	return fmt.Errorf("no role %q", role)
}

func acceptOne(sock string) (*net.UnixConn, error) {
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	return ln.AcceptUnix()
}

// awaitKind reads c until a message of kind k.
func awaitKind(c *net.UnixConn, k Kind) error {
	for {
		m, files, err := Recv(c)
		closeFiles(files)
		if err != nil {
			return err
		}
		if m.Kind() == k {
			return nil
		}
	}
}

// testGiver is an old agent: real listeners on loopback, a real counts
// page, and a record of what the hand-over asked of it.
type testGiver struct {
	t     testing.TB // nil in a child
	lns   []*net.TCPListener
	page  *counts.Region
	drain chan struct{} // closed: it serves nothing any more

	mu       sync.Mutex
	holds    int
	released []bool
	allows   []string
	removes  []string
	fwd      func(string, []byte)
}

// newTestGiver serves n listeners, of Trials t1, t2, ...; in a test (t
// not nil) they are closed when it ends.
func newTestGiver(t testing.TB, n int) *testGiver {
	g := &testGiver{t: t, drain: make(chan struct{})}
	for range n {
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			panic(err)
		}
		g.lns = append(g.lns, ln)
		if t != nil {
			t.Cleanup(func() { _ = ln.Close() })
		}
	}
	var err error
	if g.page, err = counts.New("test"); err != nil {
		panic(err)
	}
	if t != nil {
		t.Cleanup(func() { _ = g.page.Close() })
	}
	return g
}

// name is the name of listener i: Trial t(i/2+1)'s endpoint i%2.
func (g *testGiver) name(i int) lname.Name { return lname.EndpointName(fmt.Sprintf("t%d", i/2+1), i%2) }

func (g *testGiver) Hold() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holds++
	return ""
}

func (g *testGiver) Offer(shares bool, forward func(string, []byte)) (Goods, error) {
	g.mu.Lock()
	g.fwd = forward
	g.mu.Unlock()
	var files []File
	for i, ln := range g.lns {
		f, err := ln.File()
		if err != nil {
			return Goods{}, err
		}
		files = append(files, File{Name: g.name(i), File: f})
	}
	if shares {
		f, err := g.page.Dup()
		if err != nil {
			return Goods{}, err
		}
		files = append(files, File{Name: lname.CountsName(""), File: f, Slot: 0})
	}
	return Goods{Files: files, Offsets: map[string]int64{"t1": 10}, Open: map[string]int64{"t1": 1}}, nil
}

func (g *testGiver) forward(trial string, line []byte) {
	g.mu.Lock()
	fwd := g.fwd
	g.mu.Unlock()
	fwd(trial, line)
}

func (g *testGiver) Release(stopped bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.released = append(g.released, stopped)
}

func (g *testGiver) Open() map[string]int64 { return map[string]int64{"t1": 1} }

func (g *testGiver) Drained(ctx context.Context) bool {
	select {
	case <-g.drain:
		return true
	case <-ctx.Done():
		return false
	}
}

func (g *testGiver) CutAll(string) int { return 0 }

func (g *testGiver) SetAllow(trial string, allow json.RawMessage, cut []string) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.allows = append(g.allows, fmt.Sprintf("%s %s %v", trial, allow, cut))
	return len(cut), nil
}

// Remove writes the Trial's last record, as the proxy does when it ends
// a Trial's connections.
func (g *testGiver) Remove(trial string) {
	g.mu.Lock()
	g.removes = append(g.removes, trial)
	fwd := g.fwd
	g.mu.Unlock()
	fwd(trial, []byte(`{"last":true}`))
}

func (g *testGiver) Finish() {}

// testTaker is a new agent: what the hand-over told it.
type testTaker struct {
	mu        sync.Mutex
	lines     map[string][]string
	elsewhere []map[string]int64
	lost      int
	followed  chan struct{}
	// alive, if set, says whether the old agent's process still runs;
	// Lost counts a call while it does in early.
	alive func() bool
	early int
	// hold, if set, is called as Counted ("counted") and Lost ("lost")
	// start: it may hold them.
	hold func(call string)
}

func newTestTaker() *testTaker {
	return &testTaker{lines: make(map[string][]string), followed: make(chan struct{})}
}

func (k *testTaker) Counted(trial string, lines []json.RawMessage) {
	if k.hold != nil {
		k.hold("counted")
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range lines {
		k.lines[trial] = append(k.lines[trial], string(l))
	}
}

func (k *testTaker) Elsewhere(open map[string]int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.elsewhere = append(k.elsewhere, open)
}

func (k *testTaker) Lost() {
	if k.hold != nil {
		k.hold("lost")
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lost++
	if k.alive != nil && k.alive() {
		k.early++
	}
}

// running reports whether process pid runs: it exists, and is neither a
// zombie (exited, not yet reaped) nor dead (X: being reaped, as the
// test's own Wait does the moment the kill lands).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

func (k *testTaker) Followed(*Predecessor) { close(k.followed) }

func (k *testTaker) counted(trial string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.lines[trial]...)
}

// holdOne makes k hold its first call named call until the channel
// returned is closed; held is closed once that call has started.
func (k *testTaker) holdOne(call string) (held <-chan struct{}, release chan struct{}) {
	h, r := make(chan struct{}), make(chan struct{})
	var once sync.Once
	k.hold = func(c string) {
		if c == call {
			once.Do(func() { close(h); <-r })
		}
	}
	return h, r
}

// handOver runs a whole hand-over in this process over a socket pair, g
// the old agent and the test the new one; it returns when the new agent
// serves and the old one has stopped accepting and drains (until
// g.drain is closed).
func handOver(t *testing.T, g *testGiver, k *testTaker) (*Predecessor, map[lname.Name]*os.File, chan error) {
	t.Helper()
	here, there := connectedPair(t)
	drained := make(chan error, 1)
	go func() {
		s, err := Give(there, g, Config{Paths: testPaths})
		if err != nil {
			drained <- err
			return
		}
		drained <- s.Drain(g, time.Hour)
	}()
	p, files, err := Take(here, Config{Paths: testPaths})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, f := range files {
			_ = f.Close()
		}
	})
	if err := p.Serve(k); err != nil {
		t.Fatal(err)
	}
	return p, files, drained
}

func connectedPair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(dir, "s"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err = net.DialUnix("unixpacket", nil, ln.Addr().(*net.UnixAddr))
	if err != nil {
		t.Fatal(err)
	}
	if b, err = ln.AcceptUnix(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = a.Close(), b.Close() })
	return a, b
}

// startOtherAgent starts the test binary in role, with sock; it is killed
// and reaped when the test ends, and exited is closed once it has.
func startOtherAgent(t *testing.T, role, sock string) (cmd *exec.Cmd, exited chan struct{}) {
	t.Helper()
	cmd = exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"="+role, sockEnv+"="+sock)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	return cmd, exited
}

// dialOtherAgent connects to the socket a child listens on, once it does.
func dialOtherAgent(t *testing.T, sock string) *net.UnixConn {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
		if err == nil {
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other agent does not listen on %s: %v", sock, err)
		}
	}
}

// waitState waits until the hand-over is in state want.
func waitState(t *testing.T, what string, st func() State, want State) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); st() != want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the %s's hand-over is %s, want %s", what, st(), want)
		}
	}
}
