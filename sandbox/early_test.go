//go:build linux && cgo

package sandbox

import (
	"slices"
	"testing"
)

// early.c keeps its own list of the Trial's directories, where a confined
// command may make sockets: it must be ownDirs'.
func TestEarlyOwnDirs(t *testing.T) {
	var want []string
	for _, d := range ownDirs {
		want = append(want, d.dir)
	}
	if got := earlyOwnDirs(); !slices.Equal(got, want) {
		t.Errorf("early.c's own directories are %q, ownDirs' %q", got, want)
	}
}
