package record

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
)

// Decision is whether a request was let through. Like a Reason, its
// spelling is an interface: never change one.
type Decision string

// Decisions.
const (
	DecisionAllow Decision = "allow"
	DecisionDeny  Decision = "deny"
	// DecisionPolicyChange is not a decision but a change of the Trial's
	// allowlist (see Event.PolicyChange), kept in the same log so that
	// every decision after it reads under the policy it was made under.
	DecisionPolicyChange Decision = "policy_change"
	// DecisionSuppressed is not a decision either but a summary of the
	// Trial's records that were not written (see Event.Suppressed): the
	// decisions were made and counted, only their records were dropped.
	DecisionSuppressed Decision = "suppressed"
)

// EventSchema is the version of the decision record that this package
// writes. Records written before the version was recorded read as 0; a
// reader refuses a record newer than it knows (see SchemaError). Raise it
// when a key changes meaning or goes; adding a key does not need it: the
// learning keys (learning, would_deny) and the policy-change keys are
// optional additions, empty on other records, and keep schema 1.
const EventSchema = 1

// PolicyChangeSchema is the version of a policy-change record. It is 2
// because an older reader would take the record for a refusal ("decision"
// gained a value that is not a decision): a reader of schema 1 refuses it
// with a SchemaError instead of counting it. It is the newest this
// package wrote before SummarySchema.
const PolicyChangeSchema = 2

// SummarySchema is the version of a summary record (DecisionSuppressed).
// It was 3 because a reader of schema 2 would count the summary as one
// refusal, and not the records it stands for. It is 4 since summaries
// stand for allowed requests too (reached_targets, written once the log
// is full): a reader of 3 would learn a profile that misses the hosts they
// name, so it refuses the record instead. It is the newest this package
// reads.
const SummarySchema = 4

// Event is the one decision record for one CONNECT or one forwarded
// request: trialnet proxy's stdout, the agent's decisions.jsonl and
// journal, what
// "trialnet audit" prints and what the counters are rebuilt from. An
// allowed tunnel's event is emitted when the tunnel closes, with its byte
// counts (a forwarded request's: body bytes up, response bytes down); a
// tunnel refused after it opened (the TLS name check) is a deny.
//
// Its JSON keys are spelled on eventJSON, which reads and logs them,
// and again in AppendJSON, which writes them; TestAppendJSONIsMarshal
// holds the two equal.
type Event struct {
	Schema   int    // EventSchema when written; 0 for records older than the field
	ID       string // unique per decision, for joining with other logs
	Time     time.Time
	Trial    string
	Client   string // the client's address as the listener saw it
	Method   string // CONNECT, or the method of a forwarded request
	Target   string // the request-target as sent
	Host     string // normalised name, if the target parsed
	Port     uint16
	Decision Decision
	Reason   Reason
	Detail   string
	Resolved []netip.Addr
	Dialed   netip.AddrPort
	SNI      string
	Rule     string // the allowlist entry that allowed the name, as host:port or *.suffix:port
	Profile  string // the profile Rule came from (Entry.Profile); empty for an entry given directly
	// Learning is set on every record of a learning Trial: names off its
	// allowlist were let through, not refused.
	Learning bool
	// WouldDeny is the reason the allowlist would have refused this
	// request (ReasonPolicyDenied) on a learning Trial, which let it through.
	WouldDeny Reason
	// RequireTLS says the entry that allowed the request wanted TLS, so
	// that a profile learned from the records asks for it too.
	RequireTLS bool
	// Transparent says the request came to a pool address the Trial's DNS
	// stub handed out, not through the proxy endpoint: its target is the
	// name:port that address and port map to, and the client never named
	// a proxy (docs/transparent.md).
	Transparent bool
	// Route is the credential gateway route a request came to (its
	// path prefix), and Status the upstream's HTTP status on a gateway or
	// forwarded request that got a response; "" and 0 otherwise.
	Route  string
	Status int
	// PolicyChange is set on DecisionPolicyChange records only.
	PolicyChange *PolicyChange
	// Suppressed is set on DecisionSuppressed records only.
	Suppressed *Suppressed
	BytesUp    int64 // client to upstream
	BytesDown  int64 // upstream to client
	Duration   time.Duration
	// Timings, each zero if the step did not happen: all DNS, all dial
	// attempts, and from the start to the upstream's first byte (a
	// forwarded request's response head).
	DNS, Dial, FirstByte time.Duration

	// resolvedAll is how many addresses DNS gave when Resolved holds only
	// the first of them (SetResolved); 0 when it holds them all.
	resolvedAll int
}

