//go:build linux

package agent

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/promtext"
	"github.com/trialnet/trialnet/record"
)

// Metric names (Prometheus). Every per-Trial series has a "trial" label;
// the histograms have none (see observers).
//
//	trialnet_build_info{version,goversion,revision}       always 1
//	trialnet_trials_live                                  live Trials
//	trialnet_kernel_<counter>_total{trial}                each kernel counter (connect4_denied, egress_other_packets, ...)
//	trialnet_proxy_decisions_total{trial,decision,reason} CONNECT decisions
//	trialnet_proxy_tunnel_bytes_total{trial,direction}    bytes through tunnels (up: Trial to upstream)
//	trialnet_proxy_tunnels_active{trial}                  CONNECTs being served
//	trialnet_proxy_dns_failures_total{trial}              refusals because DNS failed
//	trialnet_direct_egress_packets_total{trial}           the verdict: must stay 0
//	trialnet_dns_stub_queries_total{trial,answer}         the transparent DNS stub's answers (dnsstub.Stats, by JSON key)
//	trialnet_dns_stub_names{trial}                        names the stub gave an address
//	trialnet_proxy_dns_seconds                            histogram: all DNS for one request
//	trialnet_proxy_dial_seconds                           histogram: all dial attempts for one request
//	trialnet_proxy_first_byte_seconds                     histogram: request start to the upstream's first byte
//	go_*, process_*                                       the Go runtime and the agent process
const metricPrefix = "trialnet_"

// The families' help texts, one per name; the kernel counters' come
// from their names.
const (
	helpBuild     = "The agent's build: always 1."
	helpLive      = "Live Trials."
	helpDecisions = "CONNECT decisions by outcome and reason."
	helpBytes     = "Bytes through tunnels; up is Trial to upstream."
	helpActive    = "CONNECTs being served."
	helpDNS       = "CONNECTs refused because DNS failed or had no answer."
	helpStub      = "The transparent DNS stub's answers and closed connections, by kind."
	helpStubNames = "Names the transparent DNS stub gave an address."
	helpEgress    = "Packets that tried to leave a Trial other than through loopback (dropped); anything but 0 is an alarm."
)

// buildLabel is this binary's version, Go version and VCS revision, read
// at the first scrape: parsing the build information in every start of
// the binary would cost each run and exec.
var buildLabel = sync.OnceValue(buildLabels)

// buildLabels are the version, Go version and VCS revision this binary
// was built with ("unknown" where the build did not record one).
func buildLabels() [3]string {
	l := [3]string{"unknown", runtime.Version(), "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return l
	}
	if bi.Main.Version != "" {
		l[0] = bi.Main.Version
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && s.Value != "" {
			l[2] = s.Value
		}
	}
	return l
}

// families reads the agent's metrics at scrape time, so nothing is
// double-kept: the Trials' counters, the latency histograms, the Go
// runtime's and the process's.
func (a *Agent) families() []promtext.Family {
	fams := a.trialFamilies()
	if o := a.obs; o != nil {
		fams = append(fams,
			promtext.Family{Name: metricPrefix + "proxy_dns_seconds", Help: helpObsDNS, Type: promtext.Histogram, Series: []promtext.Series{o.dns.Series()}},
			promtext.Family{Name: metricPrefix + "proxy_dial_seconds", Help: helpObsDial, Type: promtext.Histogram, Series: []promtext.Series{o.dial.Series()}},
			promtext.Family{Name: metricPrefix + "proxy_first_byte_seconds", Help: helpObsFirstByte, Type: promtext.Histogram, Series: []promtext.Series{o.firstByte.Series()}})
	}
	fams = append(fams, promtext.GoFamilies()...)
	return append(fams, promtext.ProcessFamilies()...)
}

