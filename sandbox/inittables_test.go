//go:build linux && (amd64 || cgo)

package sandbox

import (
	"fmt"
	"slices"
	"testing"

	"github.com/trialnet/trialnet/trial"
)

// init_early.c mounts the Trial's own directories, its devpts, its
// resolv.conf and its covers of the shared directories, and detaches the
// FUSE and network file systems, with its own
// copies of the Go side's bounds, text and lists, read
// here from the init that runs (on x86-64, the embedded binary itself).
func TestEarlyInitTables(t *testing.T) {
	ptys, resolv, dirs, shared, remote := earlyInitTables()
	if ptys != MaxPtys || resolv != trial.ResolvConf {
		t.Errorf("init_early.c's tables: ptys %d, resolv.conf %q; want %d, %q", ptys, resolv, MaxPtys, trial.ResolvConf)
	}
	var want []string
	for _, d := range ownDirs {
		want = append(want, fmt.Sprintf("%s=%s %d", d.dir, d.view, d.size))
	}
	if !slices.Equal(dirs, want) {
		t.Errorf("init_early.c's own directories are %q, ownDirs' %q", dirs, want)
	}
	want = nil
	for _, d := range sharedDirs {
		want = append(want, fmt.Sprintf("%s %d", d, SharedBytes))
	}
	if !slices.Equal(shared, want) {
		t.Errorf("init_early.c's shared directories are %q, sharedDirs' %q", shared, want)
	}
	if !slices.Equal(remote, remoteFS) {
		t.Errorf("init_early.c's FUSE and network file-system types are %q, remoteFS's %q", remote, remoteFS)
	}
}
