//go:build linux

package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/trialnet/trialnet/proxy"
)

// Metric names (Prometheus). Every per-Trial series has a "trial" label.
//
//	trialnet_trials_live                                  live Trials
//	trialnet_kernel_<counter>_total{trial}                each kernel counter (connect4_denied, egress_other_packets, ...)
//	trialnet_proxy_decisions_total{trial,decision,reason} CONNECT decisions
//	trialnet_proxy_tunnel_bytes_total{trial,direction}    bytes through tunnels (up: Trial to upstream)
//	trialnet_proxy_tunnels_active{trial}                  CONNECTs being served
//	trialnet_proxy_dns_failures_total{trial}              refusals because DNS failed
//	trialnet_direct_egress_packets{trial}                 the verdict: must be 0
const metricPrefix = "trialnet_"

// collector reads the counters at scrape time, so nothing is double-kept.
type collector struct{ a *Agent }

// Registry returns a Prometheus registry exposing the agent's metrics.
func (a *Agent) Registry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collector{a})
	return r
}

var (
	descLive      = prometheus.NewDesc(metricPrefix+"trials_live", "Live Trials.", nil, nil)
	descDecisions = prometheus.NewDesc(metricPrefix+"proxy_decisions_total", "CONNECT decisions by outcome and reason.", []string{"trial", "decision", "reason"}, nil)
	descBytes     = prometheus.NewDesc(metricPrefix+"proxy_tunnel_bytes_total", "Bytes through tunnels; up is Trial to upstream.", []string{"trial", "direction"}, nil)
	descActive    = prometheus.NewDesc(metricPrefix+"proxy_tunnels_active", "CONNECTs being served.", []string{"trial"}, nil)
	descDNS       = prometheus.NewDesc(metricPrefix+"proxy_dns_failures_total", "CONNECTs refused because DNS failed or had no answer.", []string{"trial"}, nil)
	descEgress    = prometheus.NewDesc(metricPrefix+"direct_egress_packets", "Packets that tried to leave a Trial other than through loopback (dropped); anything but 0 is an alarm.", []string{"trial"}, nil)
)

// Describe is empty on purpose: the kernel counter names come from BTF at
// run time, so the collector is unchecked.
func (collector) Describe(chan<- *prometheus.Desc) {}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	trials := c.a.List()
	ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(len(trials)))
	for _, info := range trials {
		st, err := c.a.Stats(info.ID)
		if err != nil {
			continue // destroyed between List and Stats
		}
		for name, v := range st.Kernel {
			d := prometheus.NewDesc(metricPrefix+"kernel_"+name+"_total", "Kernel counter "+name+" (see bpf/trialnet.bpf.c).", []string{"trial"}, nil)
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), info.ID)
		}
		for reason, n := range st.Proxy.ByReason {
			decision := proxy.Reason(reason).Decision()
			ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(n), info.ID, string(decision), reason)
		}
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(st.Proxy.BytesUp), info.ID, "up")
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(st.Proxy.BytesDown), info.ID, "down")
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(st.Proxy.Active), info.ID)
		ch <- prometheus.MustNewConstMetric(descDNS, prometheus.CounterValue, float64(st.Proxy.DNSFailures), info.ID)
		ch <- prometheus.MustNewConstMetric(descEgress, prometheus.GaugeValue, float64(st.Egress), info.ID)
	}
}
