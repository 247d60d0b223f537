// Package promtext writes Prometheus's text exposition format, version
// 0.0.4, byte for byte as the Prometheus Go client's expfmt writes it:
// families sorted by name, a family's series by their label values,
// label names sorted, floats in Go's shortest 'g' form, bucket and
// sample counts as integers.
//
// It exists so that trialnet, whose every start runs every linked
// package's init, does not link the Prometheus client, its procfs and
// protobuf for the agent's /metrics alone. The client is kept in the
// tests, which parse this package's output with its parser and lint it.
package promtext

import (
	"bufio"
	"cmp"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// ContentType is the text format's media type, as the client library's
// handler sends it.
const ContentType = "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"

// Type is a family's metric type.
type Type string

const (
	Counter   Type = "counter"
	Gauge     Type = "gauge"
	Histogram Type = "histogram"
	Summary   Type = "summary"
)

// Label is one label of a series.
type Label struct{ Name, Value string }

// Family is one metric family: its name, help, type and series.
type Family struct {
	Name, Help string
	Type       Type
	Series     []Series
}

// Series is one series of a family: Value for a counter or a gauge,
// Buckets (cumulative, by upper bound) for a histogram, Quantiles for a
// summary, with Sum and Count for both of those.
type Series struct {
	Labels    []Label
	Value     float64
	Buckets   []Bucket
	Quantiles []Quantile
	Sum       float64
	Count     uint64
}

// Bucket is a histogram bucket: the count of observations at or below
// UpperBound.
type Bucket struct {
	UpperBound float64
	Count      uint64
}

// Quantile is one quantile of a summary.
type Quantile struct{ Quantile, Value float64 }

// Write writes fams to w in the text format. Families without series
// are left out, as the client library's registry leaves them out.
func Write(w io.Writer, fams []Family) error {
	bw := bufio.NewWriter(w)
	fams = slices.Clone(fams)
	slices.SortFunc(fams, func(a, b Family) int { return strings.Compare(a.Name, b.Name) })
	for _, f := range fams {
		if len(f.Series) == 0 {
			continue
		}
		series := make([]Series, len(f.Series))
		for i, s := range f.Series {
			s.Labels = slices.Clone(s.Labels)
			slices.SortFunc(s.Labels, func(a, b Label) int { return strings.Compare(a.Name, b.Name) })
			series[i] = s
		}
		slices.SortFunc(series, compareSeries)
		bw.WriteString("# HELP " + f.Name + " ")
		writeEscaped(bw, f.Help, false)
		bw.WriteString("\n# TYPE " + f.Name + " " + string(f.Type) + "\n")
		for _, s := range series {
			writeSeries(bw, f, s)
		}
	}
	return bw.Flush()
}

// compareSeries orders a family's series as the client library does:
// fewer labels first, then by each label's value in label-name order.
func compareSeries(a, b Series) int {
	if c := cmp.Compare(len(a.Labels), len(b.Labels)); c != 0 {
		return c
	}
	for i := range a.Labels {
		if c := strings.Compare(a.Labels[i].Value, b.Labels[i].Value); c != 0 {
			return c
		}
	}
	return 0
}

func writeSeries(w *bufio.Writer, f Family, s Series) {
	switch f.Type {
	case Histogram:
		inf := false
		for _, b := range s.Buckets {
			writeSample(w, f.Name+"_bucket", s.Labels, "le", b.UpperBound, formatUint(b.Count))
			inf = inf || math.IsInf(b.UpperBound, +1)
		}
		if !inf {
			writeSample(w, f.Name+"_bucket", s.Labels, "le", math.Inf(+1), formatUint(s.Count))
		}
		writeSample(w, f.Name+"_sum", s.Labels, "", 0, formatFloat(s.Sum))
		writeSample(w, f.Name+"_count", s.Labels, "", 0, formatUint(s.Count))
	case Summary:
		for _, q := range s.Quantiles {
			writeSample(w, f.Name, s.Labels, "quantile", q.Quantile, formatFloat(q.Value))
		}
		writeSample(w, f.Name+"_sum", s.Labels, "", 0, formatFloat(s.Sum))
		writeSample(w, f.Name+"_count", s.Labels, "", 0, formatUint(s.Count))
	default:
		writeSample(w, f.Name, s.Labels, "", 0, formatFloat(s.Value))
	}
}

// writeSample writes one line: name, the labels and an extra one (le or
// quantile, when extra is not ""), and the value.
func writeSample(w *bufio.Writer, name string, labels []Label, extra string, extraValue float64, value string) {
	w.WriteString(name)
	if len(labels) > 0 || extra != "" {
		w.WriteByte('{')
		for i, l := range labels {
			if i > 0 {
				w.WriteByte(',')
			}
			w.WriteString(l.Name + `="`)
			writeEscaped(w, l.Value, true)
			w.WriteByte('"')
		}
		if extra != "" {
			if len(labels) > 0 {
				w.WriteByte(',')
			}
			w.WriteString(extra + `="` + formatFloat(extraValue) + `"`)
		}
		w.WriteByte('}')
	}
	w.WriteString(" " + value + "\n")
}

// writeEscaped escapes a backslash and a newline, and in a label value
// a double quote too: the format's only escapes.
func writeEscaped(w *bufio.Writer, s string, quote bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			w.WriteString(`\\`)
		case c == '\n':
			w.WriteString(`\n`)
		case c == '"' && quote:
			w.WriteString(`\"`)
		default:
			w.WriteByte(c)
		}
	}
}

func formatFloat(f float64) string {
	switch {
	case f == 1:
		return "1"
	case f == 0:
		return "0"
	case f == -1:
		return "-1"
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, +1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func formatUint(n uint64) string { return strconv.FormatUint(n, 10) }

// Observer is a histogram with fixed buckets, safe for concurrent use.
// A mutex, not atomics: an observation is one per request, and a scrape
// then reads buckets, sum and count that agree.
type Observer struct {
	bounds []float64
	mu     sync.Mutex
	counts []uint64 // per bucket, not cumulative; the last is +Inf's
	sum    float64
}

// NewObserver returns a histogram with these upper bounds, ascending.
func NewObserver(bounds []float64) *Observer {
	return &Observer{bounds: slices.Clone(bounds), counts: make([]uint64, len(bounds)+1)}
}

// Observe adds one observation.
func (o *Observer) Observe(v float64) {
	i, _ := slices.BinarySearch(o.bounds, v) // the first bound >= v: le is inclusive
	o.mu.Lock()
	o.counts[i]++
	o.sum += v
	o.mu.Unlock()
}

// Series returns the histogram's series with labels.
func (o *Observer) Series(labels ...Label) Series {
	s := Series{Labels: labels, Buckets: make([]Bucket, len(o.bounds))}
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, b := range o.bounds {
		s.Count += o.counts[i]
		s.Buckets[i] = Bucket{UpperBound: b, Count: s.Count}
	}
	s.Count += o.counts[len(o.bounds)]
	s.Sum = o.sum
	return s
}
