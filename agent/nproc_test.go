//go:build linux

package agent

import (
	"context"
	"testing"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

// A Trial's process limit is the request's, else the config's
// limits.max_processes, kept in its record; out-of-range values are
// refused, by create and by reload alike.
func TestPrivilegedMaxProcesses(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 240)
	cfg, path := reloadable(t, w, "limits:\n  max_processes: 50\n")
	a := startAgent(t, cfg)
	for _, c := range []struct {
		id   string
		req  int
		want int
	}{{"np-config", 0, 50}, {"np-own", 20, 20}} {
		if _, err := a.Create(context.Background(), trialspec.Request{ID: c.id, MaxProcesses: c.req}); err != nil {
			t.Fatal(err)
		}
		info, err := a.Get(context.Background(), c.id)
		if err != nil {
			t.Fatal(err)
		}
		if info.Limits == nil || info.Limits.MaxProcesses != c.want {
			t.Errorf("%s: limits %+v, want max_processes %d", c.id, info.Limits, c.want)
		}
	}
	for _, n := range []int{-1, sandbox.MaxMaxProcs + 1} {
		_, err := a.Create(context.Background(), trialspec.Request{ID: "np-bad", MaxProcesses: n})
		wantCode(t, err, client.CodeBadRequest, "max_processes")
	}
	if len(a.list()) != 2 {
		t.Fatalf("refused creates left Trials: %v", a.list())
	}

	for yaml, says := range map[string]string{
		"limits:\n  max_processes: -1\n":      "negative",
		"limits:\n  max_processes: 5000000\n": "max_processes",
	} {
		writeConfig(t, path, yaml)
		_, err := a.Reload(context.Background(), client.ReloadRequest{})
		wantCode(t, err, client.CodeBadConfig, says)
	}
	writeConfig(t, path, "limits:\n  max_processes: 60\n")
	if _, err := a.Reload(context.Background(), client.ReloadRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "np-reloaded"}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]int{"np-reloaded": 60, "np-config": 50} {
		if info, err := a.Get(context.Background(), id); err != nil || info.Limits.MaxProcesses != want {
			t.Errorf("%s after the reload: %+v %v, want max_processes %d", id, info.Limits, err, want)
		}
	}
}
