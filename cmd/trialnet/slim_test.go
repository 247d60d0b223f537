//go:build linux

package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
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

// No start of trialnet samples its allocations for a heap profile that no
// command takes (main's init): -test.memprofile, which asks for one, sets
// the rate again.
func TestStartSamplesNoAllocations(t *testing.T) {
	if f := flag.Lookup("test.memprofile"); f != nil && f.Value.String() != "" {
		t.Skip("-test.memprofile samples allocations")
	}
	if runtime.MemProfileRate != 0 {
		t.Fatalf("runtime.MemProfileRate = %d, want 0", runtime.MemProfileRate)
	}
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

// Every run and exec starts trialnet, and Go runs every linked package's
// initialisation first: a package-level map, regexp, fmt.Errorf or
// reflection walk is paid in each start, by commands that never read it.
// Read from this test binary started as trialnet (GODEBUG=inittrace=1
// gives each package's initialisation and what it allocated): none of
// trialnet's own packages allocates more than a few sync.OnceValue
// wrappers and small values there. bpf's (the adoption's generated shape)
// and guard's (the address classes) are exempt: every run's start reads
// them. A table only some commands read goes behind a sync.OnceValue.
func TestStartBuildsNoTables(t *testing.T) {
	const budget = 1024 // bytes; the tables moved behind OnceValue took 1,000-4,000
	exempt := map[string]bool{"github.com/trialnet/trialnet/bpf": true, "github.com/trialnet/trialnet/guard": true}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "--help")
	cmd.Env = append(os.Environ(), "TRIALNET_CLI_MAIN=1", "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("trialnet --help: %v\n%s", err, out)
	}
	// init PKG @T ms, C ms clock, B bytes, N allocs
	line := regexp.MustCompile(`(?m)^init (github\.com/trialnet/trialnet/\S+) @.* ms clock, (\d+) bytes, \d+ allocs$`)
	matches := line.FindAllStringSubmatch(string(out), -1)
	if len(matches) == 0 {
		t.Fatalf("no initialisation of trialnet's packages in GODEBUG=inittrace=1's output:\n%s", out)
	}
	for _, m := range matches {
		pkg := m[1]
		last := pkg[strings.LastIndex(pkg, "/")+1:]
		if exempt[pkg] || strings.HasPrefix(pkg, "github.com/trialnet/trialnet/cmd/") || strings.Contains(last, "test") {
			continue // the exempt, this test binary's own main, and the tests' helpers
		}
		if n, _ := strconv.Atoi(m[2]); n > budget {
			t.Errorf("%s allocates %d bytes in its initialisation, in every start of trialnet (budget %d): build its package-level tables at their first use (sync.OnceValue), or use a switch or a slice the compiler lays out statically", pkg, n, budget)
		}
	}
}
