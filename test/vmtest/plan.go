//go:build linux

package main

// plan is what the guest runs, written by the host as JSON into the
// output directory, which the guest sees at the same path through the
// read-only share of the host's root.
type plan struct {
	Kernel  string   `json:"kernel"`  // the matrix entry's name, for the log
	Modules []string `json:"modules"` // modprobe'd after the switch to the host's root
	Steps   []step   `json:"steps"`
}

// step is one command run in the guest, one after another: privileged
// tests share bpffs pins and cgroups, so they never overlap.
type step struct {
	Name    string   `json:"name"`
	Args    []string `json:"args"` // Args[0] is an absolute path
	Dir     string   `json:"dir"`
	Env     []string `json:"env"`
	Timeout int      `json:"timeout_seconds"`
	// GoTest marks a test binary run with -test.v: its output is counted.
	GoTest bool `json:"go_test"`
}

// Framing of the results port: each step's output sits between a begin
// and an end line; the end line carries the exit code. The guest writes
// a header line first (kernel release, active LSMs).
const (
	markBegin  = "@@vmtest begin "
	markEnd    = "@@vmtest end "
	markHeader = "@@vmtest guest "
	markDone   = "@@vmtest done"
)
