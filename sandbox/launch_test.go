//go:build linux

package sandbox

import "testing"

// early.c ends a message with a NUL and the errno (and the init's set-up
// may add a NUL and more text); the launcher spells the errno as the Go
// path would.
func TestExecMessage(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"trialnet-exec: bad arguments", "trialnet-exec: bad arguments"},
		{"trialnet-exec: setuid 65534\x001", "trialnet-exec: setuid 65534: operation not permitted"},
		{"exec /bin/x\x0013", "exec /bin/x: permission denied"},
		{"exec /bin/x\x00\x1b[2J", "exec /bin/x: errno ?[2J"},
		// The init's set-up: the rest of the Go error's text after the errno.
		{"trialnet-init: hide /x (why)\x001\x00; more", "trialnet-init: hide /x (why): operation not permitted; more"},
	} {
		if got := execMessage([]byte(tc.in)); got != tc.want {
			t.Errorf("execMessage(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
