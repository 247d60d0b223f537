//go:build linux

package ocicmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/cli"
)

// hook runs oci-hook with args as trialnet-oci at a made-up path.
func hook(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := Hook(context.Background(), args, &out, &errOut, func() (string, error) { return "/opt/trialnet/bin/trialnet-oci", nil })
	return code, out.String(), errOut.String()
}

// oci-hook install writes the hooks.d entry and the seccomp profile: the
// base profile with the key calls refused, or, with no base at the
// default path, the least profile, saying so; a base named but absent,
// or a different profile in the way, is an error; a second run changes
// nothing.
func TestOCIHookInstallSeccomp(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "podman.json")
	if err := os.WriteFile(base, []byte(`{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","keyctl"],"action":"SCMP_ACT_ALLOW"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	profile := filepath.Join(dir, "etc", "seccomp.json")
	args := []string{"install", "--hooks-dir", filepath.Join(dir, "hooks.d"), "--seccomp-profile", profile, "--seccomp-base", base}
	code, out, errOut := hook(args...)
	if code != cli.ExitOK || !strings.Contains(out, "wrote "+profile+" ("+base+" with add_key, keyctl, request_key refused)") ||
		!strings.Contains(out, "--security-opt seccomp="+profile) {
		t.Fatalf("install: exit %d\n%s%s", code, out, errOut)
	}
	b, err := os.ReadFile(profile)
	if err != nil || strings.Count(string(b), `"keyctl"`) != 1 || !strings.Contains(string(b), `"SCMP_ACT_ERRNO"`) {
		t.Fatalf("profile %s: %v", b, err)
	}
	if code, out, _ := hook(args...); code != cli.ExitOK || !strings.Contains(out, profile+" is already this profile") {
		t.Errorf("a second install: exit %d\n%s", code, out)
	}
	if err := os.WriteFile(base, []byte(`{"defaultAction":"SCMP_ACT_ALLOW"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := hook(args...); code == cli.ExitOK || !strings.Contains(errOut, "holds another seccomp profile") {
		t.Errorf("a different profile in the way: exit %d\n%s", code, errOut)
	}
	if code, _, errOut := hook(append(args[:len(args)-1], filepath.Join(dir, "absent.json"))...); code == cli.ExitOK || !strings.Contains(errOut, "the seccomp profile to start from") {
		t.Errorf("a named base that is absent: exit %d\n%s", code, errOut)
	}
	least, from, err := seccompProfile(filepath.Join(dir, "absent.json"), false)
	if err != nil || !strings.Contains(from, "lets every other call run") || !strings.Contains(string(least), `"SCMP_ACT_ALLOW"`) {
		t.Errorf("no base at the default path: %v, %q\n%s", err, from, least)
	}
}

// The default entry runs the hook at podman's precreate stage too, which
// a profile container needs where the BPF LSM layer is active; where a
// runtime installed here would refuse an entry with that stage (CRI-O, a
// podman before 4.3) the default is refused with the choices, and an
// explicit --precreate or --precreate=false is kept.
func TestOCIHookInstallPrecreate(t *testing.T) {
	bin := t.TempDir()
	t.Setenv("PATH", bin)
	args := []string{"install", "--print"}
	stages := func(extra ...string) (int, string, string) {
		t.Helper()
		code, out, errOut := hook(append(slices.Clone(args), extra...)...)
		_, entry, _ := strings.Cut(out, "==> trialnet.json <==")
		entry, _, _ = strings.Cut(entry, "==>")
		return code, entry, errOut
	}
	if code, entry, errOut := stages(); code != cli.ExitOK || !strings.Contains(entry, `"precreate",`) {
		t.Fatalf("no runtime here: exit %d, want precreate in trialnet.json:\n%s%s", code, entry, errOut)
	}
	fake := func(name, script string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fake("podman", "echo podman version 4.2.1")
	if code, _, errOut := stages(); code == cli.ExitOK || !strings.Contains(errOut, "this podman is 4.2") || !strings.Contains(errOut, "--precreate=false") {
		t.Errorf("podman 4.2: exit %d, want refused with the choices:\n%s", code, errOut)
	}
	fake("podman", "echo podman version 4.3.1")
	if code, entry, errOut := stages(); code != cli.ExitOK || !strings.Contains(entry, `"precreate",`) {
		t.Errorf("podman 4.3.1: exit %d, want precreate:\n%s%s", code, entry, errOut)
	}
	fake("crio", "exit 0")
	if code, _, errOut := stages(); code == cli.ExitOK || !strings.Contains(errOut, "CRI-O is installed here") || !strings.Contains(errOut, "--precreate=false") {
		t.Errorf("CRI-O: exit %d, want refused with the choices:\n%s", code, errOut)
	}
	if code, entry, errOut := stages("--precreate=false"); code != cli.ExitOK || strings.Contains(entry, "precreate") || !strings.Contains(entry, `"createRuntime"`) {
		t.Errorf("CRI-O, --precreate=false: exit %d, want createRuntime alone:\n%s%s", code, entry, errOut)
	}
	if code, entry, errOut := stages("--precreate"); code != cli.ExitOK || !strings.Contains(entry, `"precreate",`) {
		t.Errorf("CRI-O, --precreate asked for: exit %d, want it:\n%s%s", code, entry, errOut)
	}
}

// A moved cgroup parent or namespace directory of the agent's reaches
// the hook in both entries' arguments: the hook looks for a container
// that claims no Trial in the Trials the agent keeps there.
func TestOCIHookInstallPlaces(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	code, out, errOut := hook("install", "--print", "--cgroup-parent", "/sys/fs/cgroup/evals", "--netns-dir", "/run/evals/netns")
	if code != cli.ExitOK || strings.Count(out, `"--cgroup-parent",
      "/sys/fs/cgroup/evals",
      "--netns-dir",
      "/run/evals/netns"`) != 2 {
		t.Errorf("exit %d, want both entries with the places:\n%s%s", code, out, errOut)
	}
	// Docker's wrapper, which judges an unclaimed bundle itself.
	var rout, rerr strings.Builder
	code = Runtime(context.Background(), []string{"install", "--print", "--cgroup-parent", "/sys/fs/cgroup/evals", "--netns-dir", "/run/evals/netns"},
		&rout, &rerr, func() (string, error) { return "/usr/bin/trialnet-oci", nil })
	if code != cli.ExitOK || !strings.Contains(rout.String(), `"--cgroup-parent",
        "/sys/fs/cgroup/evals",
        "--netns-dir",
        "/run/evals/netns",
        "--"`) {
		t.Errorf("oci-runtime install: exit %d, want the places before runc's arguments:\n%s%s", code, rout.String(), rerr.String())
	}
}
