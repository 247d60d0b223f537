//go:build linux && !cgo

package sandbox

// earlyMountCoveredC: none without cgo (TestMountCovered).
var earlyMountCoveredC func(string, uint64) (string, bool, bool)
