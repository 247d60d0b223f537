//go:build linux

package containers

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/ociruntime"
	"github.com/trialnet/trialnet/test/ctr"
	"github.com/trialnet/trialnet/trial"
)

// poolsMaxPids is the pids bound of the Trial the pool tests' containers
// join.
const poolsMaxPids = 16

// forkScript starts up to 3*poolsMaxPids sleeps in a subshell that ends
// at the first fork refused, counts the tasks of its PID namespace with
// the shell's builtins, and kills them: bounded.
var forkScript = "echo " + started + "; (i=0; while [ $i -lt " + strconv.Itoa(3*poolsMaxPids) +
	" ]; do sleep 60 & i=$((i+1)); done) 2>/dev/null; n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo tasks=$n; kill -9 -1"

// A container in a Trial is held by the Trial's pids bound, whichever
// hierarchy carries the pids controller, and so is a process docker exec
// starts in it. On a hybrid host runc put the container's tasks at the
// Trial's path in the cgroup v1 pids hierarchy, outside the Trial's
// pool group: 49 tasks ran in a Trial bounded at 16.
func TestPrivilegedContainerPoolBounds(t *testing.T) {
	requireRuntimes(t, false, "runc")
	w := newContainerTrial(t, "ctr-pools-world")
	info, err := w.agent.Create(context.Background(), trial.Request{ID: "ctr-pools", Allow: []string{"allowed.test:80"},
		Limits: &trial.Limits{PoolLimits: trial.PoolLimits{MaxPids: poolsMaxPids}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = w.agent.Destroy(context.Background(), info.ID) })
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Fatal(err)
	}
	rel := strings.TrimPrefix(info.Cgroup, mount)
	t.Cleanup(func() { ctr.RemoveV1Cgroups(rel) })

	t.Run("runc", func(t *testing.T) {
		name := "pools"
		o := bundleOpts{script: forkScript, netns: info.Netns, cgroupsPath: rel + "/" + name, hooks: []string{"createRuntime"},
			annotations: map[string]string{"trialnet.io/trial": info.ID},
			hookArgs:    []string{"--cgroup-parent", filepath.Dir(info.Cgroup), "--netns-dir", filepath.Dir(info.Netns)}}
		state := t.TempDir()
		out, err := exec.Command("runc", "--root", state, "run", "--bundle", w.bundleWith(name, o), name).CombinedOutput()
		_ = exec.Command("runc", "--root", state, "delete", "--force", name).Run()
		if !strings.Contains(string(out), started) {
			t.Fatalf("the container did not start (%v):\n%s", err, out)
		}
		checkTasks(t, string(out))
	})

	t.Run("docker exec", func(t *testing.T) {
		requireDocker(t)
		t.Cleanup(func() { removeTopCgroup(t, ociruntime.SlicePrefix+info.ID+ociruntime.SliceSuffix) })
		d := startDockerd(w)
		if out, err := d.cmd(append(append([]string{"run", "-d", "--name", "pools-sleeper"}, trialFlags(info.ID)...), dockerImage, "sleep", "600")...).CombinedOutput(); err != nil {
			t.Fatalf("docker run -d in the Trial: %v\n%s", err, out)
		}
		// cgroup v1 charges socket buffers only to a group with a socket
		// bound of its own (and up from it): the container's must have one.
		if id, err := d.cmd("inspect", "-f", "{{.Id}}", "pools-sleeper").Output(); err != nil {
			t.Fatal(err)
		} else if mnt := v1MemoryMount(t); mnt != "" {
			f := filepath.Join(mnt, rel, strings.TrimSpace(string(id)), "memory.kmem.tcp.limit_in_bytes")
			if b, err := os.ReadFile(f); err != nil {
				t.Error(err)
			} else if strings.TrimSpace(string(b)) == "9223372036854771712" {
				t.Errorf("the container's cgroup v1 memory group has no socket bound (%s): its sockets' buffers are charged nowhere", f)
			}
		}
		out, err := d.cmd("exec", "pools-sleeper", "sh", "-c", forkScript).CombinedOutput()
		if !strings.Contains(string(out), started) {
			t.Fatalf("docker exec did not start (%v):\n%s", err, out)
		}
		checkTasks(t, string(out))
	})
}

// v1MemoryMount is where the cgroup v1 memory hierarchy is mounted; ""
// if none is.
func v1MemoryMount(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		pre, post, _ := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) > 4 && len(g) > 2 && g[0] == "cgroup" && slices.Contains(strings.Split(g[2], ","), "memory") {
			return cgroup2.UnescapeMountPath(f[4])
		}
	}
	return ""
}

// checkTasks reads forkScript's count from out.
func checkTasks(t *testing.T, out string) {
	t.Helper()
	n := -1
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "tasks="); ok {
			n, _ = strconv.Atoi(v)
		}
	}
	switch {
	case n < 0:
		t.Errorf("the container did not count its tasks:\n%s", out)
	case n > poolsMaxPids:
		t.Errorf("%d tasks ran in a Trial bounded at %d", n, poolsMaxPids)
	default:
		t.Logf("%d tasks ran in a Trial bounded at %d", n, poolsMaxPids)
	}
}
