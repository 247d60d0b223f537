//go:build linux

package agent

import (
	"context"
	"fmt"
	"github.com/trialnet/trialnet/internal/lname"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/keepertest"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/keeper"
	trialspec "github.com/trialnet/trialnet/trial"
)

// A keeper that missed a Trial's end and the reuse of its id still holds
// the earlier Trial's listeners under that id. The next agent serves the
// later Trial, its endpoint listening anew, and never removes it; and the
// keeper drops the earlier Trial's listeners, as their Trial is not the
// one its record names.
func TestPrivilegedKeeperReusedID(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 242, "kr.test")
	cfg := w.config(t)
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	kc := keepertest.Start(t, "") // it holds what it is given: it hears nothing of what follows
	d := &daemon{cfg: ServeConfig{AgentConfig: cfg}, sock: filepath.Join(t.TempDir(), "agent.sock")}
	req := trialspec.Request{ID: "kr", Allow: []string{fmt.Sprintf("kr.test:%d", upstreamPort)}}
	a1, err := start(cfg, nil, nil, kc)
	if err != nil {
		t.Fatal(err)
	}
	first, err := a1.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	a1.Close(false) // as if killed: the Trial stays, its listeners with the keeper
	// An agent the keeper does not hear from ends the Trial, and makes
	// another with the same id.
	_, inh, err := d.inherit(kc, log)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := start(cfg, inh, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a2.Destroy(ctx, "kr"); err != nil {
		t.Fatal(err)
	}
	second, err := a2.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	a2.Close(false)
	if _, created, _ := kc.Fetch(); created[lname.EndpointName("kr", 0).String()] != keeper.TrialCreated(first.Created) {
		t.Fatalf("the keeper holds %v; the test wants it to hold the first Trial's (created %s)", created, keeper.TrialCreated(first.Created))
	}
	// The next agent, with that keeper.
	_, inh, err = d.inherit(kc, log)
	if err != nil {
		t.Fatal(err)
	}
	a3, err := start(cfg, inh, nil, kc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a3.Close(true) })
	got, err := a3.Get(ctx, "kr")
	if err != nil || !got.Created.Equal(second.Created) {
		t.Fatalf("the Trial that reused the id, after a restart with a keeper holding the earlier one's listeners: %+v, %v", got, err)
	}
	if code, out := through(t, a3, "kr", fmt.Sprintf("http://kr.test:%d/", upstreamPort)); code != 0 {
		t.Errorf("its endpoint does not serve: curl exit %d: %s", code, out)
	}
	// Its listeners replaced the earlier Trial's in the keeper, every one.
	files, created, err := kc.Fetch()
	if err != nil {
		t.Fatal(err)
	}
	for n, f := range files {
		_ = f.Close()
		if name, _ := lname.Parse(n); name.Trial == "kr" && created[n] != keeper.TrialCreated(second.Created) {
			t.Errorf("the keeper holds %s of the Trial created %s; the live one was created %s", n, created[n], keeper.TrialCreated(second.Created))
		}
	}

	// A keeper that reads the state directory drops a listener whose
	// Trial is not the one the record names.
	pruning := keepertest.Start(t, cfg.Host.StateDir)
	stale, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	pruning.Put([]string{lname.EndpointName("kr", 7).String()}, []string{keeper.TrialCreated(first.Created)}, []net.Listener{stale})
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		files, _, err := pruning.Fetch()
		for _, f := range files {
			_ = f.Close()
		}
		if err == nil && len(files) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the keeper reading the state directory holds %v (%v); want none: their Trial is not the live one", files, err)
		}
	}
}

// A destroy gives back what the agent holds of the Trial beside its
// sandbox before it answers (given back while the receipt is written):
// when Destroy returns, the keeper holds none of the Trial's listeners
// and its steering's pins and names file are gone.
func TestPrivilegedDestroyDropsKeptBeforeItAnswers(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 243, "kd.test")
	cfg := w.config(t)
	kc := keepertest.Start(t, "")
	a, err := start(cfg, nil, nil, kc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(true) })
	ctx := context.Background()
	held := func() []string {
		files, _, err := kc.Fetch()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for n, f := range files {
			_ = f.Close()
			if name, _ := lname.Parse(n); name.Trial == "kd" {
				names = append(names, n)
			}
		}
		return names
	}
	for i := range 5 { // the same id again: each destroy's drops are done before the next create
		info, err := a.Create(ctx, trialspec.Request{ID: "kd", Allow: []string{fmt.Sprintf("kd.test:%d", upstreamPort)}})
		if err != nil {
			t.Fatal(err)
		}
		if !info.Transparent || len(held()) == 0 {
			t.Fatalf("round %d: the test wants a transparent Trial whose listeners the keeper holds (transparent %v, held %v)", i, info.Transparent, held())
		}
		pin := a.host.BPF.SteerPin(info.CgroupID)
		if _, err := a.Destroy(ctx, "kd"); err != nil {
			t.Fatal(err)
		}
		if names := held(); len(names) > 0 {
			t.Fatalf("round %d: after the destroy answered, the keeper still holds %v", i, names)
		}
		for _, p := range []string{pin + "_link", pin + "_map", a.namesFile("kd")} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Fatalf("round %d: %s outlives the destroy: %v", i, p, err)
			}
		}
	}
}
