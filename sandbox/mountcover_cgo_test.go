//go:build linux && cgo

package sandbox

// earlyMountCoveredC is the init's trialnet_mount_covered, for
// TestMountCovered.
var earlyMountCoveredC = earlyMountCovered
