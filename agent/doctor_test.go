//go:build linux

package agent

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// Only 1 lets the agent's upstream connections take ports in TIME_WAIT:
// with the default 2 (loopback only), 96 tunnels opened and closed by one
// Trial in a namespace of 100 ports made another Trial's CONNECT to the
// same address fail, and with 1 it succeeded. The doctor says so.
func TestTWReuseErr(t *testing.T) {
	for _, tc := range []struct {
		v    string
		err  error
		want string // "" when the check passes
	}{
		{"1", nil, ""},
		{"2", nil, "sysctl -w net.ipv4.tcp_tw_reuse=1"},
		{"0", nil, "net.ipv4.tcp_tw_reuse is 0, not 1"},
		{"", os.ErrNotExist, "read net.ipv4.tcp_tw_reuse"},
	} {
		err := twReuseErr(tc.v, tc.err)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("tcp_tw_reuse %q: %v, want none", tc.v, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("tcp_tw_reuse %q, %v: %v, want one saying %q", tc.v, tc.err, err, tc.want)
		}
		if tc.err != nil && !errors.Is(err, tc.err) {
			t.Errorf("tcp_tw_reuse read error %v not kept: %v", tc.err, err)
		}
	}
}
