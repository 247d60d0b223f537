//go:build linux

package containers

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/test/ctr"
	"golang.org/x/sys/unix"
)

// Bundles the hook refuses, each of which runc starts without it, doing
// what the refusal says it could:
//   - in its Trial, with Docker's rule for /dev/console (c 5:1 rwm) and
//     CAP_MKNOD: it makes a node of 5:1 and writes the host's console;
//   - in its Trial, with the host's /dev/pts bound in: runc's own rule
//     c 136:* opens the host's terminals there;
//   - claiming no Trial, in a Trial process's IPC namespace (by its
//     /proc file, or through /proc/self/root): no check of the hook's ran
//     on it, and it shares the Trial's shared memory.
func TestPrivilegedContainerRuncRefusals(t *testing.T) {
	requireRuntimes(t, false, "runc")
	w := newContainerTrial(t, "ctr-refusals")
	t.Cleanup(func() { ctr.RemoveV1Cgroups(w.cgroup) })
	state := t.TempDir()
	// A process of the Trial's, in its cgroup and network namespace, with
	// an IPC namespace of its own.
	inTrial := testenv.StartIn(t, w.info.Cgroup, w.info.Netns, unix.CLONE_NEWIPC)
	console := []map[string]any{{"allow": false, "access": "rwm"}, {"allow": true, "type": "c", "access": "m"},
		{"allow": true, "type": "c", "major": 5, "minor": 1, "access": "rwm"}}
	for _, tc := range []struct {
		name   string
		o      bundleOpts
		script string
		want   string
	}{
		{"the host's console", bundleOpts{caps: []string{"CAP_MKNOD"}, devRules: console},
			"mknod /dev/c c 5 1 && echo trialnet-test: a container wrote the host console >/dev/c && echo " + started,
			"the host's console (/dev/console) (console)"},
		{"the host's terminals bound in", bundleOpts{binds: map[string]string{"/hostpts": "/dev/pts"}},
			"ls /hostpts/ptmx && echo " + started, "it binds the host's device directory /dev/pts on /hostpts"},
		{"unclaimed, in a Trial process's IPC namespace", bundleOpts{annotations: map[string]string{},
			nsPaths: map[string]string{"ipc": filepath.Join("/proc", strconv.Itoa(inTrial), "ns", "ipc")}},
			"echo " + started, "it claims no Trial but joins the ipc namespace of process " + strconv.Itoa(inTrial)},
		{"unclaimed, in it through /proc/self/root", bundleOpts{annotations: map[string]string{},
			nsPaths: map[string]string{"ipc": filepath.Join("/proc/self/root/proc", strconv.Itoa(inTrial), "ns", "ipc")}},
			"echo " + started, "it claims no Trial but joins the ipc namespace of thread " + strconv.Itoa(inTrial)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "refusal-" + strconv.Itoa(len(tc.name))
			o := tc.o
			o.script, o.netns, o.cgroupsPath = tc.script, w.info.Netns, w.cgroup+"/"+name
			// The test's agent keeps its Trials apart from the host's.
			o.hookArgs = []string{"--cgroup-parent", filepath.Dir(w.info.Cgroup), "--netns-dir", filepath.Dir(w.info.Netns)}
			if o.annotations == nil {
				o.annotations = map[string]string{"trialnet.io/trial": w.info.ID}
			} else {
				// Claiming nothing, it is outside the Trial too.
				o.netns, o.cgroupsPath = "", "/"+name
				t.Cleanup(func() { removeTopCgroup(t, name) })
			}
			run := func(hook bool) (string, error) {
				o.hooks = nil
				if hook {
					o.hooks = []string{"createRuntime"}
				}
				cmd := exec.Command("runc", "--root", state, "run", "--bundle", w.bundleWith(name, o), name)
				out, err := cmd.CombinedOutput()
				_ = exec.Command("runc", "--root", state, "delete", "--force", name).Run()
				return string(out), err
			}
			if out, err := run(true); err == nil || strings.Contains(out, started) || !strings.Contains(out, tc.want) {
				t.Errorf("with the hook: want refused, saying %q (%v):\n%s", tc.want, err, out)
			}
			if out, err := run(false); err != nil || !strings.Contains(out, started) {
				t.Errorf("without the hook it did not start either (%v):\n%s", err, out)
			}
		})
	}
}
