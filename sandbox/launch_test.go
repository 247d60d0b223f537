//go:build linux

package sandbox

import "testing"

// early.c ends a message with a NUL and the errno; the launcher spells
// the errno as the Go path would.
func TestExecMessage(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"trialnet-exec: bad arguments", "trialnet-exec: bad arguments"},
		{"trialnet-exec: setuid 65534\x001", "trialnet-exec: setuid 65534: operation not permitted"},
		{"exec /bin/x\x0013", "exec /bin/x: permission denied"},
		{"exec /bin/x\x00\x1b[2J", "exec /bin/x: errno ?[2J"},
	} {
		if got := execMessage([]byte(tc.in)); got != tc.want {
			t.Errorf("execMessage(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
