package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/trialnet/trialnet/record"
)

// TLS record and handshake constants (RFC 8446).
const (
	recordTypeCCS        = 0x14 // change_cipher_spec, the lowest assigned record type
	recordTypeAlert      = 0x15
	RecordTypeHandshake  = 0x16
	recordTypeAppData    = 0x17
	recordTypeLast       = 0x19 // tls12_cid (RFC 9146); 0x18 is heartbeat (RFC 6520)
	recordHeaderLen      = 5
	alertWarning         = 1
	maxRecordPayload     = 1<<14 + 256 // TLSPlaintext limit plus slack some stacks use
	handshakeClientHello = 1
	handshakeServerHello = 2
	// MaxClientHello bounds a ClientHello or ServerHello message: one
	// full record, some eight times a real ClientHello with post-quantum
	// key shares (about 1.8 KB), and what one tunnel may make the
	// shared proxy hold while a hello is incomplete (see MaxHelloBuffer).
	MaxClientHello = 16 << 10
	extServerName  = 0
	extECH         = 0xfe0d
	sniHostName    = 0
)

// helloRetryRandom is the random of a HelloRetryRequest, a ServerHello
// that asks for a second ClientHello: SHA-256("HelloRetryRequest")
// (RFC 8446, 4.1.3).
var helloRetryRandom = [32]byte{
	0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
	0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
}

// ClientHelloInfo is what the proxy needs from a ClientHello.
type ClientHelloInfo struct {
	ServerName string // the SNI host name as sent
	ECH        bool   // an encrypted_client_hello extension is present
}

// ErrNeedMore means the ClientHello is not complete yet.
var ErrNeedMore = errors.New("need more bytes")

// streamKind is what the first bytes of a tunnel are, as far as the TLS
// check is concerned.
type streamKind int

const (
	StreamOther   streamKind = iota // not TLS: forwarded unless require_tls
	streamTLS                       // a TLS record: must open with a ClientHello
	StreamSSLv2                     // an SSLv2-style ClientHello: refused
	StreamUnknown                   // more bytes are needed to tell
)

// SSLv2HeaderLen is an SSLv2 two-byte record header and the message type.
const SSLv2HeaderLen = 3

// ClassifyStream decides from the first bytes whether a stream is TLS.
// Any assigned TLS record type (20-25: change_cipher_spec, alert,
// handshake, application_data, heartbeat, tls12_cid) makes it TLS, not
// only a handshake record: a client could otherwise send an alert first
// and a fronted ClientHello after it. A first byte with the high bit set
// is an SSLv2 record header when the third byte is the SSLv2 CLIENT-HELLO
// message type; such a hello carries no SNI.
func ClassifyStream(b []byte) streamKind {
	switch {
	case len(b) == 0:
		return StreamUnknown
	case b[0] >= recordTypeCCS && b[0] <= recordTypeLast:
		return streamTLS
	case b[0]&0x80 == 0:
		return StreamOther
	case len(b) < SSLv2HeaderLen:
		return StreamUnknown
	case b[2] == handshakeClientHello:
		return StreamSSLv2
	}
	return StreamOther
}

// recordTypeName names a record type for a refusal's detail.
func recordTypeName(t byte) string {
	switch t {
	case recordTypeCCS:
		return "change_cipher_spec"
	case recordTypeAlert:
		return "alert"
	case RecordTypeHandshake:
		return "handshake"
	case recordTypeAppData:
		return "application_data"
	case 0x18:
		return "heartbeat"
	case recordTypeLast:
		return "tls12_cid"
	}
	return fmt.Sprintf("type %d", t)
}

// MaxHelloBuffer bounds the bytes buffered while a hello is incomplete,
// record headers included: tiny records may double a hello's size, no
// more.
const MaxHelloBuffer = 2 * MaxClientHello

// ErrHelloBuffer is ReadMore's refusal to buffer past MaxHelloBuffer.
var ErrHelloBuffer = errors.New("hello buffer full")