// trialFamilies are the per-Trial families, each series labelled with
// its Trial, and the agent's build and live count.
func (a *Agent) trialFamilies() []promtext.Family {
	type fam = promtext.Family
	type label = promtext.Label
	trials := a.list()
	labels := buildLabel()
	build := fam{Name: metricPrefix + "build_info", Help: helpBuild, Type: promtext.Gauge, Series: []promtext.Series{{Value: 1,
		Labels: []label{{Name: "version", Value: labels[0]}, {Name: "goversion", Value: labels[1]}, {Name: "revision", Value: labels[2]}}}}}
	live := fam{Name: metricPrefix + "trials_live", Help: helpLive, Type: promtext.Gauge, Series: []promtext.Series{{Value: float64(len(trials))}}}
	decisions := fam{Name: metricPrefix + "proxy_decisions_total", Help: helpDecisions, Type: promtext.Counter}
	bytes := fam{Name: metricPrefix + "proxy_tunnel_bytes_total", Help: helpBytes, Type: promtext.Counter}
	active := fam{Name: metricPrefix + "proxy_tunnels_active", Help: helpActive, Type: promtext.Gauge}
	dns := fam{Name: metricPrefix + "proxy_dns_failures_total", Help: helpDNS, Type: promtext.Counter}
	egress := fam{Name: metricPrefix + "direct_egress_packets_total", Help: helpEgress, Type: promtext.Counter}
	stub := fam{Name: metricPrefix + "dns_stub_queries_total", Help: helpStub, Type: promtext.Counter}
	stubNames := fam{Name: metricPrefix + "dns_stub_names", Help: helpStubNames, Type: promtext.Gauge}
	// The kernel counters' names come from the BTF struct through bpf2go:
	// one family each, fixed for a build.
	kernel := map[string]*fam{}
	for _, f := range (bpf.Counters{}).Fields() {
		kernel[f.Name] = &fam{Name: metricPrefix + "kernel_" + f.Name + "_total", Help: "Kernel counter " + f.Name + " (see bpf/trialnet.bpf.c).", Type: promtext.Counter}
	}
	for _, info := range trials {
		st, err := a.Stats(context.Background(), info.ID)
		if err != nil {
			continue // destroyed between List and Stats
		}
		one := func(f *fam, v float64, more ...label) {
			f.Series = append(f.Series, promtext.Series{Value: v, Labels: append([]label{{Name: "trial", Value: info.ID}}, more...)})
		}
		for name, v := range st.Kernel {
			if f := kernel[name]; f != nil {
				one(f, float64(v))
			}
		}
		for reason, n := range st.Proxy.ByReason {
			one(&decisions, float64(n), label{Name: "decision", Value: string(reason.Decision())}, label{Name: "reason", Value: string(reason)})
		}
		one(&bytes, float64(st.Proxy.BytesUp), label{Name: "direction", Value: "up"})
		one(&bytes, float64(st.Proxy.BytesDown), label{Name: "direction", Value: "down"})
		one(&active, float64(st.Proxy.Active))
		one(&dns, float64(st.Proxy.DNSFailures))
		one(&egress, float64(st.Egress))
		if s := st.DNS; s != nil {
			for _, x := range []struct {
				answer string
				n      uint64
			}{{"answered", s.Answered}, {"nodata", s.NoData}, {"nxdomain", s.NXDomain}, {"refused", s.Refused}, {"formerr", s.FormErr},
				{"notimp", s.NotImp}, {"rate_limited", s.RateLimited}, {"pool_full", s.PoolFull}, {"dropped", s.Dropped},
				{"tcp_refused", s.TCPRefused}, {"tcp_too_large", s.TCPTooLarge}} {
				one(&stub, float64(x.n), label{Name: "answer", Value: x.answer})
			}
			one(&stubNames, float64(s.Names))
		}
	}
	out := []fam{build, live, decisions, bytes, active, dns, egress, stub, stubNames}
	for _, f := range kernel {
		out = append(out, *f)
	}
	return out
}

// observers are the latency histograms, fed from the decision events.
// They have no trial label: a histogram is a dozen series, so per Trial
// three of them would cost about 45 series a Trial (450,000 at 10,000
// Trials) for latencies that are a property of the proxy and the
// upstreams, not of a Trial. A Trial's own timings are in its decision
// log (dns_us, dial_us, first_byte_us).
type observers struct {
	dns, dial, firstByte *promtext.Observer
}

const (
	helpObsDNS       = "Time spent resolving the name of one CONNECT or forwarded request (all queries), when it was resolved."
	helpObsDial      = "Time spent connecting to the upstream of one request (all attempts), when it was dialed."
	helpObsFirstByte = "From the start of a request to the upstream's first byte: the setup a client waits out."
)

// latencyBuckets span 0.5 ms (a cached name, a LAN dial) to 10 s (the
// dial timeout).
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

func newObservers() *observers {
	return &observers{
		dns:       promtext.NewObserver(latencyBuckets),
		dial:      promtext.NewObserver(latencyBuckets),
		firstByte: promtext.NewObserver(latencyBuckets),
	}
}

func (o *observers) observe(ev *record.Event) {
	if o == nil { // an Agent made without Start (tests of the log alone)
		return
	}
	if ev.DNS > 0 {
		o.dns.Observe(ev.DNS.Seconds())
	}
	if ev.Dial > 0 {
		o.dial.Observe(ev.Dial.Seconds())
	}
	if ev.FirstByte > 0 {
		o.firstByte.Observe(ev.FirstByte.Seconds())
	}
}

// Health checks that the eBPF layer is attached (so it outlives this
// process) and that the agent serves.
func (a *Agent) Health(context.Context) (client.Health, error) {
	h := client.Health{OK: true, EBPF: "attached", Agent: "serving", Trials: len(a.list()), Layers: a.host.Layers(), PID: os.Getpid()}
	if err := a.host.BPF.CheckPins(); err != nil {
		h.OK, h.EBPF = false, err.Error()
	}
	if a.closed.Load() {
		h.OK, h.Agent = false, "stopped"
	}
	return h, nil
}

func (a *Agent) serveHealth(w http.ResponseWriter, r *http.Request) {
	h, _ := a.Health(r.Context())
	w.Header().Set("Content-Type", "application/json")
	if !h.OK {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(h)
}

// MetricsHandler serves GET /metrics (Prometheus's text format 0.0.4,
// gzipped when the scraper accepts it) and GET /healthz (200 when
// healthy, 503 otherwise), for the metrics address.
func (a *Agent) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", a.serveMetrics)
	mux.HandleFunc("GET /healthz", a.serveHealth)
	return mux
}

func (a *Agent) serveMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", promtext.ContentType)
	w.Header().Set("Vary", "Accept-Encoding")
	var out io.Writer = w
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		out = gz
	}
	// A write error is the scraper gone: nothing to tell it.
	_ = promtext.Write(out, a.families())
}

// acceptsGzip says whether an Accept-Encoding header takes gzip (and
// does not refuse it with q=0).
func acceptsGzip(h string) bool {
	for part := range strings.SplitSeq(h, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			q := strings.ReplaceAll(params, " ", "")
			return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
		}
	}
	return false
}
