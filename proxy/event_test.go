package proxy

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// A decision log line reads back into the Event that wrote it.
func TestEventJSONRoundTrip(t *testing.T) {
	in := Event{
		ID: "e1", Time: time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC), Trial: "t1", Client: "127.0.0.1:4000",
		Method: "CONNECT", Target: "a.example:443", Host: "a.example", Port: 443, Decision: DecisionAllow,
		Reason: ReasonAllowed, Detail: "d", Resolved: []netip.Addr{netip.MustParseAddr("192.0.2.1")},
		Dialed: netip.MustParseAddrPort("192.0.2.1:443"), SNI: "a.example", Rule: "a.example:443",
		BytesUp: 10, BytesDown: 20, Duration: 3 * time.Millisecond, DNS: time.Millisecond, Dial: 2 * time.Millisecond,
		FirstByte: 2500 * time.Microsecond,
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Event
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n in %+v\nout %+v", in, out)
	}
	var deny Event
	if err := json.Unmarshal([]byte(`{"decision":"deny","reason":"policy_denied","host":"b.example","port":443,"resolved":[],"dialed":""}`), &deny); err != nil {
		t.Fatal(err)
	}
	if deny.Reason != ReasonPolicyDenied || deny.Dialed.IsValid() || deny.Port != 443 {
		t.Fatalf("deny %+v", deny)
	}
}
