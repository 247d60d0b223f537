//go:build linux

package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

// Run, driven as a library: an owned Trial made, the command run in it
// with the Trial's proxy, its decisions seen as they happen, the Trial
// destroyed with the exit in its receipt; a deadline kills the command;
// a command that cannot start is reported and leaves no Trial.
func TestPrivilegedRunAsALibrary(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 223, "upstream.example.test")
	a := startAgent(t, w.config(t))
	ctx := context.Background()
	cmd := func(script string) sandbox.Command {
		return sandbox.Command{Args: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534}
	}
	var out bytes.Buffer
	var refused []string
	c := cmd(`curl -sS --max-time 5 -o /dev/null "http://other.example.test/" ; curl -sS --max-time 5 "http://upstream.example.test:` + fmt.Sprint(upstreamPort) + `/"; exit 3`)
	c.Stdout, c.Stderr = &out, &out
	res, err := client.Run(ctx, a, client.RunSpec{
		Create: trialspec.Request{ID: "run-lib-1", Allow: []string{fmt.Sprintf("upstream.example.test:%d", upstreamPort)}},
		Launch: Launch{Command: c},
		OnDecision: func(ev record.Event) {
			if ev.Decision == record.DecisionDeny {
				refused = append(refused, ev.Target)
			}
		},
	})
	if err != nil || res.Exit != 3 || res.TimedOut || !strings.Contains(out.String(), "hello from upstream.example.test") {
		t.Fatalf("run: %+v, %v; output %q", res, err, out.String())
	}
	if res.Info.Owner == nil || *res.Info.Owner != *self() {
		t.Fatalf("the run's Trial is owned by %+v, want this process", res.Info.Owner)
	}
	if res.Stats.Receipt == nil || res.Stats.Proxy.Allowed != 1 || res.Stats.Proxy.Denied != 1 || len(refused) != 1 {
		t.Fatalf("final stats %+v, refusals seen %q", res.Stats, refused)
	}
	if l, _ := a.List(ctx); len(l) != 0 {
		t.Fatalf("the run left Trials: %+v", l)
	}

	start := time.Now()
	res, err = client.Run(ctx, a, client.RunSpec{Create: trialspec.Request{ID: "run-lib-2"}, Launch: Launch{Command: cmd("sleep 30")}, Timeout: 300 * time.Millisecond})
	if err != nil || !res.TimedOut || res.Exit != client.ExitTimeout || time.Since(start) > 10*time.Second {
		t.Fatalf("run past its deadline: %+v, %v after %v", res, err, time.Since(start))
	}

	res, err = client.Run(ctx, a, client.RunSpec{Create: trialspec.Request{ID: "run-lib-3"}, Launch: Launch{Command: sandbox.Command{Args: []string{"no-such-command-trialnet"}, UID: 65534, GID: 65534}}})
	var se *sandbox.StartError
	if !errors.As(err, &se) || res.Exit != 127 || res.Info.ID != "run-lib-3" {
		t.Fatalf("a command that cannot start: %+v, %v", res, err)
	}
	if l, _ := a.List(ctx); len(l) != 0 {
		t.Fatalf("the runs left Trials: %+v", l)
	}
}