// ReadMore reads once from r onto the end of buf, growing it by at most
// a few KiB at a time and never past MaxHelloBuffer, so that an
// incomplete hello costs the proxy what it sent, not a doubled slice.
func ReadMore(r io.Reader, buf []byte) ([]byte, int, error) {
	if len(buf) >= MaxHelloBuffer {
		return buf, 0, ErrHelloBuffer
	}
	end := min(cap(buf), MaxHelloBuffer) // a caller's larger buffer is not read past the bound
	if end-len(buf) < 1024 && end < MaxHelloBuffer {
		nb := make([]byte, len(buf), min(len(buf)+max(len(buf)/2, 4096), MaxHelloBuffer))
		copy(nb, buf)
		buf, end = nb, cap(nb)
	}
	n, err := r.Read(buf[len(buf):end])
	return buf[:len(buf)+n], n, err
}

// ReadClientHello reads from r, after the bytes already in buf, until buf
// holds a whole ClientHello (possibly spread over several records and TCP
// segments). It returns every byte read, of which the first n are the
// records up to the end of the ClientHello, and the parsed hello. retry
// is for the second ClientHello, after a HelloRetryRequest: the client
// may send a dummy change_cipher_spec before it (RFC 8446, D.4).
func ReadClientHello(r io.Reader, buf []byte, retry bool) ([]byte, int, ClientHelloInfo, error) {
	for {
		msg, n, err := clientHelloRecords(buf, retry)
		if err == nil {
			info, err := parseClientHello(msg)
			return buf, n, info, err
		}
		if !errors.Is(err, ErrNeedMore) {
			return buf, 0, ClientHelloInfo{}, err
		}
		var got int
		var rerr error
		if buf, got, rerr = ReadMore(r, buf); errors.Is(rerr, ErrHelloBuffer) {
			return buf, 0, ClientHelloInfo{}, errors.New("ClientHello too large")
		}
		if got == 0 && rerr != nil {
			return buf, 0, ClientHelloInfo{}, fmt.Errorf("connection ended inside the ClientHello: %w", rerr)
		}
	}
}

// clientHelloRecords reassembles the ClientHello from the handshake
// records at the start of b and returns it and the length of its
// records. Until the ClientHello is complete only non-empty handshake
// records carrying its fragments are accepted (and, with retry, dummy
// change_cipher_spec records before its first fragment): any other
// record (alert, change_cipher_spec, application data, ...) or an empty
// handshake record is a *Denial with ReasonTLSRecordBeforeHello, decided
// as soon as its header arrives. Other errors are malformations.
func clientHelloRecords(b []byte, retry bool) ([]byte, int, error) {
	var skip func(typ byte, payload []byte) bool // nil: a record that is not handshake is refused at its first byte
	if retry {
		skip = isDummyCCS
	}
	msg, n, extra, err := handshakeMessage(b, handshakeClientHello, skip)
	if err == nil && extra > 0 {
		return nil, 0, errors.New("bytes after the ClientHello in its record")
	}
	var other *otherRecord
	if errors.As(err, &other) {
		if other.typ == RecordTypeHandshake {
			return nil, 0, record.Deny(record.ReasonTLSRecordBeforeHello, "an empty TLS handshake record came before the ClientHello was complete")
		}
		return nil, 0, record.Deny(record.ReasonTLSRecordBeforeHello, "a TLS %s record came before the ClientHello was complete", recordTypeName(other.typ))
	}
	return msg, n, err
}

// maxPlaintext is the most one TLS record carries (RFC 8446 5.1).
const maxPlaintext = 1 << 14

