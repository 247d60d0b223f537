//go:build linux

package rootdir

import (
	"os"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// fsAppendFL is FS_APPEND_FL (linux/fs.h): a directory that takes new
// names but gives none up.
const fsAppendFL = 0x20

// In an append-only directory the probe is made and cannot be removed
// (nor could the report's rename take its temporary name away): the
// refusal names the file it left, which the operator removes once the
// flag is off.
func TestPrivilegedCanWriteAtNamesWhatItLeft(t *testing.T) {
	privtest.Require(t)
	dir := t.TempDir()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := unix.IoctlSetPointerInt(int(d.Fd()), unix.FS_IOC_SETFLAGS, fsAppendFL); err != nil {
		t.Skipf("no append-only directory on this filesystem: %v", err)
	}
	t.Cleanup(func() { // before TempDir's removal
		if f, err := os.Open(dir); err == nil {
			_ = unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, 0)
			_ = f.Close()
		}
	})
	err = CanWriteAt(d, "report.json")
	ents, rerr := os.ReadDir(dir)
	if rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil || len(ents) != 1 || !strings.Contains(err.Error(), ents[0].Name()) {
		t.Errorf("CanWriteAt in an append-only directory: %v; the directory holds %v", err, ents)
	}
}
