//go:build linux

package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/testkit"
)

// trialnet is started by every run, exec and OCI hook, and Go runs the
// init of every linked package in every start: it must not link what
// only the NRI plugin (its own binary, cmd/trialnet-nri) or a Prometheus
// client library would need (the agent writes /metrics with
// internal/promtext). Read from this test binary (the tests add none of
// these).
func TestTrialnetLinksNoPluginDeps(t *testing.T) {
	testkit.LinksNoModules(t, "trialnet", "github.com/containerd", "github.com/tetratelabs/wazero",
		"google.golang.org/protobuf", "google.golang.org/grpc", "github.com/prometheus")
}

// 'trialnet nri' execs trialnet-nri from beside the binary's real path,
// arguments and all, so that manifests written for it keep working;
// without the plugin's binary there it says what to install.
func TestNRIExecsThePluginBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "trialnet")
	copyExecutable(t, bin)
	// Through a symlink elsewhere, as /usr/local/bin/trialnet to
	// /opt/...: the plugin is the one beside the real path.
	link := filepath.Join(t.TempDir(), "trialnet")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	plugin := filepath.Join(dir, nriBinary)
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\necho \"plugin: $0 $*\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cli := func() (string, int) {
		cmd := exec.Command(link, "nri", "--index", "42", "--exempt", "a,b")
		cmd.Env = append(os.Environ(), "TRIALNET_CLI_MAIN=1")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	if out, code := cli(); code != 0 || !strings.Contains(out, "plugin: "+plugin+" --index 42 --exempt a,b") {
		t.Errorf("trialnet nri: exit %d, %q: want the plugin run with the same arguments", code, out)
	}
	if err := os.Remove(plugin); err != nil {
		t.Fatal(err)
	}
	if out, code := cli(); code != exitFailure || !strings.Contains(out, plugin+": no such file") || !strings.Contains(out, "install it beside trialnet") {
		t.Errorf("trialnet nri without the plugin beside it: exit %d, %q", code, out)
	}
}

// copyExecutable puts this test binary (the trialnet CLI under
// TRIALNET_CLI_MAIN=1) at path: a link where it can, else a copy.
func copyExecutable(t *testing.T, path string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if os.Link(self, path) == nil {
		return
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
