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
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/trial"
)

// The agent's namespace pin directory is trialnet's own wherever its
// config puts it (here not under the control socket's directory): a
// bind of it in a container's mount namespace is refused, as the kernel
// shows it.
func TestPrivilegedHookRefusesTheNetnsPinDir(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "nsenter")
	a, _, sock := testenv.ServedAgent(t, "ocihook-pins", agent.AgentConfig{})
	ctx := context.Background()
	info, err := a.Create(ctx, trial.Request{ID: "hook-pins"})
	if err != nil {
		t.Fatal(err)
	}
	pins := filepath.Dir(info.Netns)
	if strings.HasPrefix(pins, filepath.Dir(sock)+"/") {
		t.Fatalf("the pins (%s) are under the socket's directory, protected anyway: the test shows nothing", pins)
	}
	bundle := t.TempDir()
	mnt := filepath.Join(bundle, "rootfs", "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := goodConfig()
	cfg["annotations"] = map[string]string{AnnotationTrial: "hook-pins"}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), mustJSON(t, cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	inTrial := filepath.Join(info.Cgroup, "ctr-pins")
	if err := os.Mkdir(inTrial, 0o755); err != nil {
		t.Fatal(err)
	}
	pid := testenv.StartIn(t, inTrial, info.Netns, syscall.CLONE_NEWPID|syscall.CLONE_NEWCGROUP|syscall.CLONE_NEWNS)
	bindIn(t, pid, pins, mnt)
	hook := &Hook{Agent: func() Agent { return client.NewClient(sock) }, Socket: sock}
	st := mustJSON(t, State{OCIVersion: "1.0.2", ID: "ctr", Status: "creating", Pid: pid, Bundle: bundle,
		Annotations: map[string]string{AnnotationTrial: "hook-pins"}})
	_, err = hook.Run(ctx, strings.NewReader(string(st)))
	want := fmt.Sprintf("the kernel shows a mount on %s", mnt)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), pins) {
		t.Fatalf("got %v, want refused: %q, naming %s", err, want, pins)
	}
}
