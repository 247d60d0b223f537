//go:build linux

package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/sandbox"
)

// What a hook sends is kept for the Trial's life and printed in logs:
// refused unless it names a container, bounded and printable.
func TestCheckContainer(t *testing.T) {
	ok := client.Container{ID: "c1", PID: 7, Bundle: "/b", Capabilities: []string{"CAP_KILL"}}
	if err := checkContainer(ok); err != nil {
		t.Fatalf("a plain container: %v", err)
	}
	for name, c := range map[string]client.Container{
		"no id":            {PID: 7},
		"no pid":           {ID: "c1"},
		"long bundle":      {ID: "c1", PID: 7, Bundle: strings.Repeat("b", maxContainerField+1)},
		"escape in id":     {ID: "c1\x1b]0;x\a", PID: 7},
		"newline in a cap": {ID: "c1", PID: 7, Capabilities: []string{"CAP_KILL\n"}},
	} {
		if err := checkContainer(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A Trial made around a container takes the container's id where that
// is a valid Trial id, cut and lowered as podman's and Docker's are.
func TestContainerTrialID(t *testing.T) {
	long := strings.Repeat("ab", 32)
	for cid, want := range map[string]string{"prof-1": "prof-1", "Prof-1": "prof-1", long: long[:63]} {
		if got := containerTrialID(cid); got != want {
			t.Errorf("containerTrialID(%q) = %q, want %q", cid, got, want)
		}
	}
	for _, cid := range []string{"a/b", "-x", "ctr.1"} {
		if got := containerTrialID(cid); got == strings.ToLower(cid) || sandbox.ValidID(got) != nil {
			t.Errorf("containerTrialID(%q) = %q, want a new valid id", cid, got)
		}
	}
}

// A container whose record endContainer is moving (in the ended file,
// not yet out of the live one), or that an agent stopped between the
// two writes left in both, is one container in the Trial's layers and
// receipt: the hook test once saw 2 for one container at a destroy.
func TestContainersCountsAMovedRecordOnce(t *testing.T) {
	a := &Agent{}
	a.cfg.DataDir = t.TempDir()
	lt := &trial{}
	lt.info.ID = "t1"
	if err := os.Mkdir(filepath.Join(a.cfg.DataDir, "t1"), 0o700); err != nil {
		t.Fatal(err)
	}
	one, two := `{"id":"c1","pid":10}`+"\n", `{"id":"c2","pid":11}`+"\n"
	for path, body := range map[string]string{a.containersFile("t1"): one + two, a.endedFile("t1"): one} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.containers(lt, "t1"); n != 2 {
		t.Fatalf("%d containers counted, want 2", n)
	}
}
