//go:build linux

package sandbox

import (
	"slices"
	"testing"
)

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

// The init takes back each list initArgs gives it, empty ones too: the
// Trial's v1 groups are shown it, and no hidden directory is taken for
// one. Seen red with the --v1 split left out of splitInitArgs (the groups
// were hidden directories, and none were shown).
func TestInitArgsSplitBack(t *testing.T) {
	for _, c := range []struct{ hide, v1, keep []string }{
		{[]string{"/run/trialnet"}, []string{"/sys/fs/cgroup/pids/trialnet/trialnet-1", "/sys/fs/cgroup/memory/trialnet/trialnet-1"}, []string{"/a.sock"}},
		{nil, nil, nil},
		{[]string{"/run/trialnet", "/netns"}, nil, []string{"/a.sock", "/b.sock"}},
	} {
		args := initArgs(true, true, "/netns/x", c.hide, c.v1, c.keep)
		nested, transparent, ns, hide, v1, keep := splitInitArgs(args[1:])
		if !nested || !transparent || ns != "/netns/x" || !slices.Equal(hide, c.hide) || !slices.Equal(v1, c.v1) || !slices.Equal(keep, c.keep) {
			t.Errorf("%q split back into %v %v %q %q %q %q", args, nested, transparent, ns, hide, v1, keep)
		}
	}
}
