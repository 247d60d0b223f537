//go:build linux

package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// trialnet's oci-hook install and oci-runtime install write trialnet-oci,
// from beside trialnet's real path, into hooks.d and daemon.json, so that
// each container starts the small binary; without it there they write
// nothing and say what to install.
func TestOCIInstallsWriteTrialnetOCI(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "trialnet")
	copyExecutable(t, bin)
	// Through a symlink elsewhere, as /usr/bin/trialnet to /opt/...: the
	// companion is the one beside the real path.
	link := filepath.Join(t.TempDir(), "trialnet")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	oci := filepath.Join(dir, "trialnet-oci")
	if err := os.WriteFile(oci, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (string, int) {
		cmd := exec.Command(link, args...)
		cmd.Env = append(os.Environ(), "TRIALNET_CLI_MAIN=1")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	hook := []string{"oci-hook", "install", "--print", "--hooks-dir", filepath.Join(dir, "hooks.d")}
	runtime := []string{"oci-runtime", "install", "--print"}
	if out, code := cli(hook...); code != exitOK || strings.Count(out, `"path": "`+oci+`"`) != 2 {
		t.Errorf("oci-hook install --print: exit %d, want both entries running %s:\n%s", code, oci, out)
	}
	if out, code := cli(runtime...); code != exitOK || !strings.Contains(out, `"path": "`+oci+`"`) {
		t.Errorf("oci-runtime install --print: exit %d, want the runtime %s:\n%s", code, oci, out)
	}
	if err := os.Remove(oci); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{hook, runtime} {
		if out, code := cli(args...); code != exitFailure || !strings.Contains(out, oci+", the binary the entries run, is not an executable beside this trialnet") ||
			!strings.Contains(out, "install it beside trialnet") {
			t.Errorf("%s without trialnet-oci beside: exit %d, %q", strings.Join(args[:2], " "), code, out)
		}
	}
}
