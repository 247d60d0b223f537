//go:build linux

package bpf

import (
	"reflect"
	"strings"
	"unicode"
)

// Counters are one Trial's kernel counters, summed over CPUs: struct
// trial_counters from trialnet.bpf.c, carried through bpf2go, and the
// counters kept beside a Trial's other entries.
type Counters struct {
	trialnetTrialCounters
	// PtyDenied is struct trial_ptys's denied: pty masters refused past
	// the Trial's bound. It is kept there, not in trial_counters, whose
	// layout older trialnets share, so that an upgrade adopts their live
	// Trials' pinned counters.
	PtyDenied uint64
}

// Field is one named counter.
type Field struct {
	Name  string // snake_case, as in the C struct and in bpftool's dump
	Value uint64
}

// Fields lists the counters in the C struct's order.
func (c Counters) Fields() []Field {
	v := reflect.ValueOf(c.trialnetTrialCounters)
	t := v.Type()
	out := make([]Field, 0, t.NumField()+1)
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		out = append(out, Field{Name: snake(f.Name), Value: v.Field(i).Uint()})
	}
	return append(out, Field{Name: "pty_denied", Value: c.PtyDenied})
}

// Map returns the counters keyed by their snake_case names, for JSON.
func (c Counters) Map() map[string]uint64 {
	m := make(map[string]uint64)
	for _, f := range c.Fields() {
		m[f.Name] = f.Value
	}
	return m
}

// Denied is the number of refusals of every kind.
func (c Counters) Denied() uint64 {
	return c.Connect4Denied + c.Connect6Denied + c.Sendmsg4Denied + c.Sendmsg6Denied +
		c.UnixConnectDenied + c.UnixSendmsgDenied + c.BindDenied + c.SockCreateDenied +
		c.EgressOtherPackets + c.ForeignSocketDenied + c.PtraceDenied + c.SockFamilyDenied +
		c.IoctlDenied + c.UnixIdentityDenied + c.PtyDenied
}

// snake turns bpf2go's Go names back into the C names: Connect4Allowed
// becomes connect4_allowed.
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

func sumCounters(per []trialnetTrialCounters) Counters {
	var sum Counters
	sv := reflect.ValueOf(&sum.trialnetTrialCounters).Elem()
	for i := range per {
		pv := reflect.ValueOf(per[i])
		for f := range sv.NumField() {
			if sv.Type().Field(f).IsExported() {
				sv.Field(f).SetUint(sv.Field(f).Uint() + pv.Field(f).Uint())
			}
		}
	}
	return sum
}
