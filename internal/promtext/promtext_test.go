//go:build linux

package promtext

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/trialnet/trialnet/internal/promtext/promtexttest"
)

// parse reads text as Prometheus does and lints it: a format mistake
// fails the test.
func parse(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	return promtexttest.Parse(t, strings.NewReader(text))
}

func clientText(t *testing.T, cs ...prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(cs...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

type constCollector struct {
	descs   []*prometheus.Desc
	metrics []prometheus.Metric
}

func (c constCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c constCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.metrics {
		ch <- m
	}
}

// Families of every type, with label values and help texts holding
// every character the format escapes (and some it does not), written
// byte for byte as the client library writes the same metrics.
func TestWriteMatchesTheClientLibrary(t *testing.T) {
	nasty := "a\\b\"c\nd é{},=" // backslash, quote, newline, and characters left as they are
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	obs := []float64{0.0001, 0.0005, 0.003, 0.7, 1, 12, 2.5}

	help := "Counts \\ things\nacross lines."
	cDesc := prometheus.NewDesc("x_things_total", help, []string{"trial", "decision", "reason"}, nil)
	gDesc := prometheus.NewDesc("x_live", "Live ones.", nil, nil)
	bDesc := prometheus.NewDesc("x_build_info", "Always 1.", []string{"version", "goversion", "revision"}, nil)
	sDesc := prometheus.NewDesc("x_pause_seconds", "Pauses.", nil, nil)
	emptyDesc := prometheus.NewDesc("x_none_total", "Never collected.", []string{"trial"}, nil)
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x_wait_seconds", Help: "Waits.", Buckets: buckets})
	mine := NewObserver(buckets)
	for _, v := range obs {
		hist.Observe(v)
		mine.Observe(v)
	}
	type row struct {
		v      float64
		labels []string
	}
	rows := []row{{3, []string{"t2", "deny", "b"}}, {1e6, []string{"t1", "allow", "z"}}, {0, []string{nasty, "deny", "a"}},
		{2.42136855889e+11, []string{"t1", "allow", "a"}}, {1, []string{"", "deny", "a"}}, {0.1, []string{"t10", "allow", "a"}}}
	quantiles := map[float64]float64{0: 0.0001, 0.25: 0.0002, 0.5: 0.0003, 0.75: 0.004, 1: 0.5}
	cc := constCollector{descs: []*prometheus.Desc{cDesc, gDesc, bDesc, sDesc, emptyDesc}}
	for _, r := range rows {
		cc.metrics = append(cc.metrics, prometheus.MustNewConstMetric(cDesc, prometheus.CounterValue, r.v, r.labels...))
	}
	cc.metrics = append(cc.metrics, prometheus.MustNewConstMetric(gDesc, prometheus.GaugeValue, 17),
		prometheus.MustNewConstMetric(bDesc, prometheus.GaugeValue, 1, "v1.2.3", "go1.26.8", nasty),
		prometheus.MustNewConstSummary(sDesc, 42, 1.25, quantiles))
	want := clientText(t, cc, hist)

	things := Family{Name: "x_things_total", Help: help, Type: Counter}
	for _, r := range rows {
		things.Series = append(things.Series, Series{Value: r.v, Labels: []Label{{"trial", r.labels[0]}, {"decision", r.labels[1]}, {"reason", r.labels[2]}}})
	}
	summary := Series{Sum: 1.25, Count: 42}
	for _, q := range []float64{0, 0.25, 0.5, 0.75, 1} {
		summary.Quantiles = append(summary.Quantiles, Quantile{q, quantiles[q]})
	}
	var got bytes.Buffer
	if err := Write(&got, []Family{
		things,
		{Name: "x_wait_seconds", Help: "Waits.", Type: Histogram, Series: []Series{mine.Series()}},
		{Name: "x_live", Help: "Live ones.", Type: Gauge, Series: []Series{{Value: 17}}},
		{Name: "x_none_total", Help: "Never collected.", Type: Counter},
		{Name: "x_build_info", Help: "Always 1.", Type: Gauge, Series: []Series{{Value: 1, Labels: []Label{{"version", "v1.2.3"}, {"goversion", "go1.26.8"}, {"revision", nasty}}}}},
		{Name: "x_pause_seconds", Help: "Pauses.", Type: Summary, Series: []Series{summary}},
	}); err != nil {
		t.Fatal(err)
	}
	if got.String() != want {
		t.Errorf("output differs from the client library's.\ngot:\n%s\nwant:\n%s", got.String(), want)
	}
	fams := parse(t, got.String())
	if v := fams["x_build_info"].GetMetric()[0].GetLabel()[1].GetValue(); v != nasty {
		t.Errorf("a label value read back as %q, want %q", v, nasty)
	}
	if h := fams["x_things_total"].GetHelp(); h != help {
		t.Errorf("help read back as %q, want %q", h, help)
	}
}

// The Go runtime's and the process's families are the client library's
// default collectors' own: the same names, types, help texts and labels,
// and the same values where they do not move between two reads.
func TestRuntimeFamiliesMatchTheClientLibrary(t *testing.T) {
	want := parse(t, clientText(t, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})))
	var b bytes.Buffer
	if err := Write(&b, append(GoFamilies(), ProcessFamilies()...)); err != nil {
		t.Fatal(err)
	}
	got := parse(t, b.String())
	var names []string
	for name := range want {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		w, g := want[name], got[name]
		if g == nil {
			t.Errorf("%s: missing", name)
			continue
		}
		if g.GetType() != w.GetType() || g.GetHelp() != w.GetHelp() || len(g.GetMetric()) != len(w.GetMetric()) {
			t.Errorf("%s: %v %q with %d series, want %v %q with %d", name, g.GetType(), g.GetHelp(), len(g.GetMetric()), w.GetType(), w.GetHelp(), len(w.GetMetric()))
			continue
		}
		gm, wm := g.GetMetric()[0], w.GetMetric()[0]
		if !slices.EqualFunc(gm.GetLabel(), wm.GetLabel(), func(a, b *dto.LabelPair) bool { return a.GetName() == b.GetName() && a.GetValue() == b.GetValue() }) {
			t.Errorf("%s: labels %v, want %v", name, gm.GetLabel(), wm.GetLabel())
		}
		gv, wv := value(gm), value(wm)
		switch name {
		case "go_info", "go_gc_gogc_percent", "go_gc_gomemlimit_bytes", "go_sched_gomaxprocs_threads",
			"process_max_fds", "process_virtual_memory_max_bytes", "process_start_time_seconds", "process_open_fds":
			if gv != wv {
				t.Errorf("%s: %v, want %v", name, gv, wv)
			}
		default:
			// Read a moment apart, after the library's: a counter (and the
			// threads the runtime made) has not gone back, a gauge is a size
			// or a count.
			if gv < 0 || (g.GetType() == dto.MetricType_COUNTER || name == "go_threads") && gv < wv {
				t.Errorf("%s: %v, read after the library's %v", name, gv, wv)
			}
		}
	}
	for name := range got {
		if want[name] == nil {
			t.Errorf("%s: not the client library's", name)
		}
	}
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Summary != nil:
		return float64(m.GetSummary().GetSampleCount())
	}
	return math.NaN()
}
