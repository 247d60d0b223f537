//go:build linux

package proxy

import (
	"fmt"
	"strings"
	"testing"
)

// FuzzPlaceholder: the placeholder in a head line, in any case and with
// any of its bytes percent-encoded, whatever surrounds it, is found.
func FuzzPlaceholder(f *testing.F) {
	f.Add("X-Api-Key: ", "\r\n", uint64(0), uint64(0))
	f.Add("GET /v1?k=%", " HTTP/1.1", uint64(1), uint64(0xffff))
	f.Add("%2", "%", uint64(0xfffffff), uint64(0x5555555))
	f.Fuzz(func(t *testing.T, before, after string, encode, upper uint64) {
		var b strings.Builder
		for i, c := range []byte(GatewayPlaceholder) {
			if upper&(1<<(i%64)) != 0 {
				c = strings.ToUpper(string(c))[0]
			}
			if encode&(1<<(i%64)) != 0 {
				fmt.Fprintf(&b, "%%%02X", c)
			} else {
				b.WriteByte(c)
			}
		}
		line := before + b.String() + after
		if !lineMisplaces(line) {
			t.Fatalf("the placeholder in %q is not found", line)
		}
		if !misplaced([]byte(line), "") {
			t.Fatalf("misplaced misses the placeholder in %q", line)
		}
	})
}
