//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/procstat"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/netns"
	trialspec "github.com/trialnet/trialnet/trial"
)

const (
	ownerSocketEnv = "TRIALNET_TEST_OWNER_SOCKET"
	ownerIDsEnv    = "TRIALNET_TEST_OWNER_IDS"
)

// ownerMain is the test binary as an owner: it asks the agent on sock for
// owned Trials ids, says "created", and lives until its stdin closes.
func ownerMain(sock string, ids []string) int {
	c := client.NewClient(sock)
	for _, id := range ids {
		if _, err := c.Create(context.Background(), trialspec.Request{ID: id, Owned: true}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Println("created")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// ownerProcess starts a process of its own that owns Trials ids, made
// through the agent on sock, and returns once they exist. Closing stdin
// ends it; so does SIGKILL.
func ownerProcess(t *testing.T, sock string, ids ...string) (*exec.Cmd, io.Closer) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), ownerSocketEnv+"="+sock, ownerIDsEnv+"="+strings.Join(ids, ","))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut lockedBuffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line := make([]byte, len("created\n"))
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "created\n" {
		_ = cmd.Wait()
		t.Fatalf("owner process: %q %v: %s", line, err, errOut.String())
	}
	return cmd, stdin
}

// serveControl serves a's control API on a socket of the test's own.
func serveControl(t *testing.T, a *Agent) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := ListenSocket(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := a.Server()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

// openOwner knows a process by its pid and start time: a wrong start
// time is another process, and an exited one is gone, reaped or not.
func TestOpenOwner(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	start, err := procstat.StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	o := trialspec.Owner{PID: cmd.Process.Pid, Start: start}
	f, err := openOwner(o)
	if err != nil {
		t.Fatalf("openOwner of a running process: %v", err)
	}
	defer f.Close()
	gone := func() bool {
		rc, err := f.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var ex bool
		_ = rc.Control(func(fd uintptr) { ex = exited(int(fd)) })
		return ex
	}
	if gone() {
		t.Fatal("a running process reads as exited")
	}
	if _, err := openOwner(trialspec.Owner{PID: o.PID, Start: o.Start + 1}); !errors.Is(err, errOwnerExited) {
		t.Fatalf("openOwner with another start time: %v, want errOwnerExited", err)
	}
	_ = cmd.Process.Kill()
	for !gone() { // a zombie has exited: its pidfd polls readable
		time.Sleep(time.Millisecond)
	}
	if _, err := openOwner(o); !errors.Is(err, errOwnerExited) {
		t.Fatalf("openOwner of a zombie: %v, want errOwnerExited", err)
	}
	_ = cmd.Wait()
	if _, err := openOwner(o); !errors.Is(err, errOwnerExited) {
		t.Fatalf("openOwner of a reaped process: %v, want errOwnerExited", err)
	}
}

// The owner of an owned Trial is the process at the other end of the
// control socket, as the kernel names it: the request has no say.
func TestPeerOwnerIsTheConnectingProcess(t *testing.T) {
	privtest.RequireKernel(t, HavePeerPidfd())
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o, f, err := peerOwner(s.(*net.UnixConn))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if want := self(); *o != *want {
		t.Fatalf("peer %+v, want this process %+v", *o, *want)
	}
}

// An owned create names no owner: a body that tries is refused.
func TestOwnedCreateTakesNoOwnerFromTheRequest(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler), trials: make(map[string]*trial)}
	sock := serveControl(t, a)
	// Raw, as a Client's Create has no way to send an owner.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Post("http://trialnet/v1/trials", "application/json", strings.NewReader(`{"id":"agt-own-x","owned":true,"owner":{"pid":1,"start":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Error *client.Error }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error == nil ||
		body.Error.Code != client.CodeBadRequest || !strings.Contains(body.Error.Message, `unknown field "owner"`) {
		t.Fatalf("a create naming its owner: %s, %+v (%v), want bad_request", resp.Status, body.Error, err)
	}
}

// trialGone waits, bounded, until nothing of Trial info is left: the
// agent's registry, its namespace, cgroup, record and policy entry.
func trialGone(t *testing.T, a *Agent, info client.TrialInfo, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := leftOf(a, info)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Trial %s still there after %v: %s", info.ID, d, strings.Join(left, ", "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func leftOf(a *Agent, info client.TrialInfo) []string {
	var left []string
	if _, err := a.Get(context.Background(), info.ID); err == nil {
		left = append(left, "listed")
	}
	for _, p := range []string{info.Netns, info.Cgroup, filepath.Join(a.cfg.Host.StateDir, info.ID+".json")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			left = append(left, p)
		}
	}
	if a.host.BPF.HasTrial(info.CgroupID) {
		left = append(left, "policy entry")
	}
	return left
}

func ids(l []client.TrialInfo) []string {
	var out []string
	for _, i := range l {
		out = append(out, i.ID)
	}
	return out
}

