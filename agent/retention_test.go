//go:build linux

package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	trialspec "github.com/trialnet/trialnet/trial"
)

// The retention rule removes exactly the destroyed Trials' data it names:
// older than keep_days, or beyond the keep_trials newest. A live Trial's
// directory stays however old, and so does anything that is not a
// Trial's data.
func TestRetentionRemovesExactlyWhatTheRuleSays(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	// name -> age; every fixture is a directory with stats.json unless
	// noted. "live" is a live Trial's own directory.
	fixtures := []struct {
		name  string
		age   time.Duration
		stats bool
	}{
		{"live", 400 * day, false},
		{"a", 1 * day, true},
		{"b", 5 * day, true},
		{"b.1700000000000000000", 10 * day, true}, // an earlier Trial named b
		{"c", 40 * day, true},
		{"crashed", 50 * day, false}, // no stats.json: its log's time counts
		{"live.1600000000000000000", 60 * day, true},
		{"not a trial", 500 * day, true},
		{"x.y", 500 * day, true},
	}
	tests := []struct {
		name string
		rule config.Retention
		gone []string
	}{
		{"no rule keeps everything", config.Retention{}, nil},
		{"keep_days 7", config.Retention{KeepDays: 7}, []string{"b.1700000000000000000", "c", "crashed", "live.1600000000000000000"}},
		{"keep_trials 2", config.Retention{KeepTrials: 2}, []string{"b.1700000000000000000", "c", "crashed", "live.1600000000000000000"}},
		{"keep_trials 3", config.Retention{KeepTrials: 3}, []string{"c", "crashed", "live.1600000000000000000"}},
		{"either: days 45 or trials 4", config.Retention{KeepDays: 45, KeepTrials: 4}, []string{"crashed", "live.1600000000000000000"}},
		{"keep_days 1 keeps nothing older than a day", config.Retention{KeepDays: 1}, []string{"b", "b.1700000000000000000", "c", "crashed", "live.1600000000000000000"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range fixtures {
				p := filepath.Join(dir, f.name)
				if err := os.Mkdir(p, 0o700); err != nil {
					t.Fatal(err)
				}
				files := []string{"decisions.jsonl"}
				if f.stats {
					files = append(files, "stats.json")
				}
				at := now.Add(-f.age)
				for _, name := range files {
					if err := os.WriteFile(filepath.Join(p, name), []byte("{}\n"), 0o600); err != nil {
						t.Fatal(err)
					}
					if err := os.Chtimes(filepath.Join(p, name), at, at); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.Chtimes(p, at, at); err != nil {
					t.Fatal(err)
				}
			}
			a := &Agent{cfg: AgentConfig{DataDir: dir}, trials: map[string]*trial{"live": {state: stateLive}}}
			removed, err := a.applyRetention(tc.rule, now)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(removed)
			if !slices.Equal(removed, tc.gone) {
				t.Fatalf("removed %v, want %v", removed, tc.gone)
			}
			ents, _ := os.ReadDir(dir)
			var left []string
			for _, e := range ents {
				left = append(left, e.Name())
			}
			for _, f := range fixtures {
				if slices.Contains(left, f.name) == slices.Contains(tc.gone, f.name) {
					t.Errorf("%s: present %v, but the rule removes it: %v", f.name, slices.Contains(left, f.name), slices.Contains(tc.gone, f.name))
				}
			}
			if len(left) != len(fixtures)-len(tc.gone) {
				t.Errorf("left %v: something else appeared or went", left)
			}
		})
	}
}

// In a running agent the rule is applied after each destroy: with
// keep_trials 1, destroying a second Trial removes the first one's data,
// and a live Trial's directory stays however old it looks.
func TestPrivilegedRetentionAfterDestroy(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 239)
	cfg := w.config(t)
	cfg.File = &config.File{Retention: config.Retention{KeepTrials: 1}}
	a := startAgent(t, cfg)
	for _, id := range []string{"ret-live", "ret-a", "ret-b"} {
		if _, err := a.Create(context.Background(), trialspec.Request{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-1000 * 24 * time.Hour)
	if err := os.Chtimes(filepath.Join(cfg.DataDir, "ret-live"), old, old); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"ret-a", "ret-b"} {
		if _, err := a.Destroy(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // distinct stats.json times
	}
	gone := func(name string) bool {
		_, err := os.Stat(filepath.Join(cfg.DataDir, name))
		return os.IsNotExist(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !gone("ret-a") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if !gone("ret-a") || gone("ret-b") || gone("ret-live") {
		t.Fatalf("after two destroys with keep_trials 1: ret-a gone %v (want true), ret-b gone %v, ret-live gone %v (want false)",
			gone("ret-a"), gone("ret-b"), gone("ret-live"))
	}
}
