//go:build linux

package clients

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

// nestedTrial makes a nested Trial, or, where this host cannot nest,
// shows that it refuses to, saying why, and returns nil.
func (w *world) nestedTrial(t *testing.T, name string, req trialspec.Request) *trial {
	t.Helper()
	req.Nested = true
	tc, err := w.tryTrial(t, name, nobody, req)
	if err != nil {
		if !strings.Contains(err.Error(), "nested sandboxes are not available here") {
			t.Fatalf("a nested Trial: %v", err)
		}
		if os.Getenv("TRIALNET_REQUIRE_LSM") == "1" {
			t.Fatalf("a nested Trial on a host with the BPF LSM layer: %v", err)
		}
		t.Logf("refused here, as it must be without the BPF LSM layer: %v", err)
		return nil
	}
	return tc
}

// loginFile is the file a seed Harness keeps its login in, its user's.
func (tc *trial) loginFile(body string) string {
	tc.t.Helper()
	p := filepath.Join(tc.w.dir, "login-"+tc.info.ID+".json")
	tc.write(p, body)
	return p
}

// The seed's shape: bwrap inside a nested Trial, with a Harness (curl)
// that reaches its allowed host through the proxy and nothing else; the
// same from an --unshare-net sandbox through a unix-socket relay to the
// proxy, as the seed plans; and mounts from the sandbox's own user
// namespace that put a host socket where the Trial may connect, refused.
func TestPrivilegedNestedSandbox(t *testing.T) {
	privtest.Require(t)
	for _, b := range []string{"bwrap", "socat", "curl"} {
		privtest.RequireTool(t, b)
	}
	w := newAgentWorld(t)
	host, reached := hostSocket(t)
	allowedSock := filepath.Join(privtest.SharedDir(t, "allowed-"), "allowed.sock")
	allowedHits := privtest.ServeUnix(t, allowedSock, "allowed-socket\n")
	tc := w.nestedTrial(t, "nested", trialspec.Request{Allow: []string{"allowed." + domain + ":443"}, UnixAllow: []string{allowedSock}})
	if tc == nil {
		return
	}
	login := tc.loginFile(`{"token":"seed-login"}`)
	addr := w.host.Addr4.String()
	connect := func(path string) string {
		return "/usr/bin/python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print(s.recv(64).decode().strip() or \"connected\")' " + path
	}

	// seed shape (tc runs as the test, so no subtest)
	func() {
		script := `cat "$HOME/` + filepath.Base(login) + `"; echo '{"token":"refreshed"}' > "$HOME/` + filepath.Base(login) + `"
curl -sS --max-time 30 ` + url("allowed."+domain, "/hello") + `
curl -sS --max-time 30 -o /dev/null ` + url(deniedHost, "/hello") + ` 2>&1 || echo denied-refused
curl -sS --max-time 5 --noproxy '*' -o /dev/null https://` + addr + `/hello 2>&1 || echo direct-refused
` + connect(allowedSock) + `
` + connect(host) + ` 2>&1 || echo host-socket-refused`
		argv := append(testenv.SeedBwrap(tc.home, login), "/bin/sh", "-c", script)
		code, out := tc.run(true, nil, argv...)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		for _, want := range []string{"seed-login", "hello from allowed." + domain, "denied-refused", "direct-refused", "allowed-socket", "host-socket-refused"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if b, err := os.ReadFile(login); err != nil || !strings.Contains(string(b), "refreshed") {
			t.Errorf("the login file, bound read-write: %q, %v", b, err)
		}
		if _, ok := tc.waitDecision(deniedHost, 443, record.DecisionDeny, ""); !ok {
			t.Errorf("no deny decision for %s", deniedHost)
		}
		t.Logf("bwrap in a nested Trial:\n%s", strings.TrimSpace(out))
	}()

	// unshare-net relay (tc runs as the test, so no subtest)
	func() {
		// The relay's socket is in a directory the sandbox binds in: its
		// own /tmp is fresh.
		script := `mkdir -p /tmp/relay
socat UNIX-LISTEN:/tmp/relay/proxy.sock,fork TCP:127.0.0.1:3128 &
relay=$!
for i in $(seq 50); do [ -S /tmp/relay/proxy.sock ] && break; sleep 0.1; done
` + strings.Join(testenv.SeedBwrap(tc.home, login, "--unshare-net", "--bind", "/tmp/relay", "/tmp/relay"), " ") + ` /bin/sh -c '
socat TCP-LISTEN:3128,bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:/tmp/relay/proxy.sock &
inner=$!
for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:3128/ && break; sleep 0.1; done
curl -sS --max-time 30 ` + url("allowed."+domain, "/hello") + `
curl -sS --max-time 5 --noproxy "*" -o /dev/null https://` + addr + `/hello 2>&1 || echo direct-refused
kill $inner'
code=$?
kill $relay
exit $code`
		code, out := tc.run(true, []string{"HTTPS_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128"}, "/bin/sh", "-c", script)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		for _, want := range []string{"hello from allowed." + domain, "direct-refused"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		t.Logf("an --unshare-net sandbox through a unix relay:\n%s", strings.TrimSpace(out))
	}()

	// mounts from a nested user namespace (tc runs as the test, so no subtest)
	func() {
		before := allowedHits.Load()
		// A host socket bound over a path in the sandbox's /tmp, and over
		// the Trial's allowed socket.
		argv := append(testenv.SeedBwrap(tc.home, login, "--bind", host, "/tmp/x.sock", "--bind", host, allowedSock),
			"/bin/sh", "-c", connect("/tmp/x.sock")+" 2>&1 || echo tmp-refused; "+connect(allowedSock)+" 2>&1 || echo allowed-path-refused")
		code, out := tc.run(false, nil, argv...)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		for _, want := range []string{"tmp-refused", "allowed-path-refused"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if n := allowedHits.Load() - before; n != 0 {
			t.Errorf("the allowed socket's server saw %d connections, but its path led to another socket", n)
		}
	}()

	if n := reached.Load(); n != 0 {
		t.Errorf("the host socket accepted %d connections from the nested Trial", n)
	}
	// The stats, and so the signed receipt, say the Trial was nested.
	st, err := w.agent.Stats(context.Background(), tc.info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Layers.Nested || !strings.Contains(st.Layers.String(), "nested sandboxes allowed") {
		t.Errorf("the layers of a nested Trial: %+v (%s)", st.Layers, st.Layers)
	}
	if _, egress := tc.kernel(); egress != 0 {
		t.Errorf("%d direct egress packets", egress)
	}
}

// ^C and SIGTERM reach the innermost process through bwrap, and nothing of
// a sandbox with its own PID namespace outlives the Trial.
func TestPrivilegedNestedSignalsAndCleanup(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "bwrap")
	w := newAgentWorld(t)
	tc := w.nestedTrial(t, "nested-signals", trialspec.Request{Allow: []string{"allowed." + domain + ":443"}})
	if tc == nil {
		return
	}
	login := tc.loginFile("{}")
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The signal is sent once the innermost command runs: earlier,
			// it may find bwrap still setting up --die-with-parent (seen
			// under emulation), which is bwrap's window, not the Trial's.
			outR, outW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer outR.Close()
			sigs := make(chan os.Signal, 1)
			go func() {
				_ = outR.SetReadDeadline(time.Now().Add(30 * time.Second))
				_, _ = bufio.NewReader(outR).ReadString('\n')
				sigs <- sig
			}()
			start := time.Now()
			argv := append(testenv.SeedBwrap(tc.home, login), "/bin/sh", "-c", "echo started; exec sleep 300")
			code, err := tc.tr.Exec(ctx, sandbox.Command{Args: argv, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: outW, Stderr: outW}, sigs)
			_ = outW.Close()
			if err != nil || code == 0 {
				t.Fatalf("exit %d, %v; want the signal to end it", code, err)
			}
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("it took %v to end", d)
			}
			// The innermost sleep died with bwrap: only the Trial's init
			// is left.
			waitProcs(t, tc.info.Cgroup, 1)
		})
	}

	// A sandbox still running, its PID namespace holding processes that
	// ignore SIGTERM, when the Trial is destroyed: nothing of it is left.
	var argv []string
	for _, a := range testenv.SeedBwrap(tc.home, login) {
		if a != "--die-with-parent" {
			argv = append(argv, a)
		}
	}
	argv = append(argv, "/bin/sh", "-c", "trap '' TERM; sleep 300 & sleep 300 & echo started; wait")
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	p, err := tc.tr.Start(sandbox.Command{Args: argv, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: outW, Stderr: outW})
	_ = outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	_ = outR.SetReadDeadline(time.Now().Add(30 * time.Second))
	if line, err := bufio.NewReader(outR).ReadString('\n'); err != nil || !strings.Contains(line, "started") {
		t.Fatalf("the sandbox said %q (%v)", line, err)
	}
	pids := cgroupProcs(t, tc.info.Cgroup)
	if len(pids) < 5 {
		t.Fatalf("the Trial holds %d processes (%v), want its init, bwrap's two, the shell and two sleeps", len(pids), pids)
	}
	if _, err := w.agent.Destroy(context.Background(), tc.info.ID); err != nil {
		t.Fatal(err)
	}
	_, _ = p.Wait()
	for _, pid := range pids {
		if alive(pid) {
			b, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
			t.Errorf("pid %s (%q) outlived its Trial", pid, b)
		}
	}
}

// alive says whether pid still runs, a moment after its Trial ended: a
// zombie has ended (the Trial's init is reaped by a goroutine of its
// launcher, which may not have run yet).
func alive(pid string) bool {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
		if err != nil {
			return false
		}
		// The state follows the command name, which ends with the last ')'.
		if i := bytes.LastIndexByte(b, ')'); i > 0 && len(b) > i+2 && b[i+2] == 'Z' {
			return false
		}
		if time.Now().After(deadline) {
			return true
		}
	}
}

// cgroupProcs lists the pids in cgroup and every cgroup below it.
func cgroupProcs(t *testing.T, cgroup string) []string {
	t.Helper()
	var pids []string
	err := filepath.WalkDir(cgroup, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.Name() != "cgroup.procs" {
			return err
		}
		b, err := os.ReadFile(p)
		pids = append(pids, strings.Fields(string(b))...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// waitProcs waits (bounded) until cgroup holds n processes.
func waitProcs(t *testing.T, cgroup string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := cgroupProcs(t, cgroup)
		if len(pids) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Trial holds %d processes (%v), want %d", len(pids), pids, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