// SetResolved notes addrs as the addresses DNS gave: only the first
// maxRecordAddrs, the ones the record lists, are kept, and how many there
// were (Clip says it). The event of an allowed tunnel lives as long as the
// tunnel: holding every address of a name with 4,000 kept 25 MiB of the
// proxy's heap for one Trial's 256 open tunnels.
func (e *Event) SetResolved(addrs []netip.Addr) {
	e.Resolved, e.resolvedAll = addrs, 0
	if len(addrs) > maxRecordAddrs {
		e.Resolved, e.resolvedAll = slices.Clone(addrs[:maxRecordAddrs]), len(addrs)
	}
}

// ResolvedFrom gives e the addresses that o notes as resolved.
func (e *Event) ResolvedFrom(o *Event) { e.Resolved, e.resolvedAll = o.Resolved, o.resolvedAll }

// eventJSON is an Event on the wire, in the order the keys are written
// (AppendJSON writes the same, without reflection). Durations are whole microseconds, the
// unit in the key; every key is always written.
type eventJSON struct {
	Schema      int       `json:"schema"`
	Start       time.Time `json:"start"`
	Trial       string    `json:"trial"`
	Client      string    `json:"client"`
	Method      string    `json:"method"`
	Target      string    `json:"target"`
	Host        string    `json:"host"`
	Port        uint16    `json:"port"`
	Decision    Decision  `json:"decision"`
	Reason      Reason    `json:"reason"`
	Detail      string    `json:"detail"`
	Resolved    []string  `json:"resolved"`
	Dialed      string    `json:"dialed"`
	SNI         string    `json:"sni"`
	BytesUp     int64     `json:"bytes_up"`
	BytesDown   int64     `json:"bytes_down"`
	DurationUS  int64     `json:"duration_us"`
	ID          string    `json:"event_id"`
	Rule        string    `json:"rule"`
	Profile     string    `json:"profile"`
	DNSUS       int64     `json:"dns_us"`
	DialUS      int64     `json:"dial_us"`
	FirstByteUS int64     `json:"first_byte_us"`
	Learning    bool      `json:"learning"`
	WouldDeny   Reason    `json:"would_deny"`
	RequireTLS  bool      `json:"require_tls"`
	Transparent bool      `json:"transparent"`
	Route       string    `json:"route"`
	Status      int       `json:"status"`
	// Policy-change records only; null or absent on decisions.
	PolicyChange *PolicyChange `json:"policy_change"`
	// Summary records only; null or absent on decisions.
	Suppressed *Suppressed `json:"suppressed"`
}

// PolicyChange is a change of a live Trial's allowlist: who made it, the
// entries it added and removed, as host:port, and whether open tunnels of
// removed entries were cut (each such tunnel's own record says so). It is
// logged before it applies, so every decision under it follows it.
type PolicyChange struct {
	UID     int64    `json:"uid"` // the control API caller's uid (SO_PEERCRED); -1 if unknown
	Added   []string `json:"added"`
	Removed []string `json:"removed"`
	Cut     bool     `json:"cut"` // open tunnels allowed by a removed entry are ended
}

