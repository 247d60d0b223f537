//go:build linux

package sandbox

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/trialnet/trialnet/internal/rootdir"
)

// ownDirs and trialnet.bpf.c's own_dirs are one list, written in two
// languages (a const array of strings bpf2go does not carry): the C is
// read here and held to the Go, entry by entry, with VIEW_LEN.
func TestOwnDirsMatchTheC(t *testing.T) {
	b, err := os.ReadFile("../bpf/trialnet.bpf.c")
	if err != nil {
		t.Fatal(err)
	}
	entries := regexp.MustCompile(`\{"(/[^"]*/)", (\d+), "([^"]*)"\}`).FindAllSubmatch(b, -1)
	viewLen := regexp.MustCompile(`#define VIEW_LEN (\d+)`).FindSubmatch(b)
	count := regexp.MustCompile(`#define OWN_DIRS (\d+)`).FindSubmatch(b)
	if len(entries) != len(ownDirs) || viewLen == nil || count == nil || string(count[1]) != strconv.Itoa(len(ownDirs)) {
		t.Fatalf("own_dirs in the C: %d entries (OWN_DIRS %s), Go: %d", len(entries), count, len(ownDirs))
	}
	for i, d := range ownDirs {
		dir, n, view := string(entries[i][1]), string(entries[i][2]), string(entries[i][3])
		want := rootdir.Run + "/" + d.view
		if dir != d.dir+"/" || n != strconv.Itoa(len(dir)) || view != want || string(viewLen[1]) != strconv.Itoa(len(want)) {
			t.Errorf("own_dirs[%d] in the C: {%q, %s, %q} (VIEW_LEN %s); Go: %s viewed at %s", i, dir, n, view, viewLen[1], d.dir, want)
		}
	}
}
