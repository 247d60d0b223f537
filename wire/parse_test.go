//go:build linux

package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/tlstest"
	"github.com/trialnet/trialnet/record"
)

func TestParseClientHello(t *testing.T) {
	hello := tlstest.ClientHello(t, "api.example.com")[5:]
	info, err := parseClientHello(hello)
	if err != nil || info.ServerName != "api.example.com" || info.ECH {
		t.Fatalf("%+v %v", info, err)
	}
	// Append an ECH extension and a duplicate server_name.
	withExt := func(ext ...byte) []byte {
		m := append([]byte(nil), hello...)
		m = append(m, ext...)
		l := len(m) - 4
		m[1], m[2], m[3] = byte(l>>16), byte(l>>8), byte(l)
		// The extensions length sits just before the first extension;
		// find it by re-walking the fixed fields.
		off := 4 + 2 + 32
		off += 1 + int(m[off])
		off += 2 + int(binary.BigEndian.Uint16(m[off:]))
		off += 1 + int(m[off])
		el := int(binary.BigEndian.Uint16(m[off:])) + len(ext)
		binary.BigEndian.PutUint16(m[off:], uint16(el))
		return m
	}
	// ECH, its drafts and ESNI: the real name is encrypted in every one.
	for _, code := range [][2]byte{{0xfe, 0x0d}, {0xfe, 0x08}, {0xfe, 0x0a}, {0xfe, 0x0c}, {0xff, 0xce}} {
		if info, err := parseClientHello(withExt(code[0], code[1], 0x00, 0x01, 0x00)); err != nil || !info.ECH {
			t.Fatalf("encrypted hello %x: %+v %v", code, info, err)
		} else if CheckSNI(info, "api.example.com") == nil || record.ReasonOf(CheckSNI(info, "api.example.com")) != record.ReasonTLSECH {
			t.Fatalf("an encrypted ClientHello (%x) passed the name check", code)
		}
	}
	sni := []byte{0x00, 0x00, 0x00, 0x08, 0x00, 0x06, 0x00, 0x00, 0x03, 'x', '.', 'y'}
	if _, err := parseClientHello(withExt(sni...)); err == nil {
		t.Fatal("a duplicate server_name extension was accepted")
	}
	for _, cut := range []int{1, 10, 40, len(hello) / 2, len(hello) - 1} {
		if _, err := parseClientHello(hello[:cut]); err == nil {
			t.Fatalf("truncated at %d accepted", cut)
		}
	}
}

// TestCheckSNI pins which server names pass for a CONNECT host: the host
// in any case; never with a trailing dot, which a front routing by the
// name as sent reads as another name.
func TestCheckSNI(t *testing.T) {
	for sni, want := range map[string]record.Reason{
		"api.example.com":   "",
		"API.Example.COM":   "",
		"api.example.com.":  record.ReasonSNIMismatch,
		"API.EXAMPLE.COM.":  record.ReasonSNIMismatch,
		"api.example.com..": record.ReasonSNIMismatch,
		"other.example.com": record.ReasonSNIMismatch,
		"":                  record.ReasonSNIMissing,
	} {
		err := CheckSNI(ClientHelloInfo{ServerName: sni}, "api.example.com")
		if got := record.ReasonOf(err); got != want || (want == "") != (err == nil) {
			t.Errorf("CheckSNI(%q) = %v, want reason %q", sni, err, want)
		}
	}
}

