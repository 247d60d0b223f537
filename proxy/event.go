package proxy

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"time"
)

// Decisions.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"
)

// Event is the one decision record for one CONNECT or one forwarded
// request. An allowed tunnel's event is emitted when the tunnel closes,
// with its byte counts (a forwarded request's: body bytes up, response
// bytes down); a tunnel refused after it opened (the TLS name check) is
// a deny.
type Event struct {
	ID        string // unique per decision, for joining with other logs
	Time      time.Time
	Trial     string
	Client    string // the client's address as the listener saw it
	Method    string // CONNECT, or the method of a forwarded request
	Target    string // the request-target as sent
	Host      string // normalised name, if the target parsed
	Port      uint16
	Decision  string // DecisionAllow or DecisionDeny
	Reason    Reason
	Detail    string
	Resolved  []netip.Addr
	Dialed    netip.AddrPort
	SNI       string
	Rule      string // the allowlist entry that allowed the name, as host:port or *.suffix:port
	BytesUp   int64  // client to upstream
	BytesDown int64  // upstream to client
	Duration  time.Duration
	// Timings, each zero if the step did not happen: all DNS, all dial
	// attempts, and from the start to the upstream's first byte (a
	// forwarded request's response head).
	DNS, Dial, FirstByte time.Duration
}

// Event keys in the JSON log; constant so that log consumers can rely on them.
const (
	keyTrial     = "trial"
	keyClient    = "client"
	keyMethod    = "method"
	keyTarget    = "target"
	keyHost      = "host"
	keyPort      = "port"
	keyDecision  = "decision"
	keyReason    = "reason"
	keyDetail    = "detail"
	keyResolved  = "resolved"
	keyDialed    = "dialed"
	keySNI       = "sni"
	keyBytesUp   = "bytes_up"
	keyBytesDown = "bytes_down"
	keyDuration  = "duration_us"
	keyStart     = "start"
	keyID        = "event_id"
	keyRule      = "rule"
	keyDNS       = "dns_us"
	keyDial      = "dial_us"
	keyFirstByte = "first_byte_us"
)

func (e *Event) level() slog.Level {
	if e.Decision == DecisionAllow {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

func (e *Event) attrs() []slog.Attr {
	resolved := make([]string, len(e.Resolved))
	for i, a := range e.Resolved {
		resolved[i] = a.String()
	}
	dialed := ""
	if e.Dialed.IsValid() {
		dialed = e.Dialed.String()
	}
	return []slog.Attr{
		slog.Time(keyStart, e.Time),
		slog.String(keyTrial, e.Trial),
		slog.String(keyClient, e.Client),
		slog.String(keyMethod, e.Method),
		slog.String(keyTarget, e.Target),
		slog.String(keyHost, e.Host),
		slog.Int(keyPort, int(e.Port)),
		slog.String(keyDecision, e.Decision),
		slog.String(keyReason, string(e.Reason)),
		slog.String(keyDetail, e.Detail),
		slog.Any(keyResolved, resolved),
		slog.String(keyDialed, dialed),
		slog.String(keySNI, e.SNI),
		slog.Int64(keyBytesUp, e.BytesUp),
		slog.Int64(keyBytesDown, e.BytesDown),
		slog.Int64(keyDuration, e.Duration.Microseconds()),
		slog.String(keyID, e.ID),
		slog.String(keyRule, e.Rule),
		slog.Int64(keyDNS, e.DNS.Microseconds()),
		slog.Int64(keyDial, e.Dial.Microseconds()),
		slog.Int64(keyFirstByte, e.FirstByte.Microseconds()),
	}
}

// MarshalJSON writes the event with the same keys as the log record, so
// a decision log on disk reads like the proxy's JSON lines.
func (e Event) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, 24)
	for _, a := range e.attrs() {
		m[a.Key] = a.Value.Any()
	}
	return json.Marshal(m)
}

// TrialStats are one Trial's proxy counters.
type TrialStats struct {
	Allowed   uint64            // tunnels opened and closed cleanly
	Denied    uint64            // CONNECTs refused, for any reason
	Decisions map[Reason]uint64 // every decision by reason ("allowed" included)
	DNSFailed uint64            // refusals because DNS failed or had no answer
	BytesUp   uint64
	BytesDown uint64
	Active    int64 // CONNECTs being served now
}

func (s TrialStats) clone() TrialStats {
	s.Decisions = maps.Clone(s.Decisions)
	if s.Decisions == nil {
		s.Decisions = make(map[Reason]uint64)
	}
	return s
}

// Add counts one decision event.
func (s *TrialStats) Add(e *Event) {
	if s.Decisions == nil {
		s.Decisions = make(map[Reason]uint64)
	}
	if e.Decision == DecisionAllow {
		s.Allowed++
	} else {
		s.Denied++
	}
	s.Decisions[e.Reason]++
	switch e.Reason {
	case ReasonDNSNXDomain, ReasonDNSFailed, ReasonDNSNoAddresses:
		s.DNSFailed++
	}
	s.BytesUp += uint64(e.BytesUp)
	s.BytesDown += uint64(e.BytesDown)
}

// UnmarshalJSON reads an event as MarshalJSON writes it (a decision log
// line), by the same key constants: a reader never re-spells them.
func (e *Event) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	var resolved []string
	var dialed string
	var dur, dns, dial, first int64
	var port int
	for key, dst := range map[string]any{
		keyStart: &e.Time, keyTrial: &e.Trial, keyClient: &e.Client, keyMethod: &e.Method, keyTarget: &e.Target,
		keyHost: &e.Host, keyPort: &port, keyDecision: &e.Decision, keyReason: &e.Reason, keyDetail: &e.Detail,
		keyResolved: &resolved, keyDialed: &dialed, keySNI: &e.SNI, keyBytesUp: &e.BytesUp, keyBytesDown: &e.BytesDown,
		keyDuration: &dur, keyID: &e.ID, keyRule: &e.Rule, keyDNS: &dns, keyDial: &dial, keyFirstByte: &first,
	} {
		raw, ok := m[key]
		if !ok {
			continue
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return fmt.Errorf("decision record %s: %w", key, err)
		}
	}
	e.Port = uint16(port)
	e.Duration, e.DNS, e.Dial, e.FirstByte = time.Duration(dur)*time.Microsecond, time.Duration(dns)*time.Microsecond,
		time.Duration(dial)*time.Microsecond, time.Duration(first)*time.Microsecond
	e.Resolved = nil
	for _, s := range resolved {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("decision record %s: %w", keyResolved, err)
		}
		e.Resolved = append(e.Resolved, a)
	}
	e.Dialed = netip.AddrPort{}
	if dialed != "" {
		ap, err := netip.ParseAddrPort(dialed)
		if err != nil {
			return fmt.Errorf("decision record %s: %w", keyDialed, err)
		}
		e.Dialed = ap
	}
	return nil
}
