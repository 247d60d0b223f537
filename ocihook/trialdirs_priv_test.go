//go:build linux

package ocihook

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/agentwire"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/trial"
)

// mountWorld is a Trial, and a way to run the hook for a new container
// process in it that has one bind the config does not name (a source
// swapped after the runtime resolved it, a mount propagated in).
type mountWorld struct {
	info client.TrialInfo
	sock string
	// roots are the hook's storage roots (a temporary one).
	roots []string
}

func newMountWorld(t *testing.T, id string) *mountWorld {
	t.Helper()
	privtest.Require(t)
	privtest.RequireTool(t, "nsenter")
	a, _, sock := testenv.ServedAgent(t, "ocihook-"+id, agent.AgentConfig{})
	info, err := a.Create(context.Background(), trial.Request{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return &mountWorld{info: info, sock: sock, roots: []string{filepath.Join(t.TempDir(), "storage")}}
}

// run starts container cid's process with src bound on /mnt of its root
// file system, and runs the hook for it.
func (w *mountWorld) run(t *testing.T, cid, src string) (mnt string, err error) {
	t.Helper()
	bundle := t.TempDir()
	mnt = filepath.Join(bundle, "rootfs", "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := goodConfig()
	cfg["annotations"] = map[string]string{AnnotationTrial: w.info.ID}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), mustJSON(t, cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	inTrial := filepath.Join(w.info.Cgroup, cid)
	if err := os.Mkdir(inTrial, 0o755); err != nil {
		t.Fatal(err)
	}
	pid := testenv.StartIn(t, inTrial, w.info.Netns, syscall.CLONE_NEWPID|syscall.CLONE_NEWCGROUP|syscall.CLONE_NEWNS|syscall.CLONE_NEWIPC)
	bindIn(t, pid, src, mnt)
	hook := &Hook{Agent: func() Agent { return agentwire.NewDirect(w.sock) }, Socket: w.sock, StorageRoots: w.roots}
	st := mustJSON(t, State{OCIVersion: "1.0.2", ID: cid, Status: "creating", Pid: pid, Bundle: bundle,
		Annotations: map[string]string{AnnotationTrial: w.info.ID}})
	_, err = hook.Run(context.Background(), strings.NewReader(string(st)))
	return mnt, err
}

// The agent's namespace pin directory is trialnet's own wherever its
// config puts it (here not under the control socket's directory): a
// bind of it in a container's mount namespace is refused, as the kernel
// shows it.
func TestPrivilegedHookRefusesTheNetnsPinDir(t *testing.T) {
	w := newMountWorld(t, "hook-pins")
	pins := filepath.Dir(w.info.Netns)
	if strings.HasPrefix(pins, filepath.Dir(w.sock)+"/") {
		t.Fatalf("the pins (%s) are under the socket's directory, protected anyway: the test shows nothing", pins)
	}
	mnt, err := w.run(t, "ctr-pins", pins)
	want := fmt.Sprintf("the kernel shows a mount on %s", mnt)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), pins) {
		t.Fatalf("got %v, want refused: %q, naming %s", err, want, pins)
	}
}

// Another container's runtime data, mounted as the kernel shows it and
// named by no config, is refused; the container's own passes.
func TestPrivilegedHookRefusesOtherContainersDataMounted(t *testing.T) {
	w := newMountWorld(t, "hook-data")
	const other = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, id := range []string{other, "ctr-own"} {
		if err := os.MkdirAll(filepath.Join(w.roots[0], "overlay-containers", id, "userdata", "shm"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	own := filepath.Join(w.roots[0], "overlay-containers", "ctr-own", "userdata", "shm")
	if _, err := w.run(t, "ctr-own", own); err != nil {
		t.Fatalf("its own userdata: %v", err)
	}
	for _, tc := range []struct{ name, src, want string }{
		{"another's shm", filepath.Join(w.roots[0], "overlay-containers", other, "userdata", "shm"), "is container " + other + "'s runtime data"},
		{"every container's", filepath.Join(w.roots[0], "overlay-containers"), "holds every container's data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mnt, err := w.run(t, "ctr-"+strings.ReplaceAll(tc.name, " ", "-")[:7], tc.src)
			want := fmt.Sprintf("the kernel shows a mount on %s", mnt)
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want refused: %q, %q", err, want, tc.want)
			}
		})
	}
}

// An agent whose config moves its state, data, receipt key and pin
// directories away from the defaults (and from the control socket's
// directory) tells the hook where they are: a bind of each is refused.
func TestPrivilegedHookRefusesMovedAgentDirs(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "nsenter")
	host := testenv.IsolatedHost(t, "ocihook-moved")
	moved := map[string]string{"state": host.StateDir, "netns pins": host.NetnsDir,
		"data": filepath.Join(t.TempDir(), "data"), "receipt key": t.TempDir()}
	cfg := agent.AgentConfig{Host: host, DataDir: moved["data"], ReceiptKey: filepath.Join(moved["receipt key"], "receipt.key"),
		Resolvers: []string{"127.0.0.1:9"}}
	a, err := agent.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(true) })
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := agent.ListenSocket(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := a.Server()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	info, err := a.Create(context.Background(), trial.Request{ID: "hook-moved"})
	if err != nil {
		t.Fatal(err)
	}
	w := &mountWorld{info: info, sock: sock, roots: []string{filepath.Join(t.TempDir(), "storage")}}
	for what, dir := range moved {
		if strings.HasPrefix(dir, filepath.Dir(sock)+"/") || strings.HasPrefix(dir, "/var/lib/trialnet") {
			t.Fatalf("the %s directory (%s) is protected anyway: the test shows nothing", what, dir)
		}
		t.Run(what, func(t *testing.T) {
			mnt, err := w.run(t, "ctr-"+strings.ReplaceAll(what, " ", "-"), dir)
			want := fmt.Sprintf("the kernel shows a mount on %s", mnt)
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("got %v, want refused: %q, naming %s", err, want, dir)
			}
		})
	}
}

// The host's devpts, bound in (by path, or under a recursive bind of
// /dev), holds the host's terminals: the operator's pty, which the
// container's root could read and write. Refused as the kernel shows it.
func TestPrivilegedHookRefusesTheHostsDevpts(t *testing.T) {
	w := newMountWorld(t, "hook-pts")
	mnt, err := w.run(t, "ctr-pts", "/dev/pts")
	want := fmt.Sprintf("the kernel shows a mount on %s", mnt)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "the host's devpts") {
		t.Fatalf("got %v, want refused: %q, the host's devpts", err, want)
	}
}
