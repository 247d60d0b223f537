//go:build linux && (amd64 || cgo)

package sandbox

import (
	"fmt"
	"slices"
	"testing"

	"github.com/trialnet/trialnet/trial"
)

// init_early.c mounts the Trial's own directories, its devpts and its
// resolv.conf with its own copies of the Go side's bounds and text, read
// here from the init that runs (on x86-64, the embedded binary itself).
func TestEarlyInitTables(t *testing.T) {
	ptys, resolv, dirs := earlyInitTables()
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
}
