//go:build linux && !cgo

package sandbox

// earlyRoot: a CGO_ENABLED=0 build has no check before its runtime
// starts (rootcheck.c); CheckRoot makes its own.
func earlyRoot() (same, ok bool) { return false, false }
