//go:build linux

package containers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/keeper"
	"golang.org/x/sys/unix"
)

const echoPort = 9000

// daemonWorld is a world whose agent is trialnet's binary (trialnet
// agent --config), so that a second one can take over from it.
func daemonWorld(t *testing.T) (*world, string) {
	t.Helper()
	w := &world{t: t, host: testhost.NewT(t, subnet)}
	for port, serve := range map[uint16]func(net.Listener){
		80: func(ln net.Listener) {
			srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, greeting) }),
				ReadHeaderTimeout: 10 * time.Second}
			_ = srv.Serve(ln)
		},
		echoPort: testhost.Echo,
	} {
		ln, err := w.host.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(w.host.Addr4, port).String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		go serve(ln)
	}
	dnsAddr, stop, err := testhost.ServeDNS(w.host.Addr4, "allowed.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	host := testenv.IsolatedHost(t, "ctrho")
	dir := t.TempDir()
	w.dir, w.sock = dir, filepath.Join(dir, "agent.sock")
	cfg := fmt.Sprintf("resolvers: [%q]\nallow_cidrs: [\"198.18.0.0/15\"]\nprofiles:\n  %s:\n    allow: [\"allowed.test:80\", \"allowed.test:%d\"]\n", dnsAddr, profile, echoPort)
	cfg += fmt.Sprintf("paths:\n  socket: %s\n  state_dir: %s\n  data_dir: %s\n  pin_dir: %s\n  netns_dir: %s\n  cgroup_parent: %s\n",
		w.sock, host.StateDir, filepath.Join(dir, "data"), host.PinDir, host.NetnsDir, host.Parent)
	path := filepath.Join(dir, "trialnet.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = keeper.Stop(keeper.DefaultSocket(w.sock)) })
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Fatal(err)
	}
	w.cgroup = strings.TrimPrefix(host.Parent, mount) + "/none" // bundles' cgroups go beside it
	w.bin = os.Getenv("TRIALNET_TEST_BIN")
	if w.bin == "" {
		w.bin = filepath.Join(t.TempDir(), "trialnet")
		testkit.BuildTrialnet(t, "../..", w.bin)
		testkit.BuildTrialnetOCI(t, "../..", w.bin) // the bundles' hook
	}
	// Not in dir: the hook refuses a root that holds the control
	// socket's directory.
	w.rootfs = filepath.Join(t.TempDir(), "rootfs")
	w.makeRootfs()
	return w, path
}

// startAgent starts trialnet agent, its output appended to log, and
// waits until the control socket is served by it.
func (w *world) startAgent(config string, log *os.File) *exec.Cmd {
	w.t.Helper()
	cmd := exec.Command(w.bin, "agent", "--config", config)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	})
	for end := time.Now().Add(30 * time.Second); servingPID(w.sock) != cmd.Process.Pid; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			b, _ := os.ReadFile(log.Name())
			w.t.Fatalf("the agent did not come to serve %s:\n%s", w.sock, b)
		}
	}
	return cmd
}

// servingPID is the pid of the process serving the control socket (0:
// none).
func servingPID(sock string) int {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return 0
	}
	defer c.Close()
	raw, _ := c.(*net.UnixConn).SyscallConn()
	var pid int
	_ = raw.Control(func(fd uintptr) {
		if cr, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cr.Pid)
		}
	})
	return pid
}

// A Trial made around a container survives an agent hand-over: a
// tunnel its container opened before keeps carrying bytes after, the
// new agent's proxy serves its new requests, and the new agent destroys
// the Trial when the container ends (and not before, when told so while
// it runs). The hook runs at createRuntime only, as its installed entries
// run it for a profile: no poststop tells the new agent the container
// ended, it sees the init exit itself.
func TestPrivilegedContainerTrialSurvivesHandover(t *testing.T) {
	requireRuntimes(t, false, "runc")
	w, config := daemonWorld(t)
	log, err := os.Create(filepath.Join(t.TempDir(), "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	logged := func() string { b, _ := os.ReadFile(log.Name()); return string(b) }
	old := w.startAgent(config, log)
	r := w.profileRunc(t)
	ctl := t.TempDir()
	script := fmt.Sprintf(`echo %s
( printf 'CONNECT allowed.test:%d HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n'; echo before-handover; while [ ! -e /ctl/go ]; do sleep 0.1; done; echo after-handover; sleep 1 ) | nc 127.0.0.1 3128
wget -q -O - http://allowed.test/; echo wget-exit=$?`, started, echoPort, echoPort)
	o := w.profileBundle("prof-ho", script, "createRuntime")
	o.binds = map[string]string{"/ctl": ctl}
	bundle := r.bundle("prof-ho", o)
	var out bytes.Buffer
	ctr := r.command("run", "--bundle", bundle, "prof-ho")
	ctr.Stdout, ctr.Stderr = &out, &out
	if err := ctr.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command("runc", "--root", r.state, "delete", "--force", "prof-ho").Run()
		if ctr.ProcessState == nil {
			_ = ctr.Wait()
		}
	})
	cl := client.NewClient(w.sock)
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, err := cl.Stats(context.Background(), "prof-ho"); err == nil && st.Proxy.Active > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the container's tunnel did not open:\n%s\nagent:\n%s", &out, logged())
		}
	}
	// A container's end told while it runs (another runtime's container
	// of the same id) does not end its Trial.
	if end, err := cl.EndContainer(context.Background(), "prof-ho"); err == nil || !strings.Contains(err.Error(), "still runs") {
		t.Errorf("ending a running container's Trial: %+v, %v; want refused", end, err)
	}
	if _, err := cl.Get(context.Background(), "prof-ho"); err != nil {
		t.Fatalf("the Trial of a running container: %v", err)
	}
	next := w.startAgent(config, log)
	if err := os.WriteFile(filepath.Join(ctl, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ctr.Wait(); err != nil {
		t.Fatalf("the container: %v\n%s\nagent:\n%s", err, &out, logged())
	}
	t.Logf("the container across the hand-over:\n%s", &out)
	for _, want := range []string{started, "HTTP/1.1 200", "before-handover", "after-handover", greeting, "wget-exit=0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the container's output lacks %q", want)
		}
	}
	if err := old.Wait(); err != nil {
		t.Errorf("the old agent after its drain: %v", err)
	}
	// Gone means unknown to the agent: any other error (the socket
	// between agents) is not an answer.
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := cl.Get(context.Background(), "prof-ho")
		if e := (*client.Error)(nil); errors.As(err, &e) && e.Code == client.CodeUnknownTrial {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the new agent did not end the Trial with its container (%v):\n%s", err, logged())
		}
	}
	st, err := w.finalStats("prof-ho")
	if err != nil || st.Receipt == nil || st.Proxy.Allowed < 2 || st.Egress != 0 {
		t.Errorf("the Trial's final stats from the new agent: %v, %+v", err, st.Proxy)
	}
	if pid := servingPID(w.sock); pid != next.Process.Pid {
		t.Errorf("the socket is served by pid %d, not the new agent %d", pid, next.Process.Pid)
	}
}