// Owned Trials end with their owner, across an agent restart too: one
// whose owner died while no agent ran is removed by the next agent, one
// whose owner lives is re-adopted and still removed when it dies. A
// Trial without owner is left alone throughout.
func TestPrivilegedOwnedTrialsAcrossRestart(t *testing.T) {
	privtest.Require(t)
	privtest.RequireKernel(t, HavePeerPidfd())
	cfg := AgentConfig{Host: isolatedHost(t), DataDir: t.TempDir(), Resolvers: []string{"127.0.0.1:9"}}
	var firstLog, secondLog lockedBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&firstLog, nil))
	a, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sock := serveControl(t, a)
	dead, _ := ownerProcess(t, sock, "agt-own-dead")
	live, liveIn := ownerProcess(t, sock, "agt-own-live")
	if _, err := client.NewClient(sock).Create(context.Background(), trialspec.Request{ID: "agt-own-none"}); err != nil {
		t.Fatal(err)
	}
	infos := map[string]client.TrialInfo{}
	for _, info := range a.list() {
		infos[info.ID] = info
	}
	for id, want := range map[string]int{"agt-own-dead": dead.Process.Pid, "agt-own-live": live.Process.Pid, "agt-own-none": 0} {
		if got := ownerPID(infos[id].Owner); got != want {
			t.Fatalf("%s: owner pid %d, want %d", id, got, want)
		}
	}
	a.Close(false) // the Trials stay, their owners unwatched
	_ = dead.Process.Kill()
	_ = dead.Wait()
	if left := leftOf(a, infos["agt-own-dead"]); !slices.Contains(left, infos["agt-own-dead"].Cgroup) {
		t.Fatalf("the Trial of the owner killed after the agent stopped went with it (left: %v): the test cannot tell", left)
	}

	cfg.Logger = slog.New(slog.NewTextHandler(&secondLog, nil))
	b := startAgent(t, cfg)
	trialGone(t, b, infos["agt-own-dead"], time.Second) // by Start itself
	if got := ids(b.list()); !slices.Equal(got, []string{"agt-own-live", "agt-own-none"}) {
		t.Fatalf("re-adopted %v, want agt-own-live and agt-own-none\n%s", got, secondLog.String())
	}
	if want := fmt.Sprintf("owner pid %d exited", dead.Process.Pid); !strings.Contains(secondLog.String(), want) {
		t.Errorf("the restarted agent's log does not say %q:\n%s", want, secondLog.String())
	}
	if info, _ := b.Get(context.Background(), "agt-own-live"); ownerPID(info.Owner) != live.Process.Pid {
		t.Fatalf("re-adopted agt-own-live with owner %+v, want pid %d", info.Owner, live.Process.Pid)
	}

	_ = liveIn.Close() // the owner exits of itself
	_ = live.Wait()
	trialGone(t, b, infos["agt-own-live"], 15*time.Second)
	if want := fmt.Sprintf("owner pid %d exited", live.Process.Pid); !strings.Contains(secondLog.String(), want) {
		t.Errorf("the agent's log does not say %q:\n%s", want, secondLog.String())
	}
	if got := ids(b.list()); !slices.Equal(got, []string{"agt-own-none"}) {
		t.Fatalf("live Trials %v, want only agt-own-none", got)
	}
}

