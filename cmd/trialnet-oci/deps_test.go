//go:build linux

package main

import (
	"os/exec"
	"strings"
	"testing"
)

// Initialising net/http, crypto/tls and crypto/x509 took about 2 ms of
// each of trialnet-oci's starts (docs/measured.md): the hook reaches the
// agent through agentwire, which links none of them, nor record (its
// log/slog and crypto/rand) and the receipts' crypto/ed25519, whose
// pages each start faulted in for types the hook never reads. Asked of
// the go command, as this test binary links net/http through the tests'
// imports.
func TestTrialnetOCILinksNoHTTP(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to list trialnet-oci's packages (as in the VM matrix)")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case "net/http", "crypto/tls", "crypto/x509", "crypto/ed25519", "crypto/rand", "log/slog", "github.com/trialnet/trialnet/record":
			t.Errorf("trialnet-oci links %s: a package it imports (or one of theirs) brought it back; the hook's path to the agent is internal/agentwire, which must not", p)
		}
	}
}
