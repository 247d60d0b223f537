//go:build linux

package agent

import (
	"strings"
	"testing"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
)

// The verdict never calls a layer ok that was not active, and never says
// 0 while the last wall saw a packet.
func TestVerdict(t *testing.T) {
	on := client.Layers{BPFLSM: true}
	off := client.Layers{BPFLSMMissing: "the kernel refused to load a BPF LSM program"}
	// Promoted fields (bpf.Counters embeds the generated struct) cannot be
	// named in a literal.
	var foreign, egress, egress1 bpf.Counters
	foreign.ForeignSocketDenied = 2
	egress.EgressOtherPackets, egress.EgressOtherBytes = 3, 180
	egress1.EgressOtherPackets = 1
	for _, tc := range []struct {
		name      string
		c         bpf.Counters
		l         client.Layers
		want      []string
		mustNotBe []string
	}{
		{"clean, LSM active", bpf.Counters{}, on, []string{"0 direct egress packets, 0 foreign-socket uses (ok)"}, nil},
		{"clean, LSM inactive", bpf.Counters{}, off, []string{"0 direct egress packets (ok)", "not observed", "not active"}, []string{"0 foreign-socket uses"}},
		{"foreign use refused", foreign, on, []string{"ALERT: 2 foreign-socket uses refused"}, []string{"(ok)"}},
		{"egress", egress, on, []string{"ALARM: 3 direct egress packets (180 bytes)"}, []string{"(ok)", "0 direct"}},
		{"egress, LSM inactive", egress1, off, []string{"ALARM: 1 direct egress packets"}, []string{"(ok)", "0 direct"}},
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
	if s := (client.Layers{BPFLSM: true, Transparent: true}).String(); !strings.Contains(s, ", transparent (DNS stub, sk_lookup") || strings.Contains(on.String(), "transparent") {
		t.Errorf("the transparent layer: %q, and without it %q", s, on.String())
	}
}

// The summary line's verdict says as little as the full one allows: never
// "(ok)" alone where foreign sockets went unwatched.
func TestBrief(t *testing.T) {
	on := client.Layers{BPFLSM: true}
	for _, tc := range []struct {
		st   client.Stats
		want string
	}{
		{client.Stats{Layers: on}, "0 direct egress packets (ok)"},
		{client.Stats{}, "0 direct egress packets (ok; foreign sockets unwatched)"},
		{client.Stats{Layers: on, Egress: 2}, "ALARM: 2 direct egress packets dropped"},
		{client.Stats{Egress: 2}, "ALARM: 2 direct egress packets dropped"},
		{client.Stats{Layers: on, Foreign: 1}, "0 direct egress packets; ALERT: 1 foreign-socket uses refused"},
		{client.Stats{Layers: on, Learning: true}, "0 direct egress packets (ok); LEARNING: allowlist not enforced"},
	} {
		if got := tc.st.Brief(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.st, got, tc.want)
		}
	}
}
