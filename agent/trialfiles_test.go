//go:build linux

package agent

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A prepared data directory that anything changed before it was taken
// is refused (its decision log is not handed out), and a Trial whose
// data directory exists is not given one; the prepared directory is not
// left under its shell name.
func TestPreparedDataTouchedIsRefused(t *testing.T) {
	for _, c := range []struct {
		name  string
		touch func(t *testing.T, dir string)
		want  string
	}{
		{"its log written", func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, decisionsFile), []byte("{}\n"), 0o600))
		}, "size 3"},
		{"its log replaced", func(t *testing.T, dir string) {
			must(t, os.Remove(filepath.Join(dir, decisionsFile)))
			must(t, os.WriteFile(filepath.Join(dir, decisionsFile), nil, 0o600))
		}, "decision log is another"},
		{"a hard link to its log", func(t *testing.T, dir string) {
			must(t, os.Link(filepath.Join(dir, decisionsFile), filepath.Join(filepath.Dir(dir), "link")))
		}, "2 links"},
		{"its log's mode changed", func(t *testing.T, dir string) {
			must(t, os.Chmod(filepath.Join(dir, decisionsFile), 0o644))
		}, "mode 100644"},
		{"its log held open elsewhere", func(t *testing.T, dir string) {
			f, err := os.Open(filepath.Join(dir, decisionsFile))
			must(t, err)
			t.Cleanup(func() { _ = f.Close() })
		}, "open elsewhere"},
		{"its log's owner changed", func(t *testing.T, dir string) {
			must(t, os.Chown(filepath.Join(dir, decisionsFile), 65534, 65534))
		}, "owner 65534"},
		{"its directory's owner changed", func(t *testing.T, dir string) {
			must(t, os.Chown(dir, 65534, 65534))
		}, "owner 65534"},
		{"its directory's mode changed", func(t *testing.T, dir string) {
			must(t, os.Chmod(dir, 0o755))
		}, "mode 40755"},
		{"a file beside its log", func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, "stats.json"), nil, 0o600))
		}, "its directory holds"},
		{"its directory replaced", func(t *testing.T, dir string) {
			must(t, os.Rename(dir, dir+".moved"))
			must(t, os.Mkdir(dir, 0o700))
			must(t, os.WriteFile(filepath.Join(dir, decisionsFile), nil, 0o600))
		}, "directory is another"},
		{"the Trial's directory exists", func(t *testing.T, dir string) {
			must(t, os.Mkdir(filepath.Join(filepath.Dir(dir), "tf1"), 0o700))
		}, "file exists"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var journal bytes.Buffer
			a := &Agent{cfg: AgentConfig{DataDir: t.TempDir()}, log: slog.New(slog.NewTextHandler(&journal, nil))}
			f, err := a.prepareFiles(false)
			if err != nil {
				t.Fatal(err)
			}
			shell := filepath.Join(a.cfg.DataDir, f.name)
			c.touch(t, shell)
			if log := f.takeData(a, "tf1"); log != nil {
				_ = log.Close()
				t.Fatal("a changed prepared data directory was taken")
			}
			f.close()
			if !strings.Contains(journal.String(), c.want) {
				t.Errorf("the log says %q; want %q", journal.String(), c.want)
			}
			if _, err := os.Stat(shell); !errors.Is(err, os.ErrNotExist) && c.name != "its directory replaced" {
				t.Errorf("the prepared directory is left: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(a.cfg.DataDir, "tf1", decisionsFile)); len(b) > 0 {
				t.Errorf("the Trial's path holds a decision log of %q (%v)", b, err)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
