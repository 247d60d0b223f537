//go:build linux

package ociruntime

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestEntry(t *testing.T) {
	rt, err := Entry("/usr/bin/trialnet", "/usr/sbin/runc", "/run/trialnet/agent.sock")
	if err != nil {
		t.Fatal(err)
	}
	if rt.Path != "/usr/bin/trialnet" || !slices.Equal(rt.RuntimeArgs, []string{"oci-runtime", "--runc", "/usr/sbin/runc", "--"}) {
		t.Errorf("entry %+v", rt)
	}
	if rt, _ := Entry("/usr/bin/trialnet", "/usr/sbin/runc", "/tmp/a.sock"); !slices.Equal(rt.RuntimeArgs, []string{"oci-runtime", "--runc", "/usr/sbin/runc", "--socket", "/tmp/a.sock", "--"}) {
		t.Errorf("entry with a socket %+v", rt)
	}
	for _, bad := range [][3]string{{"trialnet", "/usr/sbin/runc", "/s"}, {"/usr/bin/trialnet", "runc", "/s"}, {"/usr/bin/trialnet", "/usr/sbin/runc", "/my dir/s"}, {"/opt/$x/trialnet", "/usr/sbin/runc", "/s"}} {
		if _, err := Entry(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("Entry%q accepted", bad)
		}
	}
}

// Install merges the entry into daemon.json: every other key (and every
// other runtime) stays, a second run changes nothing, an entry of that
// name with another content is replaced only with force, and a file
// that is not one JSON object is left as it was.
func TestInstall(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "docker", "daemon.json")
	one, _ := Entry("/usr/bin/trialnet", "/usr/sbin/runc", "/run/trialnet/agent.sock")
	two, _ := Entry("/opt/trialnet", "/usr/sbin/runc", "/run/trialnet/agent.sock")

	if changed, err := Install(path, "trialnet", one, false); err != nil || !changed {
		t.Fatalf("into no file: %v, %v", changed, err)
	}
	existing := `{"log-level": "warn", "storage-driver": "overlay2", "default-ulimits": {"nofile": {"Name": "nofile", "Hard": 64000, "Soft": 64000}},
		"runtimes": {"crun": {"path": "/usr/bin/crun"}}, "big": 12345678901234567890}`
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(existing), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := Install(path, "trialnet", one, false); err != nil || !changed {
		t.Fatalf("merge: %v, %v", changed, err)
	}
	b, _ := os.ReadFile(path)
	var got map[string]json.RawMessage
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	var was map[string]json.RawMessage
	_ = json.Unmarshal([]byte(existing), &was)
	for k, v := range was {
		if k != "runtimes" && compact(t, got[k]) != compact(t, v) {
			t.Errorf("%s: %s, was %s", k, got[k], v)
		}
	}
	var rts map[string]Runtime
	if err := json.Unmarshal(got["runtimes"], &rts); err != nil || rts["crun"].Path != "/usr/bin/crun" || rts["trialnet"].Path != one.Path {
		t.Errorf("runtimes %s, %v", got["runtimes"], err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode())
	}
	if changed, err := Install(path, "trialnet", one, false); err != nil || changed {
		t.Errorf("the same entry again: %v, %v", changed, err)
	}
	if _, err := Install(path, "trialnet", two, false); !errors.Is(err, ErrDifferentRuntime) {
		t.Errorf("another entry without force: %v", err)
	}
	if changed, err := Install(path, "trialnet", two, true); err != nil || !changed {
		t.Errorf("with force: %v, %v", changed, err)
	}
	for _, bad := range []string{`[1]`, `{"a": 1} {"b": 2}`, `{"runtimes": 3}`, `{"debug": true, "Debug": false}`, `{"runtimes": {"trialnet": {}, "Trialnet": {}}}`, `{`} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Install(path, "trialnet", one, true); err == nil {
			t.Errorf("%s: accepted", bad)
		}
		if b, _ := os.ReadFile(path); string(b) != bad {
			t.Errorf("%s: rewritten as %s", bad, b)
		}
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("left behind: %v", ents)
	}
}

func compact(t *testing.T, b []byte) string {
	var v any
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(v)
	return string(out)
}