// JoinHello rewrites the records at the start of b, up to the end of a
// ClientHello as ReadClientHello measured them, so that the hello travels
// in one handshake record, as TLS stacks send it. A front that reads the
// server name from the first record alone (HAProxy's req.ssl_sni) finds
// none in a hello split over records and takes its default route,
// another tenant's; record boundaries are no part of the handshake's
// transcript, so joining them changes nothing else. Records before the
// first fragment (dummy change_cipher_spec) are kept. b is returned as it
// is when the hello is in one record already; a hello too long for one
// record is refused.
func JoinHello(b []byte) ([]byte, error) {
	var out, msg []byte
	var hdr [3]byte
	frags := 0
	for rest := b; len(rest) >= recordHeaderLen; {
		rec := rest[:min(len(rest), recordHeaderLen+int(binary.BigEndian.Uint16(rest[3:5])))]
		rest = rest[len(rec):]
		if rec[0] != RecordTypeHandshake {
			out = append(out, rec...)
			continue
		}
		if frags == 0 {
			copy(hdr[:], rec)
		}
		frags++
		msg = append(msg, rec[recordHeaderLen:]...)
	}
	if frags <= 1 {
		return b, nil
	}
	if len(msg) > maxPlaintext {
		return nil, fmt.Errorf("a ClientHello of %d bytes does not fit in one TLS record", len(msg))
	}
	out = append(out, hdr[0], hdr[1], hdr[2], byte(len(msg)>>8), byte(len(msg)))
	return append(out, msg...), nil
}

// ServerHelloRecords reassembles the server's first handshake message
// from the records at the start of b, which must be a ServerHello, and
// reports whether it is a HelloRetryRequest. n is the length of the
// records up to the end of the ServerHello. Dummy change_cipher_spec
// records (sent after a HelloRetryRequest, RFC 8446 D.4) and warning
// alerts (some TLS 1.2 servers warn unrecognized_name first) before it
// are passed over. A HelloRetryRequest must end its record: the client
// answers it before the server says more.
func ServerHelloRecords(b []byte) (n int, retry bool, err error) {
	skip := func(typ byte, payload []byte) bool {
		return isDummyCCS(typ, payload) || typ == recordTypeAlert && len(payload) == 2 && payload[0] == alertWarning
	}
	msg, n, extra, err := handshakeMessage(b, handshakeServerHello, skip)
	if err != nil {
		return 0, false, err
	}
	if retry, err = ParseServerHello(msg); err == nil && retry && extra > 0 {
		err = errors.New("bytes after the HelloRetryRequest in its record")
	}
	return n, retry, err
}

// isDummyCCS is the one-byte change_cipher_spec record TLS 1.3 peers
// send for middlebox compatibility.
func isDummyCCS(typ byte, payload []byte) bool {
	return typ == recordTypeCCS && len(payload) == 1 && payload[0] == 1
}

// otherRecord is a record that may not come where a handshake message
// is expected: not a handshake record, or an empty one.
type otherRecord struct{ typ byte }

func (e *otherRecord) Error() string {
	if e.typ == RecordTypeHandshake {
		return "an empty TLS handshake record came before the handshake message was complete"
	}
	return fmt.Sprintf("a TLS %s record came before the handshake message was complete", recordTypeName(e.typ))
}