// Watching owners leaks nothing: owned Trials destroyed while their owner
// lives, and ones removed because it died, leave no goroutine, file
// descriptor, namespace or cgroup behind; nor does an agent closed while
// it watches.
func TestPrivilegedOwnerWatchNoLeaks(t *testing.T) {
	privtest.Require(t)
	privtest.RequireKernel(t, HavePeerPidfd())
	cfg := AgentConfig{Host: isolatedHost(t), DataDir: t.TempDir(), Resolvers: []string{"127.0.0.1:9"}}
	a, closeAgent := startAgentToClose(t, cfg)
	sock := serveControl(t, a)
	// One round first, so lazily made things exist before the baseline.
	warm, warmIn := ownerProcess(t, sock, "agt-ownleak-warm")
	info, _ := a.Get(context.Background(), "agt-ownleak-warm")
	_ = warmIn.Close()
	_ = warm.Wait()
	trialGone(t, a, info, 15*time.Second)
	// Its watcher destroys it, so it outlives the Trial by Destroy's tail.
	if n := waitWatching(0); n != 0 {
		t.Fatalf("%d goroutines still watch the warm-up Trial's owner after it was destroyed", n)
	}
	waitGoroutines := func(n int) int {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > n && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		return runtime.NumGoroutine()
	}
	// The shell pool full, before and after: its shells hold descriptors.
	readyShells(t, a, a.file.Load().PreparedShells())
	gor := runtime.NumGoroutine()
	fds := testkit.CountFDs(t)
	ns, _ := netns.List(cfg.Host.NetnsDir)
	cgs := cgroupChildren(t, a.host.Parent)

	var kept, dropped []string
	for i := range 20 {
		kept = append(kept, fmt.Sprintf("agt-ownleak-k%d", i))
		dropped = append(dropped, fmt.Sprintf("agt-ownleak-d%d", i))
	}
	keeper, keeperIn := ownerProcess(t, sock, kept...)
	if n := watching(); n != len(kept) {
		t.Fatalf("%d goroutines watch owners, want %d", n, len(kept))
	}
	for _, id := range kept {
		if _, err := a.Destroy(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	if n := waitWatching(0); n != 0 {
		t.Errorf("%d goroutines still watch the owner of Trials destroyed while it lives", n)
	}
	dier, _ := ownerProcess(t, sock, dropped...)
	var infos []client.TrialInfo
	for _, id := range dropped {
		info, err := a.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		infos = append(infos, info)
	}
	if err := dier.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = dier.Wait()
	for _, info := range infos {
		trialGone(t, a, info, 15*time.Second)
	}
	_ = keeperIn.Close()
	_ = keeper.Wait()
	if n, _ := netns.List(cfg.Host.NetnsDir); len(n) != len(ns) {
		t.Errorf("namespaces: %d before, %d after", len(ns), len(n))
	}
	if n := cgroupChildren(t, a.host.Parent); n != cgs {
		t.Errorf("Trial cgroups: %d before, %d after", cgs, n)
	}
	// Goroutines first: a watch closes its pidfd as it ends.
	if n := waitGoroutines(gor); n > gor {
		t.Errorf("goroutines: %d before, %d after", gor, n)
	}
	readyShells(t, a, a.file.Load().PreparedShells())
	n := testkit.CountFDs(t)
	for end := time.Now().Add(5 * time.Second); n > fds && time.Now().Before(end); n = testkit.CountFDs(t) {
		time.Sleep(20 * time.Millisecond)
	}
	if n > fds {
		t.Errorf("file descriptors: %d before, %d after (pidfds or listeners leaked)", fds, n)
	}

	// Closing the agent (its Trials left for the next) ends the watches
	// it has; the isolated host's cleanup removes the Trials.
	_, _ = ownerProcess(t, sock, "agt-ownleak-c1", "agt-ownleak-c2")
	// An earlier owner's watch may still be on its way out (slow guests).
	if n := waitWatching(2); n != 2 {
		t.Fatalf("%d goroutines watch owners, want 2", n)
	}
	closeAgent(false)
	if n := waitWatching(0); n != 0 {
		t.Errorf("%d goroutines still watch owners after Close", n)
	}
}

// waitWatching waits, bounded, until n goroutines or fewer watch owners.
func waitWatching(n int) int {
	deadline := time.Now().Add(5 * time.Second)
	for watching() > n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return watching()
}

// watching counts the goroutines that watch an owner.
func watching() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), ").watchOwner.func")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// An agent older than the owned field refuses it as an unknown field;
// the client says what that means and what to do.
func TestOwnedCreateOnAnOlderAgentSaysSo(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "old.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, errf(client.CodeBadRequest, "request body: json: unknown field \"owned\""))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, err = client.NewClient(sock).Create(context.Background(), trialspec.Request{Owned: true})
	var e *client.Error
	if err == nil || !strings.Contains(err.Error(), "older than this trialnet") || !strings.Contains(err.Error(), "Restart the agent") || !errors.As(err, &e) {
		t.Fatalf("owned create on an older agent: %v", err)
	}
}

// The control API serves root only, whatever the socket's mode: a caller
// of another uid, which a wrong mode would let connect, is refused.
func TestPrivilegedControlRefusesNonRoot(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "curl")
	a, err := Start(AgentConfig{Host: isolatedHost(t), DataDir: t.TempDir(), Resolvers: []string{"127.0.0.1:9"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(true) })
	dir, err := os.MkdirTemp("", "trialnet-control-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := ListenSocket(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := a.Server()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	// The mistake this guards against: the socket reachable by anyone.
	for _, p := range []string{dir, sock} {
		if err := os.Chmod(p, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		uid          uint32
		status, body string
	}{{65534, "403", `"code":"not_root"`}, {0, "200", "["}} {
		cmd := exec.Command("curl", "-sS", "--max-time", "10", "-w", " %{http_code}", "--unix-socket", sock, "http://agent/v1/trials")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: c.uid, Gid: c.uid}}
		out, err := cmd.CombinedOutput()
		var body, status string // curl prints the body, then " <status>"
		if i := strings.LastIndex(string(out), " "); i >= 0 {
			body, status = string(out[:i]), string(out[i+1:])
		}
		if err != nil || status != c.status || !strings.HasPrefix(body, "{") && !strings.HasPrefix(body, "[") || !strings.Contains(body, c.body) {
			t.Errorf("uid %d: %q %v, want %s with %q", c.uid, out, err, c.status, c.body)
		}
	}
}