// Suppressed counts the records of one Trial that were not written, from
// the summary's start for its duration: what TrialStats counts of them,
// so that counters rebuilt from the log stay exact, their first refused
// targets, and every target their requests reached.
type Suppressed struct {
	Records   uint64            `json:"records"`
	ByReason  map[Reason]uint64 `json:"by_reason"`
	WouldDeny uint64            `json:"would_deny"`
	BytesUp   int64             `json:"bytes_up"`
	BytesDown int64             `json:"bytes_down"`
	// Refused are the refusals by target (as clipped in their records),
	// at most maxSummaryTargets of them; the rest under OtherTargets.
	Refused map[string]uint64 `json:"refused_targets"`
	// Reached are the targets that the suppressed records' requests were
	// let through to, every one: a summary never hides where a Trial got
	// to (a summary holding MaxSummaryReached is written at once, and the
	// next one takes the rest), and a profile learned from the log still
	// allows all of them.
	Reached []ReachedTarget `json:"reached_targets,omitempty"`
	// ReachedOther counts requests let through to targets past the
	// first MaxSummaryReached of a summary written after the log's
	// summary reserve was spent (see Bounds.SummaryReserve): the one
	// place where a reached target is counted and not named.
	ReachedOther uint64 `json:"reached_other,omitempty"`
	// LogFull: the Trial's records reached Limits.MaxLogBytes; from this
	// summary on, its records are only counted in summaries.
	LogFull bool `json:"log_full"`
}

// ReachedTarget is one host:port that requests were let through to, under
// one TLS requirement, with how many of them were let through only
// because the Trial was learning.
type ReachedTarget struct {
	Host       string `json:"host"`
	Port       uint16 `json:"port"`
	RequireTLS bool   `json:"require_tls"`
	Requests   uint64 `json:"requests"`
	WouldDeny  uint64 `json:"would_deny"`
}

// LogValue is the summary as journal attributes, under its JSON keys.
func (s *Suppressed) LogValue() slog.Value {
	if s == nil {
		return slog.AnyValue(nil)
	}
	return slog.GroupValue(slog.Uint64("records", s.Records), slog.Any("by_reason", s.ByReason), slog.Uint64("would_deny", s.WouldDeny),
		slog.Int64("bytes_up", s.BytesUp), slog.Int64("bytes_down", s.BytesDown), slog.Any("refused_targets", s.Refused), slog.Any("reached_targets", s.Reached), slog.Uint64("reached_other", s.ReachedOther), slog.Bool("log_full", s.LogFull))
}

// maxSummaryTargets bounds the refused targets a summary names.
const maxSummaryTargets = 16

// MaxSummaryReached bounds the reached targets one summary holds.
const MaxSummaryReached = 64

// OtherTargets counts, in Suppressed.Refused, the refusals whose target
// did not fit.
const OtherTargets = "(other targets)"

// SchemaError is a record written by a newer trialnet than this one: its
// keys may mean what this reader does not know, so it is not read.
type SchemaError struct{ Schema int }

func (e *SchemaError) Error() string {
	return fmt.Sprintf("decision record has schema %d, newer than the %d this trialnet reads: read it with a newer trialnet", e.Schema, SummarySchema)
}

func (e *Event) wire() eventJSON {
	resolved := make([]string, len(e.Resolved))
	for i, a := range e.Resolved {
		resolved[i] = a.String()
	}
	dialed := ""
	if e.Dialed.IsValid() {
		dialed = e.Dialed.String()
	}
	return eventJSON{
		Schema: e.Schema, Start: e.Time, Trial: e.Trial, Client: e.Client, Method: e.Method, Target: e.Target, Host: e.Host,
		Port: e.Port, Decision: e.Decision, Reason: e.Reason, Detail: e.Detail, Resolved: resolved,
		Dialed: dialed, SNI: e.SNI, BytesUp: e.BytesUp, BytesDown: e.BytesDown,
		DurationUS: e.Duration.Microseconds(), ID: e.ID, Rule: e.Rule, Profile: e.Profile,
		DNSUS: e.DNS.Microseconds(), DialUS: e.Dial.Microseconds(), FirstByteUS: e.FirstByte.Microseconds(),
		Learning: e.Learning, WouldDeny: e.WouldDeny, RequireTLS: e.RequireTLS, Transparent: e.Transparent, Route: e.Route, Status: e.Status, PolicyChange: e.PolicyChange, Suppressed: e.Suppressed,
	}
}

