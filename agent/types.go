//go:build linux

package agent

import (
	"fmt"
	"strings"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/sandbox"
)

// Attach returns a handle for launching commands into the Trial info
// describes, from any process: with the Trial's own unix, nesting and
// process limit rules, which its init and commands are made from when
// this launch is the first. A Trial made around a container is its
// runtime's to launch into.
func Attach(info client.TrialInfo) (*sandbox.Launcher, error) {
	if info.Container != "" {
		// Its cgroup holds the container's init, which a launch would
		// take for the Trial's and join.
		return nil, fmt.Errorf("the Trial %s was made around container %s: run commands in it with its runtime (podman exec, runc exec), which keeps them in the container", info.ID, info.Container)
	}
	tr, err := sandbox.Attach(info.ID, info.Cgroup, info.Netns)
	if err != nil {
		return nil, err
	}
	tr.Spec = info.Spec
	return tr, nil
}

// maxNonce is the longest nonce a Trial takes.
const maxNonce = 256

// ValidNonce checks a run's nonce: 1 to maxNonce printable ASCII
// characters, no spaces, so that it reads the same wherever it is shown.
func ValidNonce(n string) error {
	if len(n) == 0 || len(n) > maxNonce || strings.ContainsFunc(n, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		return fmt.Errorf("invalid nonce: use 1-%d printable ASCII characters without spaces (for example a UUID or 32 hex digits from the harness)", maxNonce)
	}
	return nil
}

// errf is the control API's error with code.
func errf(code, format string, args ...any) *client.Error {
	return &client.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
