//go:build linux

package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// -h shows the usage, an example, and each flag's default once.
func TestHelp(t *testing.T) {
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &stderr); code != exitOK {
		t.Fatalf("-h: exit %d", code)
	}
	help := stderr.String()
	if !strings.Contains(help, "Usage: trialnet-nri") || !strings.Contains(help, "Example:") {
		t.Fatalf("-h:\n%s", help)
	}
	for _, block := range strings.Split(help, "\n  -")[1:] {
		if n := strings.Count(block, "default"); n > 1 {
			t.Errorf("-%s shows %d defaults", block, n)
		}
	}
	if n := strings.Count(help, "\n  -"); n != 7 {
		t.Errorf("-h shows %d flags, want 7:\n%s", n, help)
	}
}

// Bad arguments are usage errors; a plugin that cannot install the hook
// stops before it registers with the runtime, saying what to give it.
func TestRunRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--bogus"}, exitUsage, "flag provided but not defined"},
		{[]string{"stray"}, exitUsage, `unexpected argument "stray"`},
		{[]string{"--hook-binary", filepath.Join(dir, "none"), "--hook-path", filepath.Join(dir, "bin", "trialnet"),
			"--nri-socket", filepath.Join(dir, "nri.sock")}, exitFailure, "installed beside trialnet-nri, or named by --hook-binary"},
		// By default the hook installed is trialnet-oci beside the plugin
		// (none beside the test binary): the small binary, whose start
		// each container's waits on, not trialnet.
		{[]string{"--hook-path", filepath.Join(dir, "bin", "trialnet-oci"), "--nri-socket", filepath.Join(dir, "nri.sock")},
			exitFailure, "/trialnet-oci: no such file or directory (the trialnet-oci binary, installed beside trialnet-nri"},
	} {
		var stderr bytes.Buffer
		if code := run(context.Background(), c.args, &stderr); code != c.code || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, %q; want %d saying %q", c.args, code, stderr.String(), c.code, c.want)
		}
	}
}