// MarshalJSON writes the event as decisions.jsonl and trialnet proxy's
// stdout hold it.
func (e Event) MarshalJSON() ([]byte, error) {
	return e.AppendJSON(make([]byte, 0, 512))
}

// UnmarshalJSON reads a record written by MarshalJSON, by this or an
// earlier version; a record of a newer schema is a *SchemaError.
func (e *Event) UnmarshalJSON(b []byte) error {
	var w eventJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	if w.Schema > SummarySchema || w.Schema < 0 {
		return &SchemaError{w.Schema}
	}
	ev := Event{
		Schema: w.Schema, ID: w.ID, Time: w.Start, Trial: w.Trial, Client: w.Client, Method: w.Method,
		Target: w.Target, Host: w.Host, Port: w.Port, Decision: w.Decision, Reason: w.Reason, Detail: w.Detail,
		SNI: w.SNI, Rule: w.Rule, Profile: w.Profile, BytesUp: w.BytesUp, BytesDown: w.BytesDown,
		Duration: time.Duration(w.DurationUS) * time.Microsecond, DNS: time.Duration(w.DNSUS) * time.Microsecond,
		Dial: time.Duration(w.DialUS) * time.Microsecond, FirstByte: time.Duration(w.FirstByteUS) * time.Microsecond,
		Learning: w.Learning, WouldDeny: w.WouldDeny, RequireTLS: w.RequireTLS, Transparent: w.Transparent, Route: w.Route, Status: w.Status, PolicyChange: w.PolicyChange, Suppressed: w.Suppressed,
	}
	for _, s := range w.Resolved {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("decision record: resolved: %w", err)
		}
		ev.Resolved = append(ev.Resolved, a)
	}
	if w.Dialed != "" {
		ap, err := netip.ParseAddrPort(w.Dialed)
		if err != nil {
			return fmt.Errorf("decision record: dialed: %w", err)
		}
		ev.Dialed = ap
	}
	*e = ev
	return nil
}

