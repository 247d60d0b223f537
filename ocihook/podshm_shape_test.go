//go:build linux

package ocihook

import (
	"regexp"
	"strings"
	"testing"
)

// The shape checks are plain functions (nothing compiled at start): each
// agrees with the regexp it replaced, on the edges a regexp's reader
// might miss (an empty tail, a newline before the end, a lower-case or
// non-ASCII letter, one character short or long).
func TestShapesMatchTheirRegexps(t *testing.T) {
	hex64 := strings.Repeat("0123456789abcdef", 4)
	for _, c := range []struct {
		re    string
		fn    func(string) bool
		cases []string
	}{
		{`^CAP_[A-Z_]+$`, isCapName, []string{"CAP_SYS_ADMIN", "CAP_", "CAP__", "CAP_X\n", "CAP_X Y", "cap_net_admin", "CAP_NET_ADMİN", "CAP_9", "XCAP_A", "CAP_A\x00", ""}},
		{`^[0-9a-f]{64}$`, isSandboxID, []string{hex64, hex64[1:], hex64 + "0", strings.ToUpper(hex64), hex64[:63] + "\n", hex64[:63] + "g", "", hex64[:32] + " " + hex64[33:]}},
	} {
		re := regexp.MustCompile(c.re)
		for _, s := range c.cases {
			if got, want := c.fn(s), re.MatchString(s); got != want {
				t.Errorf("%s on %q: %v, the regexp says %v", c.re, s, got, want)
			}
		}
	}
}
