//go:build linux

package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	trialspec "github.com/trialnet/trialnet/trial"
)

// A reload --reprofile changes a live Trial's allowlist and nothing else
// of its description, which the agent's other goroutines read without
// the agent's lock (its id, creation time, owner: the keeper's resync
// every 10 s, the proxy's serve goroutines, the owner watch). Meant for
// go test -race: a reprofile that rewrote the whole description raced
// each of them.
func TestPrivilegedReprofileRewritesOnlyTheAllowlist(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 250, "upstream.example.test")
	up := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	cfg, _ := reloadable(t, w, "profiles:\n  p1: ["+up+"]\n")
	a := startAgent(t, cfg)
	info, err := a.Create(context.Background(), trialspec.Request{ID: "rr-prof", Profiles: []string{"p1"}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			// As tendKeeper does.
			for id := range a.trialListeners() {
				if id != info.ID {
					t.Errorf("listeners of %q, want %q", id, info.ID)
				}
			}
		}
	})
	for range 20 {
		if _, err := a.Reload(context.Background(), client.ReloadRequest{Reprofile: true}); err != nil {
			t.Error(err)
			break
		}
	}
	close(stop)
	wg.Wait()
	got, err := a.Get(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != info.ID || !got.Created.Equal(info.Created) || len(got.Allow) != 1 || got.Allow[0].Entry != up {
		t.Fatalf("description after the reprofiles: %+v", got)
	}
}
