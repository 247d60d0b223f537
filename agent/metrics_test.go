//go:build linux

package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/trialnet/trialnet/internal/privtest"
	trialspec "github.com/trialnet/trialnet/trial"
)

// The metrics pass the linter and the pedantic registry (every series
// collected is described), the egress metric is a counter, the latency
// histograms are fed, and a scrape's cost per Trial is measured.
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

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(collector{a}, a.obs.dns, a.obs.dial, a.obs.firstByte)
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("pedantic gather (every collected series must be described): %v", err)
	}
	all, err := a.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(all).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	byName := make(map[string]*dto.MetricFamily)
	for _, mf := range all {
		byName[mf.GetName()] = mf
	}
	for name, typ := range map[string]dto.MetricType{
		"trialnet_direct_egress_packets_total": dto.MetricType_COUNTER,
		"trialnet_build_info":                  dto.MetricType_GAUGE,
		"trialnet_proxy_dns_seconds":           dto.MetricType_HISTOGRAM,
		"trialnet_proxy_dial_seconds":          dto.MetricType_HISTOGRAM,
		"trialnet_proxy_first_byte_seconds":    dto.MetricType_HISTOGRAM,
		"go_goroutines":                        dto.MetricType_GAUGE,
		"process_open_fds":                     dto.MetricType_GAUGE,
	} {
		mf := byName[name]
		if mf == nil || mf.GetType() != typ {
			t.Errorf("%s: %v, want a %v", name, mf.GetType(), typ)
		}
	}
	if mf := byName["trialnet_direct_egress_packets_total"]; mf != nil && len(mf.GetMetric()) != trials {
		t.Errorf("egress series %d, want one per Trial", len(mf.GetMetric()))
	}
	for _, name := range []string{"trialnet_proxy_dns_seconds", "trialnet_proxy_dial_seconds", "trialnet_proxy_first_byte_seconds"} {
		if mf := byName[name]; mf == nil || mf.GetMetric()[0].GetHistogram().GetSampleCount() < trials {
			t.Errorf("%s observed fewer than %d requests", name, trials)
		}
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
