//go:build linux

package containers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/ocihook"
)

// crun acts on run.oci.hooks.stdout, as the host's root, before the
// createRuntime hook runs: it creates the host file the annotation names
// (O_CREAT|O_APPEND, mode 0700) whenever the spec has a hook. With a
// hook of the test's own (true, always) crun makes the file: the
// annotation is taken. With trialnet's entry the container is refused,
// and where the entry has podman's precreate stage, before crun runs, so
// that no file is made.
func TestPrivilegedContainerCrunHooksOutputAnnotation(t *testing.T) {
	requireRuntimes(t, true, "podman", "crun", "conmon")
	w := newContainerTrial(t, "ctr-crun-hooksout")
	p := newPodman(w)
	target := filepath.Join(t.TempDir(), "made-by-crun")
	annotated := append(p.trialFlags(), "--annotation", "run.oci.hooks.stdout="+target)

	trueBin, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(t.TempDir(), "own.d")
	entry := `{"version":"1.0.0","hook":{"path":"` + trueBin + `"},"when":{"always":true},"stages":["createRuntime"]}`
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(own, "true.json"), []byte(entry), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := p.run(own, annotated, "echo started"); err != nil || !strings.Contains(out, "started") {
		t.Fatalf("without trialnet's hook: %v\n%s", err, out)
	}
	fi, err := os.Stat(target)
	if err != nil {
		t.Fatalf("crun did not make the annotation's host file (does it take run.oci.hooks.stdout?): %v", err)
	}
	t.Logf("crun made %s on the host: %v", target, fi.Mode())
	if err := os.Remove(target); err != nil {
		t.Fatal(err)
	}

	out, err := p.run(w.hooks, annotated, "echo started")
	if err == nil || strings.Contains(out, "started") {
		t.Fatalf("with the hook, the annotated container started (%v):\n%s", err, out)
	}
	installed, err := os.ReadFile(filepath.Join(w.hooks, ocihook.HookFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(installed), `"precreate"`) {
		t.Logf("the entry has no precreate stage (podman before 4.3): refused at createRuntime, after crun made the file")
		return
	}
	// podman shows only the precreate hook's exit status: the reason is
	// checked in ocihook's tests.
	if !strings.Contains(out, "precreate hook") {
		t.Errorf("the refusal is not the precreate stage's:\n%s", out)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("crun made %s (%v): the container was not refused before crun ran", target, err)
	}
}