// TestClassifyStream pins which first bytes make a stream TLS.
func TestClassifyStream(t *testing.T) {
	for _, c := range []struct {
		in   []byte
		want streamKind
	}{
		{nil, StreamUnknown},
		{[]byte("GET / HTTP/1.1"), StreamOther},
		{[]byte{0x13}, StreamOther},
		{[]byte{0x14}, streamTLS},
		{[]byte{0x15, 0x03}, streamTLS},
		{[]byte{0x16}, streamTLS},
		{[]byte{0x17}, streamTLS},
		{[]byte{0x19}, streamTLS},
		{[]byte{0x1a}, StreamOther},
		{[]byte{0x80}, StreamUnknown},
		{[]byte{0x80, 0x2e}, StreamUnknown},
		{[]byte{0x80, 0x2e, 0x01}, StreamSSLv2},
		{[]byte{0x80, 0x2e, 0x02}, StreamOther},
	} {
		if got := ClassifyStream(c.in); got != c.want {
			t.Errorf("classifyStream(%x) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestServerHelloRecords(t *testing.T) {
	hrr, sh := tlstest.ServerHelloRecord(true), tlstest.ServerHelloRecord(false)
	warn := []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x01, 0x70}
	for _, c := range []struct {
		name  string
		in    []byte
		n     int
		retry bool
		err   string // "" none, "more" errNeedMore, else a substring
	}{
		{"ServerHello", sh, len(sh), false, ""},
		{"ServerHello and more", append(append([]byte(nil), sh...), 0x17, 0x03, 0x03), len(sh), false, ""},
		{"HelloRetryRequest", hrr, len(hrr), true, ""},
		{"HelloRetryRequest, then change_cipher_spec", append(append([]byte(nil), hrr...), tlstest.DummyCCS...), len(hrr), true, ""},
		{"HelloRetryRequest in 1-byte records", tlstest.ReRecord(hrr, 1), len(tlstest.ReRecord(hrr, 1)), true, ""},
		{"change_cipher_spec, then ServerHello", append(append([]byte(nil), tlstest.DummyCCS...), sh...), len(tlstest.DummyCCS) + len(sh), false, ""},
		{"warning alert, then ServerHello", append(append([]byte(nil), warn...), sh...), len(warn) + len(sh), false, ""},
		{"half a HelloRetryRequest", hrr[:len(hrr)/2], 0, false, "more"},
		{"fatal alert", []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28}, 0, false, "alert"},
		{"change_cipher_spec inside the ServerHello", append(append(append([]byte(nil), tlstest.ReRecord(sh, 10)[:15]...), tlstest.DummyCCS...), tlstest.ReRecord(sh, 10)[15:]...), 0, false, "change_cipher_spec"},
		{"ClientHello", tlstest.ClientHello(t, "a.test"), 0, false, "not 2"},
		{"not TLS", []byte("HTTP/1.1 400 Bad Request\r\n"), 0, false, "not TLS"},
	} {
		n, retry, err := ServerHelloRecords(c.in)
		switch {
		case c.err == "more" && !errors.Is(err, ErrNeedMore),
			c.err == "" && err != nil,
			c.err != "" && c.err != "more" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want %q", c.name, err, c.err)
		case err == nil && (n != c.n || retry != c.retry):
			t.Errorf("%s: n %d retry %v, want %d %v", c.name, n, retry, c.n, c.retry)
		}
	}
	// A HelloRetryRequest must end its record.
	rec := append(append([]byte(nil), hrr...), 0x00)
	rec[4]++
	if _, _, err := ServerHelloRecords(rec); err == nil || !strings.Contains(err.Error(), "after the HelloRetryRequest") {
		t.Errorf("a HelloRetryRequest with a byte after it in its record: %v", err)
	}
}

func TestParseTargetNormalises(t *testing.T) {
	for in, want := range map[string]string{
		"API.example.com:443":      "api.example.com",
		"api.example.com.:443":     "api.example.com",
		"xn--bcher-kva.example:80": "xn--bcher-kva.example",
		"1e100.net:443":            "1e100.net",
		"127.0.0.1.nip.io:443":     "127.0.0.1.nip.io", // a name: DNS answers are guarded instead
	} {
		got, _, err := parseTarget(in)
		if err != nil || got != want {
			t.Errorf("ParseTarget(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// A name that is not ASCII is refused before it is lower-cased: Go's
// ToLower maps the Kelvin sign (U+212A) to 'k', which made a Host field
// "\u212aey.example.com" agree with the target key.example.com.
func TestNonASCIINameRefused(t *testing.T) {
	for _, n := range []string{"\u212aey.example.com", "api.\u212aey.example", "b\u00fccher.example"} {
		if got, err := NormaliseName(n); err == nil {
			t.Errorf("NormaliseName(%+q) = %q, want a refusal", n, got)
		}
	}
	head := "GET http://key.example.com/ HTTP/1.1\r\nHost: \u212aey.example.com\r\n\r\n"
	if _, err := ParseHTTPHead([]byte(head)); err == nil {
		t.Errorf("a Host field with a Kelvin sign agreed with the target key.example.com")
	}
	if _, err := ParseTransparentHead([]byte("GET / HTTP/1.1\r\nHost: \u212aey.example.com\r\n\r\n"), "key.example.com", 80); err == nil {
		t.Errorf("a transparent Host field with a Kelvin sign agreed with key.example.com")
	}
}

// ReadMore never holds more than MaxHelloBuffer, whatever buffer it is
// given, and grows a small one in steps, not by doubling past the bound.
func TestReadMoreBound(t *testing.T) {
	src := bytes.NewReader(make([]byte, 4*MaxHelloBuffer))
	for _, buf := range [][]byte{nil, make([]byte, 0, 4*MaxHelloBuffer), make([]byte, MaxHelloBuffer-10, 2*MaxHelloBuffer)} {
		var err error
		for err == nil {
			buf, _, err = ReadMore(src, buf)
			if len(buf) > MaxHelloBuffer {
				t.Fatalf("buffered %d bytes (cap %d), bound %d", len(buf), cap(buf), MaxHelloBuffer)
			}
		}
		if !errors.Is(err, ErrHelloBuffer) || len(buf) != MaxHelloBuffer {
			t.Fatalf("ended with %d bytes and %v, want the bound and ErrHelloBuffer", len(buf), err)
		}
	}
}

// TestJoinHello pins how a ClientHello split over records goes on: in
// one record, with the first record's header, after any dummy
// change_cipher_spec kept as it was; a hello in one record already is
// passed as it is, and one too long for a record is refused.
func TestJoinHello(t *testing.T) {
	hello := tlstest.ClientHello(t, "api.example.com")
	for _, n := range []int{1, 7, 100, len(hello) - 6, len(hello)} {
		got, err := JoinHello(tlstest.ReRecord(hello, n))
		if err != nil || !bytes.Equal(got, hello) {
			t.Fatalf("records of %d bytes: %x, %v; want the hello in one record", n, got, err)
		}
	}
	if got, _ := JoinHello(hello); &got[0] != &hello[0] {
		t.Fatal("a hello in one record was copied")
	}
	ccs := []byte{0x14, 0x03, 0x03, 0x00, 0x01, 0x01}
	got, err := JoinHello(append(append([]byte(nil), ccs...), tlstest.ReRecord(hello, 50)...))
	if err != nil || !bytes.Equal(got, append(append([]byte(nil), ccs...), hello...)) {
		t.Fatalf("after a dummy change_cipher_spec: %x, %v", got, err)
	}
	big := []byte{0x16, 0x03, 0x01, 0x40, 0x00}
	big = append(big, make([]byte, 1<<14)...)
	big = append(big, 0x16, 0x03, 0x01, 0x00, 0x01, 0x00)
	if _, err := JoinHello(big); err == nil {
		t.Fatal("a hello over one record's length was joined")
	}
}
