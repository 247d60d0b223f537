//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
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

// collector reads the counters at scrape time, so nothing is double-kept.
type collector struct{ a *Agent }

// Registry returns a Prometheus registry exposing the agent's metrics.
func (a *Agent) Registry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collector{a}, a.obs.dns, a.obs.dial, a.obs.firstByte,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

var (
	descBuild     = prometheus.NewDesc(metricPrefix+"build_info", "The agent's build: always 1.", []string{"version", "goversion", "revision"}, nil)
	descLive      = prometheus.NewDesc(metricPrefix+"trials_live", "Live Trials.", nil, nil)
	descDecisions = prometheus.NewDesc(metricPrefix+"proxy_decisions_total", "CONNECT decisions by outcome and reason.", []string{"trial", "decision", "reason"}, nil)
	descBytes     = prometheus.NewDesc(metricPrefix+"proxy_tunnel_bytes_total", "Bytes through tunnels; up is Trial to upstream.", []string{"trial", "direction"}, nil)
	descActive    = prometheus.NewDesc(metricPrefix+"proxy_tunnels_active", "CONNECTs being served.", []string{"trial"}, nil)
	descDNS       = prometheus.NewDesc(metricPrefix+"proxy_dns_failures_total", "CONNECTs refused because DNS failed or had no answer.", []string{"trial"}, nil)
	descStub      = prometheus.NewDesc(metricPrefix+"dns_stub_queries_total", "The transparent DNS stub's answers and closed connections, by kind.", []string{"trial", "answer"}, nil)
	descStubNames = prometheus.NewDesc(metricPrefix+"dns_stub_names", "Names the transparent DNS stub gave an address.", []string{"trial"}, nil)
	descEgress    = prometheus.NewDesc(metricPrefix+"direct_egress_packets_total", "Packets that tried to leave a Trial other than through loopback (dropped); anything but 0 is an alarm.", []string{"trial"}, nil)
	// descKernel describes each kernel counter. The names come from the
	// BTF struct through bpf2go, so they are fixed for a build: every one
	// is described, and the registry checks what is collected against them.
	descKernel = kernelDescs()
	buildLabel = buildLabels()
)

func kernelDescs() map[string]*prometheus.Desc {
	m := make(map[string]*prometheus.Desc)
	for _, f := range (bpf.Counters{}).Fields() {
		m[f.Name] = prometheus.NewDesc(metricPrefix+"kernel_"+f.Name+"_total", "Kernel counter "+f.Name+" (see bpf/trialnet.bpf.c).", []string{"trial"}, nil)
	}
	return m
}

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

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBuild, descLive, descDecisions, descBytes, descActive, descDNS, descEgress, descStub, descStubNames} {
		ch <- d
	}
	for _, d := range descKernel {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descBuild, prometheus.GaugeValue, 1, buildLabel[:]...)
	trials := c.a.list()
	ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(len(trials)))
	for _, info := range trials {
		st, err := c.a.Stats(context.Background(), info.ID)
		if err != nil {
			continue // destroyed between List and Stats
		}
		for name, v := range st.Kernel {
			if d := descKernel[name]; d != nil {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), info.ID)
			}
		}
		for reason, n := range st.Proxy.ByReason {
			decision := reason.Decision()
			ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(n), info.ID, string(decision), string(reason))
		}
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(st.Proxy.BytesUp), info.ID, "up")
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(st.Proxy.BytesDown), info.ID, "down")
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(st.Proxy.Active), info.ID)
		ch <- prometheus.MustNewConstMetric(descDNS, prometheus.CounterValue, float64(st.Proxy.DNSFailures), info.ID)
		ch <- prometheus.MustNewConstMetric(descEgress, prometheus.CounterValue, float64(st.Egress), info.ID)
		if s := st.DNS; s != nil {
			for _, x := range []struct {
				answer string
				n      uint64
			}{{"answered", s.Answered}, {"nodata", s.NoData}, {"nxdomain", s.NXDomain}, {"refused", s.Refused}, {"formerr", s.FormErr},
				{"notimp", s.NotImp}, {"rate_limited", s.RateLimited}, {"pool_full", s.PoolFull}, {"dropped", s.Dropped},
				{"tcp_refused", s.TCPRefused}, {"tcp_too_large", s.TCPTooLarge}} {
				ch <- prometheus.MustNewConstMetric(descStub, prometheus.CounterValue, float64(x.n), info.ID, x.answer)
			}
			ch <- prometheus.MustNewConstMetric(descStubNames, prometheus.GaugeValue, float64(s.Names), info.ID)
		}
	}
}

// observers are the latency histograms, fed from the decision events.
// They have no trial label: a histogram is a dozen series, so per Trial
// three of them would cost about 45 series a Trial (450,000 at 10,000
// Trials) for latencies that are a property of the proxy and the
// upstreams, not of a Trial. A Trial's own timings are in its decision
// log (dns_us, dial_us, first_byte_us).
type observers struct {
	dns, dial, firstByte prometheus.Histogram
}

// latencyBuckets span 0.5 ms (a cached name, a LAN dial) to 10 s (the
// dial timeout).
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

func newObservers() *observers {
	h := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricPrefix + name, Help: help, Buckets: latencyBuckets})
	}
	return &observers{
		dns:       h("proxy_dns_seconds", "Time spent resolving the name of one CONNECT or forwarded request (all queries), when it was resolved."),
		dial:      h("proxy_dial_seconds", "Time spent connecting to the upstream of one request (all attempts), when it was dialed."),
		firstByte: h("proxy_first_byte_seconds", "From the start of a request to the upstream's first byte: the setup a client waits out."),
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

// MetricsHandler serves GET /metrics and GET /healthz (200 when healthy,
// 503 otherwise), for the metrics address.
func (a *Agent) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.Registry(), promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", a.serveHealth)
	return mux
}
