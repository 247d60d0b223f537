//go:build linux

package agent

import (
	"strings"
	"testing"

	"github.com/trialnet/trialnet/bpf"
)

// The verdict never calls a layer ok that was not active, and never says
// 0 while the last wall saw a packet.
func TestVerdict(t *testing.T) {
	on := Layers{BPFLSM: true}
	off := Layers{BPFLSMMissing: "the kernel refused to load a BPF LSM program"}
	for _, tc := range []struct {
		name      string
		c         bpf.Counters
		l         Layers
		want      []string
		mustNotBe []string
	}{
		{"clean, LSM active", bpf.Counters{}, on, []string{"0 direct egress packets, 0 foreign-socket uses (ok)"}, nil},
		{"clean, LSM inactive", bpf.Counters{}, off, []string{"0 direct egress packets (ok)", "not observed", "not active"}, []string{"0 foreign-socket uses"}},
		{"foreign use refused", bpf.Counters{ForeignSocketDenied: 2}, on, []string{"ALERT: 2 foreign-socket uses refused"}, []string{"(ok)"}},
		{"egress", bpf.Counters{EgressOtherPackets: 3, EgressOtherBytes: 180}, on, []string{"ALARM: 3 direct egress packets (180 bytes)"}, []string{"(ok)", "0 direct"}},
		{"egress, LSM inactive", bpf.Counters{EgressOtherPackets: 1}, off, []string{"ALARM: 1 direct egress packets"}, []string{"(ok)", "0 direct"}},
	} {
		v := verdictOf(tc.c, tc.l)
		for _, w := range tc.want {
			if !strings.Contains(v, w) {
				t.Errorf("%s: %q lacks %q", tc.name, v, w)
			}
		}
		for _, w := range tc.mustNotBe {
			if strings.Contains(v, w) {
				t.Errorf("%s: %q must not say %q", tc.name, v, w)
			}
		}
	}
	if s := off.String(); !strings.Contains(s, "BPF LSM (the kernel refused") || !strings.Contains(s, "inactive:") {
		t.Errorf("layers without LSM: %q", s)
	}
}
