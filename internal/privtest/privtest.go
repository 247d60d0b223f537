// Package privtest decides, in one place, whether a privileged test runs.
package privtest

import (
	"os"
	"testing"
)

// Require skips t when it cannot run privileged tests here, and fails it
// instead when CI=true: in CI a privileged test never skips silently.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	msg := "privileged test: needs root (real cgroups, namespaces and eBPF)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "; CI=true, so this is a failure, not a skip")
	}
	t.Skip(msg)
}
