//go:build linux

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// trialnet oci-runtime becomes runc for every command line that does
// not create a container naming a Trial: the fake runc sees the same
// arguments, and its exit status is the caller's. A container naming a
// Trial with no agent to ask is refused, runc never runs, and the
// reason is in runc's log for containerd to report.
func TestOCIRuntimePassesThroughAndFailsClosed(t *testing.T) {
	dir := t.TempDir()
	seen := filepath.Join(dir, "seen")
	runc := filepath.Join(dir, "runc")
	if err := os.WriteFile(runc, []byte("#!/bin/sh\necho \"$@\" >>"+seen+"\nexit 7\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bundle := func(cgroupsPath string) string {
		b := filepath.Join(t.TempDir(), "b")
		if err := os.Mkdir(b, 0o755); err != nil {
			t.Fatal(err)
		}
		cfg, _ := json.Marshal(map[string]any{"ociVersion": "1.0.2", "linux": map[string]any{"cgroupsPath": cgroupsPath,
			"namespaces": []map[string]string{{"type": "network"}}}})
		if err := os.WriteFile(filepath.Join(b, "config.json"), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
		return b
	}
	plain := bundle("/docker/c1")
	// runc's state of c1, a container in no Trial (its labels are its
	// annotations): an exec into it passes through.
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(root, "c1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "c1", "state.json"), []byte(`{"config":{"labels":["bundle=/b"]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "log.json")
	wrap := []string{"oci-runtime", "--runc", runc, "--socket", filepath.Join(dir, "none.sock"), "--"}
	for _, args := range [][]string{
		{"--root", "/r", "--log", log, "state", "c1"},
		{"--root", "/r", "kill", "c1", "9"},
		{"--root", root, "exec", "--process", "/p.json", "--detach", "c1"},
		{"--root", "/r", "--systemd-cgroup", "create", "--bundle", plain, "--pid-file", "/p", "c1"},
	} {
		_ = os.Remove(seen)
		cmd := trialnetProcess(t, append(wrap, args...)...)
		out, err := cmd.CombinedOutput()
		got, _ := os.ReadFile(seen)
		if cmd.ProcessState.ExitCode() != 7 || strings.TrimSpace(string(got)) != strings.Join(args, " ") {
			t.Errorf("%q: exit %d (%v), runc saw %q\n%s", args, cmd.ProcessState.ExitCode(), err, got, out)
		}
	}
	_ = os.Remove(seen)
	claimed := bundle("trialnet-eval-42.slice/c2")
	before, _ := os.ReadFile(filepath.Join(claimed, "config.json"))
	cmd := trialnetProcess(t, append(wrap, "--root", "/r", "--log", log, "--log-format", "json", "create", "--bundle", claimed, "c2")...)
	out, _ := cmd.CombinedOutput()
	after, _ := os.ReadFile(filepath.Join(claimed, "config.json"))
	logged, _ := os.ReadFile(log)
	if _, err := os.Stat(seen); cmd.ProcessState.ExitCode() != exitFailure || err == nil || string(before) != string(after) ||
		!strings.Contains(string(out), `cannot look Trial "eval-42" up`) || !strings.Contains(string(logged), `"level":"error"`) {
		t.Errorf("a container naming a Trial without an agent: exit %d, runc ran: %v, bundle changed: %v\n%s\nlog: %s",
			cmd.ProcessState.ExitCode(), err == nil, string(before) != string(after), out, logged)
	}
}
