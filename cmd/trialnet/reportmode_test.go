//go:build linux

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
)

// A report file is its caller's alone (0600): it names the hosts its
// Trial reached or tried, which no other user of the host, the Trial's
// among them, is to read. Both ways of naming it, in a directory every
// user may search.
func TestPrivilegedReportFileIsTheCallersAlone(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "setpriv")
	installedByTest(t)
	dir := privtest.SharedDir(t, "report-mode-")
	for _, tc := range []struct {
		name string
		args []string
		path string
	}{
		{"--report", []string{"--report", filepath.Join(dir, "r.json")}, filepath.Join(dir, "r.json")},
		{"--report-dir", []string{"--id", "report-mode", "--report-dir", filepath.Join(dir, "reports")}, filepath.Join(dir, "reports", "report-mode.json")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"run", "--uid", "65534"}, tc.args...)
			if code, _, errOut := trialnet(append(args, "--", "true")...); code != 0 {
				t.Fatalf("run: exit %d\n%s", code, errOut)
			}
			fi, err := os.Stat(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Perm() != 0o600 || int(st.Uid) != os.Getuid() {
				t.Errorf("the report is %v, owned by %d; want 0600, the caller's (%d)", fi.Mode().Perm(), st.Uid, os.Getuid())
			}
			if out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", tc.path).CombinedOutput(); err == nil {
				t.Errorf("uid 65534 read the report:\n%s", out)
			}
		})
	}
}
