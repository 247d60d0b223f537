package record

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"testing"
	"time"
)

// marshalReflect is what AppendJSON must equal: encoding/json on the
// wire struct, whose tags spell the keys.
func marshalReflect(e *Event) ([]byte, error) { return json.Marshal(e.wire()) }

func TestAppendJSONIsMarshal(t *testing.T) {
	full := fullEvent(t)
	odd := full
	odd.Detail = "quote \" backslash \\ nl \n tab \t ctl \x01 html <a>&amp; bad \xff utf8 é \u2028 end"
	odd.Target, odd.SNI, odd.Client, odd.Rule = "\x00", "ü.example", "[::1]:1", "a<b>&c:443"
	v6 := full
	v6.Dialed = netip.MustParseAddrPort("[2001:db8::1]:443")
	v6.Resolved = []netip.Addr{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("fe80::1%a\"<b>")}
	for name, e := range map[string]Event{
		"full": full, "zero": {}, "odd strings": odd, "ipv6": v6,
		"zoned start": {Time: time.Date(2026, 12, 1, 1, 2, 3, 4000, time.FixedZone("odd", 5*3600+45*60))},
		"decision":    {Schema: EventSchema, Time: time.Now(), Trial: "t", Decision: DecisionAllow, Reason: ReasonAllowed, Resolved: []netip.Addr{}, BytesUp: -1, Duration: 1500 * time.Nanosecond},
	} {
		want, err := marshalReflect(&e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.AppendJSON(nil)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: AppendJSON\n got %s (%v)\nwant %s", name, got, err, want)
		}
	}
	// encoding/json refuses a year past 9999; so does the appender.
	far := Event{Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	if _, err := far.AppendJSON(nil); err == nil {
		t.Error("a start time past year 9999 was written")
	}
}

// FuzzEventJSON: whatever the strings hold, the appender writes what
// encoding/json writes.
func FuzzEventJSON(f *testing.F) {
	f.Add("api.example.com", "detail \"q\" <x>", "sni", int64(5), uint16(443))
	f.Add("a<b>", "x&y", "z", int64(0), uint16(1))
	f.Add("\xff\xfe", "\u2028\x7f", "", int64(-1), uint16(0))
	f.Fuzz(func(t *testing.T, host, detail, sni string, n int64, port uint16) {
		e := Event{Schema: EventSchema, Time: time.Unix(n%(1<<33), n%1e9).UTC(), Trial: host, Host: host, Target: detail, Detail: detail,
			SNI: sni, Rule: sni, Profile: detail, ID: host, Port: port, BytesUp: n, BytesDown: -n, Duration: time.Duration(n),
			Decision: Decision(sni), Reason: Reason(host), WouldDeny: Reason(detail), Method: sni, Client: detail}
		want, err := marshalReflect(&e)
		got, gerr := e.AppendJSON(nil)
		if (err == nil) != (gerr == nil) {
			t.Fatalf("errors differ: marshal %v, appender %v", err, gerr)
		}
		if err == nil && !bytes.Equal(got, want) {
			t.Fatalf("AppendJSON\n got %s\nwant %s", got, want)
		}
	})
}

// BenchmarkEventJSON: the appender against encoding/json on the same
// record, one decision record per CONNECT.
func BenchmarkEventJSON(b *testing.B) {
	e := fullEvent(b)
	e.PolicyChange = nil
	b.Run("appender", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			buf, _ = e.AppendJSON(buf[:0])
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			_, _ = marshalReflect(&e)
		}
	})
}
