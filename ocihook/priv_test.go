//go:build linux

package ocihook

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// The hook against real processes, placed as a runtime would place a
// container (no runtime runs on a hybrid cgroup host): one in a child of
// the Trial's cgroup, in its network namespace and new PID, cgroup and
// mount namespaces, is let in and reported by the Trial's layers and
// receipt; one outside the Trial, one on the host's network and one in
// the host's PID namespace are refused.
func TestPrivilegedHookRealProcesses(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "nsenter")
	a, _, sock := testenv.ServedAgent(t, "ocihook", agent.AgentConfig{})
	ctx := context.Background()
	info, err := a.Create(ctx, trial.Request{ID: "hook-1"})
	if err != nil {
		t.Fatal(err)
	}
	hook := &Hook{Agent: func() Agent { return agentwire.NewDirect(sock) }, Socket: sock}
	// Not under dir: the socket's directory is protected.
	bundle := t.TempDir()
	harmless := t.TempDir()
	mnt := filepath.Join(bundle, "rootfs", "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
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
	newNS := uintptr(syscall.CLONE_NEWPID | syscall.CLONE_NEWCGROUP | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC)
	run := func(pid int) error {
		st := mustJSON(t, State{OCIVersion: "1.0.2", ID: "ctr", Status: "creating", Pid: pid, Bundle: bundle,
			Annotations: map[string]string{AnnotationTrial: "hook-1"}})
		_, err := hook.Run(ctx, strings.NewReader(string(st)))
		return err
	}

	pid := testenv.StartIn(t, inTrial, info.Netns, newNS)
	// A bind the runtime made, of a directory on the same file system as
	// the agent's state: not refused for its device alone.
	bindIn(t, pid, harmless, mnt)
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
		{"host PID namespace", inTrial, info.Netns, newNS &^ syscall.CLONE_NEWPID, "shares the runtime's (the host's) pid namespace", ""},
		{"host mount namespace", inTrial, info.Netns, newNS &^ syscall.CLONE_NEWNS, "shares the runtime's (the host's) mnt namespace", ""},
		// A bundle's ipc path to /proc/1/ns/ipc, which the config's view
		// reads as one of its own: runc 1.1.5 here, with no ipc namespace
		// of its own, attached and rewrote a host root's shmget segment.
		{"host IPC namespace", inTrial, info.Netns, newNS &^ syscall.CLONE_NEWIPC, "shares the runtime's (the host's) ipc namespace", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(testenv.StartIn(t, tc.cgroup, tc.netns, tc.flags))
			if err == nil || !strings.Contains(err.Error(), tc.want1) || !strings.Contains(err.Error(), tc.want2) {
				t.Fatalf("got %v, want refused: %q, %q", err, tc.want1, tc.want2)
			}
		})
	}
	t.Run("a PID namespace shared with a process outside the Trial", func(t *testing.T) {
		out := testenv.StartIn(t, testenv.PlainCgroup(t, "ocihook-pidns"), "", newNS)
		err := run(joinPIDNS(t, inTrial, info.Netns, out))
		if want := fmt.Sprintf("its PID namespace holds process %d, which is not in the Trial", out); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want refused: %q", err, want)
		}
	})
	// A bind source swapped to the agent's own directory after the
	// runtime resolved it (or a mount the config never named): config.json
	// shows nothing, the kernel shows the mount.
	t.Run("a mount of trialnet's state that the config does not name", func(t *testing.T) {
		pid := testenv.StartIn(t, inTrial, info.Netns, newNS)
		bindIn(t, pid, filepath.Dir(sock), mnt)
		err := run(pid)
		want := fmt.Sprintf("the kernel shows a mount on %s", mnt)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "inside "+filepath.Dir(sock)) {
			t.Fatalf("got %v, want refused: %q", err, want)
		}
	})
	st, err = a.Destroy(ctx, "hook-1")
	if err != nil {
		t.Fatalf("destroy a Trial with a container's cgroup in it: %v", err)
	}
	var r client.Receipt
	if st.Receipt == nil || json.Unmarshal(st.Receipt.Receipt, &r) != nil || r.Layers.Containers != 1 {
		t.Errorf("the receipt does not count the container: %+v", st.Receipt)
	}
}

// joinPIDNS starts a process in cgroup and netns that is in the PID
// namespace of process other (podman --pid container:X), and returns it.
func joinPIDNS(t *testing.T, cgroup, netns string, other int) int {
	t.Helper()
	// Its cgroup and mount namespaces are other's too, so that the PID
	// namespace is the one thing that lets it out. nsenter opens other's
	// namespaces from outside the Trial (the BPF LSM layer refuses a
	// Trial's task that reads an outsider's), and its child is moved in
	// once it runs.
	ns := func(typ string) string { return fmt.Sprintf("--%s=/proc/%d/ns/%s", typ, other, typ) }
	cmd := exec.Command("nsenter", ns("pid"), ns("cgroup"), "--mount="+fmt.Sprintf("/proc/%d/ns/mnt", other), "--net="+netns, "--", "sh", "-c", "echo ready; exec sleep 600")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("the process did not start: %q %v", line, err)
	}
	// nsenter forks into the PID namespace: its child is the process.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
	pid, aerr := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || aerr != nil {
		t.Fatalf("nsenter's child: %q %v %v", b, err, aerr)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	return pid
}

// bindIn bind-mounts src on dst in the mount namespace of process pid,
// as a runtime does before createRuntime; private first, so that nothing
// propagates to the host's (the mount goes with the process).
func bindIn(t *testing.T, pid int, src, dst string) {
	t.Helper()
	out, err := exec.Command("nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", pid), "--",
		"sh", "-c", `mount --make-rprivate / && mount --bind "$0" "$1"`, src, dst).CombinedOutput()
	if err != nil {
		t.Fatalf("bind %s on %s in process %d's mount namespace: %v: %s", src, dst, pid, err, out)
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
