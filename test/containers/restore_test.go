//go:build linux

package containers

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// runc restore (docker start --checkpoint, CRI-O's restore from a
// checkpoint image) runs prestart and createRuntime hooks with the
// status stopped and the restored process's pid. The hook read that as
// a poststop and let a container that claims a Trial run, unjudged,
// wherever its bundle put it (here: a network namespace and a cgroup of
// its own); it refuses it now, and trialnet oci-runtime refuses the
// restore before runc.
func TestPrivilegedContainerRestore(t *testing.T) {
	requireRuntimes(t, false, "runc", "criu")
	if out, err := exec.Command("criu", "check").CombinedOutput(); err != nil {
		// This host's 6.18 guest: kerndat cannot read its vdso.
		msg := fmt.Sprintf("criu cannot run on this kernel (criu check: %v): %s", err, out)
		if os.Getenv("TRIALNET_REQUIRE_CONTAINERS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	w := newContainerTrial(t, "ctr-restore")
	state, img := t.TempDir(), t.TempDir()
	cg := fmt.Sprintf("trialnet-test-restore-%d", os.Getpid())
	t.Cleanup(func() { removeTopCgroup(t, cg) })
	o := bundleOpts{netns: testNetns(t, t.TempDir(), "restore").Path, cgroupsPath: "/" + cg,
		script: "exec </dev/null >/dev/null 2>&1; exec sleep 600"}
	runc := func(args ...string) (string, error) {
		out, err := exec.Command("runc", append([]string{"--root", state}, args...)...).CombinedOutput()
		return string(out), err
	}
	defer func() {
		for _, id := range []string{"src", "dst"} {
			_, _ = runc("delete", "--force", id)
		}
	}()
	if out, err := runc("run", "--detach", "--bundle", w.bundleWith("src", o), "src"); err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	if out, err := runc("checkpoint", "--image-path", img, "src"); err != nil {
		t.Fatalf("runc checkpoint: %v\n%s", err, out)
	}
	_, _ = runc("delete", "--force", "src")
	o.annotations = map[string]string{"trialnet.io/trial": w.info.ID}
	o.hooks = []string{"createRuntime"}
	dst := w.bundleWith("dst", o)
	out, err := exec.Command(w.bin, "oci-runtime", "--runc", "runc", "--socket", w.sock, "--", "--root", state,
		"restore", "--detach", "--image-path", img, "--bundle", dst, "dst").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "restored from a checkpoint") {
		t.Errorf("trialnet oci-runtime restore: want refused before runc (%v):\n%s", err, out)
	}
	out2, err := runc("restore", "--detach", "--image-path", img, "--bundle", dst, "dst")
	st, _ := runc("state", "dst")
	t.Logf("runc restore (%v):\n%s\nstate: %s", err, out2, st)
	if err == nil || !strings.Contains(out2, "restoring it from a checkpoint") || strings.Contains(st, `"running"`) {
		t.Errorf("runc restore of a bundle that claims the Trial, in a network namespace of its own: want refused by the hook")
	}
}
