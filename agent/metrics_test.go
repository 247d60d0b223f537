//go:build linux

package agent

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/promtext/promtexttest"
	trialspec "github.com/trialnet/trialnet/trial"
)

// scrape GETs /metrics from h, as a Prometheus server does (gzip
// accepted or not), and reads the body with the client library's text
// parser and linter: a format mistake fails the test.
func scrape(t *testing.T, h http.Handler, gzipped bool) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	if gzipped {
		req.Header.Set("Accept-Encoding", "gzip")
	}
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8; escaping=underscores" {
		t.Fatalf("GET /metrics: %d, %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var body io.Reader = rec.Body
	if gzipped {
		if rec.Header().Get("Content-Encoding") != "gzip" {
			t.Fatal("gzip accepted, the body sent plain")
		}
		zr, err := gzip.NewReader(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = zr
	}
	return promtexttest.Parse(t, body)
}

// The metrics parse and pass the linter, each family has its type and
// its labels, the egress metric is a counter, the latency histograms are
// fed, the Go runtime's and the process's families are served, and a
// scrape's cost per Trial is measured.
func TestPrivilegedMetrics(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 237, "upstream.example.test")
	a := startAgent(t, w.config(t))
	const trials = 10
	target := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	for i := range trials {
		id := fmt.Sprintf("agt-m%d", i)
		if _, err := a.Create(context.Background(), trialspec.Request{ID: id, Allow: []string{target}}); err != nil {
			t.Fatal(err)
		}
		if code, out := through(t, a, id, "http://"+target+"/"); code != 0 {
			t.Fatalf("curl %d %s", code, out)
		}
		through(t, a, id, "http://denied.example.test:80/") // a deny reason too
	}

	byName := scrape(t, a.MetricsHandler(), true)
	for name, want := range map[string]struct {
		typ    dto.MetricType
		labels string
	}{
		"trialnet_build_info":                    {dto.MetricType_GAUGE, "goversion,revision,version"},
		"trialnet_trials_live":                   {dto.MetricType_GAUGE, ""},
		"trialnet_kernel_connect4_allowed_total": {dto.MetricType_COUNTER, "trial"},
		"trialnet_proxy_decisions_total":         {dto.MetricType_COUNTER, "decision,reason,trial"},
		"trialnet_proxy_tunnel_bytes_total":      {dto.MetricType_COUNTER, "direction,trial"},
		"trialnet_proxy_tunnels_active":          {dto.MetricType_GAUGE, "trial"},
		"trialnet_proxy_dns_failures_total":      {dto.MetricType_COUNTER, "trial"},
		"trialnet_direct_egress_packets_total":   {dto.MetricType_COUNTER, "trial"},
		"trialnet_dns_stub_queries_total":        {dto.MetricType_COUNTER, "answer,trial"},
		"trialnet_dns_stub_names":                {dto.MetricType_GAUGE, "trial"},
		"trialnet_proxy_dns_seconds":             {dto.MetricType_HISTOGRAM, ""},
		"trialnet_proxy_dial_seconds":            {dto.MetricType_HISTOGRAM, ""},
		"trialnet_proxy_first_byte_seconds":      {dto.MetricType_HISTOGRAM, ""},
		"go_goroutines":                          {dto.MetricType_GAUGE, ""},
		"go_gc_duration_seconds":                 {dto.MetricType_SUMMARY, ""},
		"process_open_fds":                       {dto.MetricType_GAUGE, ""},
		"process_cpu_seconds_total":              {dto.MetricType_COUNTER, ""},
		"process_network_receive_bytes_total":    {dto.MetricType_COUNTER, ""},
	} {
		mf := byName[name]
		if mf == nil || mf.GetType() != want.typ {
			t.Errorf("%s: %v, want a %v", name, mf.GetType(), want.typ)
			continue
		}
		for _, m := range mf.GetMetric() {
			var names []string
			for _, l := range m.GetLabel() {
				names = append(names, l.GetName())
			}
			if got := strings.Join(names, ","); got != want.labels {
				t.Errorf("%s: labels %s, want %s", name, got, want.labels)
			}
		}
	}
	if mf := byName["trialnet_direct_egress_packets_total"]; mf != nil && len(mf.GetMetric()) != trials {
		t.Errorf("egress series %d, want one per Trial", len(mf.GetMetric()))
	}
	if mf := byName["trialnet_trials_live"]; mf.GetMetric()[0].GetGauge().GetValue() != trials {
		t.Errorf("trials_live %v, want %d", mf.GetMetric()[0].GetGauge().GetValue(), trials)
	}
	for _, name := range []string{"trialnet_proxy_dns_seconds", "trialnet_proxy_dial_seconds", "trialnet_proxy_first_byte_seconds"} {
		if mf := byName[name]; mf == nil || mf.GetMetric()[0].GetHistogram().GetSampleCount() < trials {
			t.Errorf("%s observed fewer than %d requests", name, trials)
		}
	}
	// The values are the Trial's stats, as stats shows them.
	st, err := a.Stats(context.Background(), "agt-m3")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range byName["trialnet_proxy_tunnel_bytes_total"].GetMetric() {
		if l := m.GetLabel(); l[1].GetValue() == "agt-m3" && l[0].GetValue() == "down" && m.GetCounter().GetValue() != float64(st.Proxy.BytesDown) {
			t.Errorf("agt-m3 bytes down %v, stats says %d", m.GetCounter().GetValue(), st.Proxy.BytesDown)
		}
	}
	if plain := scrape(t, a.MetricsHandler(), false); len(plain) != len(byName) {
		t.Errorf("plain scrape: %d families, gzipped %d", len(plain), len(byName))
	}

	// The cost of the trial label: series and bytes of one scrape per Trial.
	rec := httptest.NewRecorder()
	a.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var series, bytesTrial int
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.Contains(line, `trial="agt-m`) {
			series++
			bytesTrial += len(line) + 1
		}
	}
	t.Logf("per Trial: %d series, %d bytes of exposition (%d Trials: %d series, %d bytes); whole scrape %d bytes",
		series/trials, bytesTrial/trials, trials, series, bytesTrial, rec.Body.Len())
}

// /healthz answers 200 while the eBPF layer is attached and pinned, and
// 503 saying why once the link pins are gone; on the metrics server and
// on the control socket alike.
func TestPrivilegedHealthz(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 238)
	cfg := w.config(t)
	a := startAgent(t, cfg)
	get := func(h http.Handler) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		b, _ := io.ReadAll(rec.Body)
		return rec.Code, string(b)
	}
	for _, h := range []http.Handler{a.MetricsHandler(), a.Handler()} {
		if code, body := get(h); code != 200 || !strings.Contains(body, `"ebpf":"attached"`) {
			t.Fatalf("healthy agent: %d %s", code, body)
		}
	}
	pins, _ := filepath.Glob(filepath.Join(cfg.Host.PinDir, "link_*"))
	if len(pins) == 0 {
		t.Fatal("no link pins")
	}
	if err := os.Remove(pins[0]); err != nil {
		t.Fatal(err)
	}
	for _, h := range []http.Handler{a.MetricsHandler(), a.Handler()} {
		code, body := get(h)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, strings.TrimPrefix(filepath.Base(pins[0]), "link_")) {
			t.Fatalf("with %s removed: %d %s", pins[0], code, body)
		}
	}
}
