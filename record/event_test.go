package record

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fullEvent has every field set, so that a round trip that drops one
// shows.
func fullEvent(t testing.TB) Event {
	t.Helper()
	e := Event{
		Schema: EventSchema, ID: "id-1", Time: time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC),
		Trial: "t1", Client: "127.0.0.1:40000", Method: "CONNECT", Target: "api.example.com:443",
		Host: "api.example.com", Port: 443, Decision: DecisionDeny, Reason: ReasonSNIMismatch, Detail: "other name",
		Resolved: []netip.Addr{netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("2606:2800:220:1::1")},
		Dialed:   netip.MustParseAddrPort("93.184.216.34:443"), SNI: "other.example.com",
		Rule: "*.example.com:443", Profile: "claude", BytesUp: 517, BytesDown: 7,
		Duration: 9 * time.Millisecond, DNS: 2 * time.Millisecond, Dial: 3 * time.Millisecond, FirstByte: 8 * time.Millisecond,
		// Not a combination the proxy writes, but every field must round-trip.
		Learning: true, WouldDeny: ReasonPolicyDenied, RequireTLS: true, Transparent: true, Route: "/anthropic/", Status: 200,
		PolicyChange: &PolicyChange{UID: 1000, Added: []string{"a.example.com:443"}, Removed: []string{}, Cut: true},
		Suppressed: &Suppressed{Records: 3, ByReason: map[Reason]uint64{ReasonBadTarget: 2, ReasonAllowed: 1}, WouldDeny: 1,
			BytesUp: 5, BytesDown: 6, Refused: map[string]uint64{"a<b>:443": 2}, LogFull: true},
	}
	v := reflect.ValueOf(e)
	for i := range v.NumField() {
		// An unexported field is no part of the record: what it notes
		// (resolvedAll) reaches the record through Clip.
		if v.Type().Field(i).IsExported() && v.Field(i).IsZero() {
			t.Fatalf("fullEvent leaves %s zero: the round trip would not test it", v.Type().Field(i).Name)
		}
	}
	return e
}

func TestEventJSONRoundTrip(t *testing.T) {
	want := fullEvent(t)
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got Event
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip through %s:\n got %+v\nwant %+v", b, got, want)
	}
	// The log line carries the same keys as the JSON record.
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	attrs := want.Attrs()
	if len(attrs) != len(rec) {
		t.Fatalf("%d log attributes, %d JSON keys", len(attrs), len(rec))
	}
	for _, a := range attrs {
		if _, ok := rec[a.Key]; !ok {
			t.Errorf("log attribute %q is not a JSON key", a.Key)
		}
	}
}

// Records written before the schema field (schema 0, no profile) read;
// records of a newer schema are refused, never half-read.
func TestEventJSONSchema(t *testing.T) {
	const old = `{"bytes_down":0,"bytes_up":0,"client":"127.0.0.1:5","decision":"deny","detail":"x:443 is not on this Trial's allowlist",` +
		`"dial_us":0,"dialed":"","dns_us":0,"duration_us":120,"event_id":"abc","first_byte_us":0,"host":"x","method":"CONNECT",` +
		`"port":443,"reason":"policy_denied","resolved":[],"rule":"","sni":"","start":"2025-01-02T03:04:05.000006Z","target":"x:443","trial":"t1"}`
	var e Event
	if err := json.Unmarshal([]byte(old), &e); err != nil {
		t.Fatalf("a schema 0 record: %v", err)
	}
	if e.Schema != 0 || e.Decision != DecisionDeny || e.Reason != ReasonPolicyDenied || e.ID != "abc" || e.Port != 443 ||
		e.Duration != 120*time.Microsecond || e.Dialed.IsValid() || e.Resolved != nil || e.Profile != "" {
		t.Fatalf("schema 0 record read as %+v", e)
	}
	for _, schema := range []string{strconv.Itoa(SummarySchema + 1), "-1"} {
		newer := strings.Replace(old, `{`, `{"schema":`+schema+`,`, 1)
		e := Event{ID: "untouched"}
		err := json.Unmarshal([]byte(newer), &e)
		var se *SchemaError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "schema "+schema) || e.ID != "untouched" {
			t.Fatalf("schema %s record: %v, read as %+v; want a *SchemaError and nothing read", schema, err, e)
		}
	}
}