// handshakeMessage reassembles the first handshake message, which must
// be of type want, from the records at the start of b. Records that skip
// accepts are passed over before its first fragment; any other record
// that is not a non-empty handshake record is an *otherRecord, decided
// as soon as its header arrives. n is the length of the records up to
// the one that completes the message, extra the bytes in that record
// after it.
func handshakeMessage(b []byte, want byte, skip func(typ byte, payload []byte) bool) (msg []byte, n, extra int, err error) {
	for {
		rest := b[n:]
		if len(rest) < 1 {
			return nil, 0, 0, ErrNeedMore
		}
		typ := rest[0]
		if typ < recordTypeCCS || typ > recordTypeLast {
			return nil, 0, 0, fmt.Errorf("record type %d is not TLS", typ)
		}
		if typ != RecordTypeHandshake && (len(msg) > 0 || skip == nil) {
			return nil, 0, 0, &otherRecord{typ}
		}
		if len(rest) < recordHeaderLen {
			return nil, 0, 0, ErrNeedMore
		}
		if rest[1] != 3 {
			return nil, 0, 0, fmt.Errorf("record version %d.%d is not TLS", rest[1], rest[2])
		}
		l := int(binary.BigEndian.Uint16(rest[3:5]))
		if l > maxRecordPayload {
			return nil, 0, 0, fmt.Errorf("record length %d", l)
		}
		if typ != RecordTypeHandshake || l == 0 {
			if len(msg) > 0 || typ == RecordTypeHandshake {
				return nil, 0, 0, &otherRecord{typ}
			}
			if len(rest) < recordHeaderLen+l {
				return nil, 0, 0, ErrNeedMore
			}
			if !skip(typ, rest[recordHeaderLen:recordHeaderLen+l]) {
				return nil, 0, 0, &otherRecord{typ}
			}
			n += recordHeaderLen + l
			continue
		}
		if len(rest) < recordHeaderLen+l {
			return nil, 0, 0, ErrNeedMore
		}
		msg = append(msg, rest[recordHeaderLen:recordHeaderLen+l]...)
		n += recordHeaderLen + l
		if msg[0] != want {
			return nil, 0, 0, fmt.Errorf("handshake message is type %d, not %d", msg[0], want)
		}
		if len(msg) >= 4 {
			ml := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
			if ml > MaxClientHello {
				return nil, 0, 0, fmt.Errorf("handshake message of %d bytes", ml)
			}
			if len(msg) >= 4+ml {
				return msg[:4+ml], n, len(msg) - 4 - ml, nil
			}
		}
	}
}

// ParseServerHello parses a ServerHello handshake message strictly and
// reports whether it is a HelloRetryRequest.
func ParseServerHello(msg []byte) (retry bool, err error) {
	if len(msg) < 4 || msg[0] != handshakeServerHello {
		return false, errors.New("not a ServerHello")
	}
	s := cursor(msg[4:])
	if int(msg[1])<<16|int(msg[2])<<8|int(msg[3]) != len(s) {
		return false, errors.New("ServerHello length mismatch")
	}
	if len(s) < 2+32 {
		return false, errors.New("malformed ServerHello")
	}
	retry = [32]byte(s[2:34]) == helloRetryRandom
	var exts cursor
	if !s.skip(2+32) || !s.vec8(nil, 32) || !s.skip(2+1) {
		return false, errors.New("malformed ServerHello")
	}
	if len(s) == 0 {
		return retry, nil // TLS 1.2 without extensions
	}
	if !s.vec16(&exts) || len(s) != 0 {
		return false, errors.New("malformed ServerHello extensions")
	}
	for len(exts) > 0 {
		var typ uint16
		var data cursor
		if !exts.u16(&typ) || !exts.vec16(&data) {
			return false, errors.New("malformed ServerHello extension")
		}
	}
	return retry, nil
}

// parseClientHello parses a ClientHello handshake message (type and
// length header included) strictly: every length must agree, an
// extension may appear once, and server_name must hold exactly one
// host_name.
func parseClientHello(msg []byte) (ClientHelloInfo, error) {
	var info ClientHelloInfo
	if len(msg) < 4 || msg[0] != handshakeClientHello {
		return info, errors.New("not a ClientHello")
	}
	s := cursor(msg[4:])
	if int(msg[1])<<16|int(msg[2])<<8|int(msg[3]) != len(s) {
		return info, errors.New("ClientHello length mismatch")
	}
	var suites, compression, exts cursor
	if !s.skip(2+32) || !s.vec8(nil, 32) || !s.vec16(&suites) || len(suites) < 2 || len(suites)%2 != 0 ||
		!s.vec8(&compression, 255) || len(compression) < 1 {
		return info, errors.New("malformed ClientHello")
	}
	if len(s) == 0 {
		return info, nil // no extensions: no SNI
	}
	if !s.vec16(&exts) || len(s) != 0 {
		return info, errors.New("malformed ClientHello extensions")
	}
	seen := map[uint16]bool{}
	for len(exts) > 0 {
		var typ uint16
		var data cursor
		if !exts.u16(&typ) || !exts.vec16(&data) {
			return info, errors.New("malformed extension")
		}
		if seen[typ] {
			return info, fmt.Errorf("extension %d appears twice", typ)
		}
		seen[typ] = true
		switch {
		case isEncryptedHello(typ):
			info.ECH = true
		case typ == extServerName:
			name, err := parseSNI(data)
			if err != nil {
				return info, err
			}
			info.ServerName = name
		}
	}
	return info, nil
}

