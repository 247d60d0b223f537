//go:build linux

package ocihook

import (
	"context"
	"encoding/json"
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

// The hook against real processes, placed as a runtime would place a
// container (no runtime runs on a hybrid cgroup host): one in a child of
// the Trial's cgroup, in its network namespace and new PID, cgroup and
// mount namespaces, is let in and reported by the Trial's layers and
// receipt; one outside the Trial, one on the host's network and one in
// the host's PID namespace are refused.
func TestPrivilegedHookRealProcesses(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "nsenter")
	a, dir, sock := testenv.ServedAgent(t, "ocihook", agent.AgentConfig{})
	ctx := context.Background()
	info, err := a.Create(ctx, trial.Request{ID: "hook-1"})
	if err != nil {
		t.Fatal(err)
	}
	hook := &Hook{Agent: func() Agent { return client.NewClient(sock) }, Socket: sock}
	bundle := filepath.Join(dir, "bundle")
	if err := os.Mkdir(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := goodConfig()
	cfg["annotations"] = map[string]string{AnnotationTrial: "hook-1"}
	b := mustJSON(t, cfg)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	inTrial := filepath.Join(info.Cgroup, "ctr-in")
	if err := os.Mkdir(inTrial, 0o755); err != nil {
		t.Fatal(err)
	}
	newNS := uintptr(syscall.CLONE_NEWPID | syscall.CLONE_NEWCGROUP | syscall.CLONE_NEWNS)
	run := func(pid int) error {
		st := mustJSON(t, State{OCIVersion: "1.0.2", ID: "ctr", Status: "creating", Pid: pid, Bundle: bundle,
			Annotations: map[string]string{AnnotationTrial: "hook-1"}})
		_, err := hook.Run(ctx, strings.NewReader(string(st)))
		return err
	}

	pid := testenv.StartIn(t, inTrial, info.Netns, newNS)
	if err := run(pid); err != nil {
		t.Fatalf("a process in its Trial's network namespace and a child of its cgroup: %v", err)
	}
	st, err := a.Stats(ctx, "hook-1")
	if err != nil {
		t.Fatal(err)
	}
	if st.Layers.Containers != 1 || !strings.Contains(st.Layers.String(), "in its 1 container(s): "+client.ContainerLayers) {
		t.Errorf("the Trial's layers after a container joined: %d containers, %q", st.Layers.Containers, st.Layers.String())
	}

	for _, tc := range []struct {
		name          string
		cgroup, netns string
		flags         uintptr
		want1, want2  string
	}{
		{"outside the Trial", testenv.PlainCgroup(t, "ocihook"), "", newNS, "network namespace is not the Trial's", "is not the Trial's (" + info.Cgroup},
		{"host network", inTrial, "", newNS, "network namespace is not the Trial's", ""},
		{"host PID namespace", inTrial, info.Netns, syscall.CLONE_NEWCGROUP | syscall.CLONE_NEWNS, "shares the runtime's (the host's) pid namespace", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(testenv.StartIn(t, tc.cgroup, tc.netns, tc.flags))
			if err == nil || !strings.Contains(err.Error(), tc.want1) || !strings.Contains(err.Error(), tc.want2) {
				t.Fatalf("got %v, want refused: %q, %q", err, tc.want1, tc.want2)
			}
		})
	}
	st, err = a.Destroy(ctx, "hook-1")
	if err != nil {
		t.Fatalf("destroy a Trial with a container's cgroup in it: %v", err)
	}
	var r client.Receipt
	if st.Receipt == nil || json.Unmarshal(st.Receipt.Receipt, &r) != nil || r.Layers.Containers != 1 {
		t.Errorf("the receipt does not count the container: %+v", st.Receipt)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
