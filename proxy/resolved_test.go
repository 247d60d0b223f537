//go:build linux

package proxy

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
	trialspec "github.com/trialnet/trialnet/trial"
)

// publicAddrs resolves every name to n public addresses, which the guard
// lets through.
type publicAddrs int

func (n publicAddrs) Resolve(context.Context, string) (resolve.Answer, error) {
	addrs := make([]netip.Addr, n)
	for i := range addrs {
		addrs[i] = netip.AddrFrom4([4]byte{93, 184, byte(i >> 8), byte(i)})
	}
	return resolve.Answer{Addrs: addrs}, nil
}

// openRecords is a Ledger that notes how many addresses the record of
// each tunnel holds while the tunnel is open: as much as the record
// itself, which lives as long as the tunnel.
type openRecords struct {
	mu   sync.Mutex
	held []int
}

func (l *openRecords) Open(ev *record.Event) func() {
	l.mu.Lock()
	l.held = append(l.held, cap(ev.Resolved))
	l.mu.Unlock()
	return func() {}
}

func (*openRecords) Keep(*record.Suppressed, *record.Event, bool, time.Time, time.Time) {}
func (*openRecords) Drop()                                                              {}

// An open tunnel's record held every address its name resolved to: 4,000
// addresses a name, 256 open tunnels, held 25 MiB of the shared proxy for
// one Trial. It holds the 16 its record lists, and the record still says
// how many there were.
func TestOpenTunnelHoldsOnlyTheAddressesRecorded(t *testing.T) {
	const n = 4000
	tp := newTestProxy(t, proxyOpts{allow: []string{"many.test:443"}, configure: func(c *Config) { c.Resolver = publicAddrs(n) }})
	l := &openRecords{}
	al, err := allow.Parse([]string{"many.test:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := tp.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: "t2"}, Allow: al, Ledger: l}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = tp.Serve(ln, "t2") }()
	t2 := &testProxy{Proxy: tp.Proxy, addr: ln.Addr().String(), events: tp.events}
	resp, c, br := t2.connect(t, connectHead("many.test:443"))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	pingEcho(t, struct {
		io.Reader
		io.Writer
	}{br, c})
	_ = c.Close()
	ev := tp.event(t)
	l.mu.Lock()
	held := l.held
	l.mu.Unlock()
	if len(held) != 1 || held[0] > 16 {
		t.Fatalf("the open tunnel's record held room for %v addresses, not at most the 16 it lists", held)
	}
	if ev.Decision != record.DecisionAllow || len(ev.Resolved) != 16 || !strings.Contains(ev.Detail, "resolved to 4000 addresses, the first 16 recorded") {
		t.Fatalf("record: %s, %d addresses, detail %q", ev.Decision, len(ev.Resolved), ev.Detail)
	}
}
