//go:build linux

package agent

import (
	"strings"
	"testing"

	"github.com/trialnet/trialnet/client"
)

// What a hook sends is kept for the Trial's life and printed in logs:
// refused unless it names a container, bounded and printable.
func TestCheckContainer(t *testing.T) {
	ok := client.Container{ID: "c1", PID: 7, Bundle: "/b", Capabilities: []string{"CAP_KILL"}}
	if err := checkContainer(ok); err != nil {
		t.Fatalf("a plain container: %v", err)
	}
	for name, c := range map[string]client.Container{
		"no id":            {PID: 7},
		"no pid":           {ID: "c1"},
		"long bundle":      {ID: "c1", PID: 7, Bundle: strings.Repeat("b", maxContainerField+1)},
		"escape in id":     {ID: "c1\x1b]0;x\a", PID: 7},
		"newline in a cap": {ID: "c1", PID: 7, Capabilities: []string{"CAP_KILL\n"}},
	} {
		if err := checkContainer(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
