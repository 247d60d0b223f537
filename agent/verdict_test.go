//go:build linux

package agent

import (
	"errors"
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

// Over counters that may not be final the verdict is UNKNOWN, never ok,
// and an ALARM they show stays one.
func TestUnsureVerdict(t *testing.T) {
	unsure := errors.New("cgroup still has processes after cgroup.kill")
	var egress bpf.Counters
	egress.EgressOtherPackets = 2
	for _, l := range []client.Layers{{BPFLSM: true}, {}} {
		if v := unsureVerdict(bpf.Counters{}, l, unsure); !strings.Contains(v, "UNKNOWN") || !strings.Contains(v, unsure.Error()) || strings.Contains(v, "(ok)") {
			t.Errorf("clean counters, unsure: %q", v)
		}
		if v := unsureVerdict(egress, l, unsure); !strings.Contains(v, "ALARM: 2 direct egress packets") || !strings.Contains(v, unsure.Error()) || strings.Contains(v, "(ok)") {
			t.Errorf("egress, unsure: %q", v)
		}
	}
}

// A learning Trial's verdict says LEARNING, over counters that may not
// be final too: the allowlist went unenforced whatever the kill did.
func TestLearningVerdictSaysSoWhenUnsure(t *testing.T) {
	unsure := errors.New("cgroup still has processes after cgroup.kill")
	for _, err := range []error{nil, unsure} {
		v := trialVerdict(bpf.Counters{}, client.Layers{BPFLSM: true}, err, true, 4)
		if !strings.Contains(v, "LEARNING: the allowlist was not enforced, 4 requests") {
			t.Errorf("learning, unsure %v: %q says no LEARNING", err, v)
		}
		if err != nil && !strings.Contains(v, "UNKNOWN") {
			t.Errorf("learning, unsure: %q says no UNKNOWN", v)
		}
	}
}

// The summary line's verdict says as little as the full one allows: never
// "(ok)" alone where foreign sockets went unwatched.
func TestBrief(t *testing.T) {
	on := client.Layers{BPFLSM: true}
	const v = "verdict: as the agent made it"
	for _, tc := range []struct {
		st   client.Stats
		want string
	}{
		{client.Stats{Verdict: v, Layers: on}, "0 direct egress packets (ok)"},
		{client.Stats{Verdict: v}, "0 direct egress packets (ok; foreign sockets unwatched)"},
		{client.Stats{Verdict: v, Layers: on, Egress: 2}, "ALARM: 2 direct egress packets dropped"},
		{client.Stats{Verdict: v, Egress: 2}, "ALARM: 2 direct egress packets dropped"},
		{client.Stats{Verdict: v, Layers: on, Foreign: 1}, "0 direct egress packets; ALERT: 1 foreign-socket uses refused"},
		{client.Stats{Verdict: v, Layers: on, Learning: true}, "0 direct egress packets (ok); LEARNING: allowlist not enforced"},
		{client.Stats{Verdict: v, Layers: on, Unsure: "cgroup still has processes"}, "UNKNOWN: the final counters may not hold all the Trial did"},
		{client.Stats{Verdict: v, Layers: on, Egress: 1, Unsure: "cgroup still has processes"}, "ALARM: 1 direct egress packets dropped"},
		// A destroy that failed through the control API: its error, no stats.
		{client.Stats{}, "NO VERDICT: the agent gave no final counters"},
	} {
		if got := tc.st.Brief(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.st, got, tc.want)
		}
	}
}
