package proxy

import (
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// Decision records reach the Logger only with LogDecisions (the agent's
// journal); the standalone proxy prints them itself and keeps its Logger
// for what goes wrong in serving.
func TestLogDecisions(t *testing.T) {
	for _, on := range []bool{false, true} {
		var buf syncWriter
		tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, configure: func(c *Config) {
			c.Logger = slog.New(slog.NewTextHandler(&buf, nil))
			c.LogDecisions = on
		}})
		resp, _, _ := tp.connect(t, connectHead("other.example.com:443"))
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("status %d", resp.StatusCode)
		}
		tp.event(t) // the record was emitted
		if logged := strings.Contains(buf.String(), "policy_denied"); logged != on {
			t.Errorf("LogDecisions %v: the Logger got the record: %v (%q)", on, logged, buf.String())
		}
	}
}

type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