func (e *Event) Level() slog.Level {
	if e.Decision == DecisionAllow {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

// eventKeys are eventJSON's keys, by field index: read by reflection
// when first needed, not in every start of the binary.
var eventKeys = sync.OnceValue(func() []string {
	t := reflect.TypeFor[eventJSON]()
	keys := make([]string, t.NumField())
	for i := range keys {
		keys[i], _, _ = strings.Cut(t.Field(i).Tag.Get("json"), ",")
	}
	return keys
})

// Attrs are the event as log attributes, under its JSON keys.
func (e *Event) Attrs() []slog.Attr {
	v := reflect.ValueOf(e.wire())
	keys := eventKeys()
	out := make([]slog.Attr, len(keys))
	for i, k := range keys {
		switch f := v.Field(i); f.Kind() {
		case reflect.String:
			out[i] = slog.String(k, f.String())
		case reflect.Int, reflect.Int64:
			out[i] = slog.Int64(k, f.Int())
		case reflect.Uint16:
			out[i] = slog.Uint64(k, f.Uint())
		case reflect.Bool:
			out[i] = slog.Bool(k, f.Bool())
		default: // the start time and the resolved addresses
			out[i] = slog.Any(k, f.Interface())
		}
	}
	return out
}

// TrialStats are one Trial's proxy counters.
type TrialStats struct {
	Allowed     uint64            `json:"tunnels_allowed"` // tunnels opened and closed cleanly
	Denied      uint64            `json:"tunnels_denied"`  // CONNECTs refused, for any reason
	WouldDeny   uint64            `json:"would_deny"`      // allowed only because the Trial was learning
	ByReason    map[Reason]uint64 `json:"by_reason"`       // every decision by reason ("allowed" included)
	DNSFailures uint64            `json:"dns_failures"`    // refusals because DNS failed or had no answer
	BytesUp     uint64            `json:"bytes_up"`
	BytesDown   uint64            `json:"bytes_down"`
	Active      int64             `json:"tunnels_active"` // CONNECTs being served now
	// Refused counts refusals by target as the records written name
	// them (CountWritten), at most maxRefusedTargets, the rest under
	// OtherTargets: the source of TopRefused, kept off the wire. Counted
	// from what is written, so a log replayed gives the same.
	Refused map[string]uint64 `json:"-"`
}

// maxRefusedTargets bounds the targets TrialStats.Refused names.
const maxRefusedTargets = 256

// TargetCount is how often a target was refused.
type TargetCount struct {
	Target string `json:"target"`
	Count  uint64 `json:"count"`
}

// TopRefused are the n most refused targets, most first.
func (s *TrialStats) TopRefused(n int) []TargetCount {
	out := make([]TargetCount, 0, len(s.Refused))
	for t, c := range s.Refused {
		out = append(out, TargetCount{t, c})
	}
	slices.SortFunc(out, func(x, y TargetCount) int {
		if x.Count != y.Count {
			return cmp.Compare(y.Count, x.Count)
		}
		return strings.Compare(x.Target, y.Target)
	})
	return out[:min(len(out), n)]
}

// CountWritten counts the refusals a written record names: a refusal's
// target, or the targets a summary counts.
func (s *TrialStats) CountWritten(e *Event) {
	switch {
	case e.Decision == DecisionSuppressed && e.Suppressed != nil:
		for target, n := range e.Suppressed.Refused {
			s.countRefused(target, n)
		}
	case e.Decision == DecisionDeny:
		s.countRefused(e.Target, 1)
	}
}

// countRefused counts n refusals of target.
func (s *TrialStats) countRefused(target string, n uint64) {
	if s.Refused == nil {
		s.Refused = make(map[string]uint64)
	}
	if _, ok := s.Refused[target]; !ok && len(s.Refused) >= maxRefusedTargets {
		target = OtherTargets
	}
	s.Refused[target] += n
}

func (s TrialStats) Clone() TrialStats {
	s.ByReason = maps.Clone(s.ByReason)
	s.Refused = maps.Clone(s.Refused)
	if s.ByReason == nil {
		s.ByReason = make(map[Reason]uint64)
	}
	return s
}

// Add counts one decision event, or the decisions a summary record
// stands for; a policy change is no decision.
func (s *TrialStats) Add(e *Event) {
	switch e.Decision {
	case DecisionPolicyChange:
		return
	case DecisionSuppressed:
		if sup := e.Suppressed; sup != nil {
			for r, n := range sup.ByReason {
				s.add(r.Decision(), r, n)
			}
			s.WouldDeny += sup.WouldDeny
			s.BytesUp += uint64(sup.BytesUp)
			s.BytesDown += uint64(sup.BytesDown)
		}
		return
	}
	s.add(e.Decision, e.Reason, 1)
	if e.Decision == DecisionAllow && e.WouldDeny != "" {
		s.WouldDeny++
	}
	s.BytesUp += uint64(e.BytesUp)
	s.BytesDown += uint64(e.BytesDown)
}

// add counts n decisions d of reason r.
func (s *TrialStats) add(d Decision, r Reason, n uint64) {
	if s.ByReason == nil {
		s.ByReason = make(map[Reason]uint64)
	}
	if d == DecisionAllow {
		s.Allowed += n
	} else {
		s.Denied += n
	}
	s.ByReason[r] += n
	switch r {
	case ReasonDNSNXDomain, ReasonDNSFailed, ReasonDNSNoAddresses:
		s.DNSFailures += n
	}
}
