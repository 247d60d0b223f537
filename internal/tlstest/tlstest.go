// Package tlstest builds the TLS records that the parser and proxy
// tests feed in: a real ClientHello from crypto/tls, a ServerHello or
// HelloRetryRequest, and the same handshake re-split into records.
package tlstest

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"testing"
)

// helloRetryRandom is RFC 8446's ServerHello.random of a
// HelloRetryRequest, spelled out here rather than taken from the parser
// under test.
var helloRetryRandom = [32]byte{
	0xCF, 0x21, 0xAD, 0x74, 0xE5, 0x9A, 0x61, 0x11, 0xBE, 0x1D, 0x8C, 0x02, 0x1E, 0x65, 0xB8, 0x91,
	0xC2, 0xA2, 0x11, 0x16, 0x7A, 0xBB, 0x8C, 0x5E, 0x07, 0x9E, 0x09, 0xE2, 0xC8, 0xA8, 0x33, 0x9C,
}

// ClientHello is the first record crypto/tls sends for sni.
func ClientHello(t testing.TB, sni string) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		_ = tls.Client(a, &tls.Config{ServerName: sni}).Handshake()
	}()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	_ = b.Close()
	return append(hdr, body...)
}

// ReRecord splits a single-record handshake into records of at most n
// payload bytes each.
func ReRecord(rec []byte, n int) []byte {
	var out []byte
	payload := rec[5:]
	for len(payload) > 0 {
		k := min(n, len(payload))
		out = append(out, rec[0], rec[1], rec[2], byte(k>>8), byte(k))
		out = append(out, payload[:k]...)
		payload = payload[k:]
	}
	return out
}

// ServerHelloRecord is a TLS 1.3 ServerHello record, or a
// HelloRetryRequest asking for secp256r1 when hrr is set.
func ServerHelloRecord(hrr bool) []byte {
	random := make([]byte, 32)
	random[0] = 1
	exts := []byte{0x00, 0x2b, 0x00, 0x02, 0x03, 0x04} // supported_versions: TLS 1.3
	if hrr {
		copy(random, helloRetryRandom[:])
		exts = append(exts, 0x00, 0x33, 0x00, 0x02, 0x00, 0x17) // key_share: secp256r1
	}
	body := append([]byte{0x03, 0x03}, random...)
	body = append(body, 0x00, 0x13, 0x01, 0x00, byte(len(exts)>>8), byte(len(exts)))
	body = append(body, exts...)
	msg := append([]byte{2, 0, byte(len(body) >> 8), byte(len(body))}, body...)        // 2: server_hello
	return append([]byte{22, 0x03, 0x03, byte(len(msg) >> 8), byte(len(msg))}, msg...) // 22: handshake
}

// DummyCCS is the change_cipher_spec record a TLS 1.3 client may send
// for middlebox compatibility.
var DummyCCS = []byte{20, 0x03, 0x03, 0x00, 0x01, 0x01}