// isEncryptedHello is true of every code point an encrypted ClientHello
// has used: ECH (0xfe0d), its drafts (0xfe08-0xfe0c) and ESNI (0xffce).
// The real server name in any of them cannot be checked.
func isEncryptedHello(typ uint16) bool {
	return typ == extECH || (typ >= 0xfe08 && typ <= 0xfe0c) || typ == 0xffce
}

func parseSNI(data cursor) (string, error) {
	var list cursor
	if !data.vec16(&list) || len(data) != 0 || len(list) == 0 {
		return "", errors.New("malformed server_name extension")
	}
	name := ""
	for len(list) > 0 {
		var typ uint8
		var n cursor
		if !list.u8(&typ) || !list.vec16(&n) {
			return "", errors.New("malformed server_name entry")
		}
		if typ != sniHostName || name != "" || len(n) == 0 {
			return "", errors.New("server_name must hold exactly one host_name")
		}
		name = string(n)
	}
	// A host_name is ASCII (RFC 6066 3): anything else is refused here,
	// so that no other byte reaches a record as the SNI.
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] >= 0x7f {
			return "", fmt.Errorf("server_name %+q is not an ASCII host name", Truncate(name))
		}
	}
	return name, nil
}

// CheckSNI compares the ClientHello's name with the CONNECT host, in any
// case. A name with a trailing dot is refused: RFC 6066 forbids it, so a
// front that routes by name need not read it as the name without one
// (nginx's ssl_preread into a map, HAProxy's req.ssl_sni match it as
// sent and take the default route, another tenant's), and the
// ClientHello goes on as the client sent it.
func CheckSNI(info ClientHelloInfo, host string) error {
	if info.ECH {
		return record.Deny(record.ReasonTLSECH, "the ClientHello is encrypted (ECH), so its real server name cannot be checked against %s", host)
	}
	if info.ServerName == "" {
		return record.Deny(record.ReasonSNIMissing, "the ClientHello names no server; it must name %s", host)
	}
	if strings.HasSuffix(info.ServerName, ".") {
		return record.Deny(record.ReasonSNIMismatch, "the ClientHello names %q, with a trailing dot, which RFC 6066 forbids and a front may route elsewhere than %s; send the name without it", Truncate(info.ServerName), host)
	}
	sni := strings.ToLower(info.ServerName)
	if sni != host {
		return record.Deny(record.ReasonSNIMismatch, "the ClientHello names %q but the tunnel is to %s", Truncate(info.ServerName), host)
	}
	return nil
}

// cursor is a minimal big-endian reader in the style of cryptobyte.
type cursor []byte

func (c *cursor) skip(n int) bool {
	if len(*c) < n {
		return false
	}
	*c = (*c)[n:]
	return true
}

func (c *cursor) u8(v *uint8) bool {
	if len(*c) < 1 {
		return false
	}
	*v = (*c)[0]
	*c = (*c)[1:]
	return true
}

func (c *cursor) u16(v *uint16) bool {
	if len(*c) < 2 {
		return false
	}
	*v = binary.BigEndian.Uint16(*c)
	*c = (*c)[2:]
	return true
}

// vec8 reads a vector with a one-byte length of at most max bytes.
func (c *cursor) vec8(out *cursor, max int) bool {
	var n uint8
	if !c.u8(&n) || int(n) > max || len(*c) < int(n) {
		return false
	}
	if out != nil {
		*out = (*c)[:n]
	}
	*c = (*c)[n:]
	return true
}

func (c *cursor) vec16(out *cursor) bool {
	var n uint16
	if !c.u16(&n) || len(*c) < int(n) {
		return false
	}
	*out = (*c)[:n]
	*c = (*c)[n:]
	return true
}
