// Package promtexttest reads metrics text as a Prometheus server does,
// for the tests of what writes it (internal/promtext, the agent's
// /metrics). Only tests import it, so the client libraries it uses stay
// out of trialnet's binary.
package promtexttest

import (
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Parse reads text with the client library's text parser and lints it:
// a format mistake fails the test.
func Parse(t testing.TB, text io.Reader) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(text)
	if err != nil {
		t.Fatalf("the text parser refuses the metrics: %v", err)
	}
	var all []*dto.MetricFamily
	for _, f := range fams {
		all = append(all, f)
	}
	problems, err := promlint.NewWithMetricFamilies(all).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	return fams
}
