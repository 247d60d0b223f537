//go:build linux

package agent

import (
	"fmt"
	"strings"

	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

// TrialInfo describes a live Trial: its description and where it lives.
type TrialInfo struct {
	trialspec.Spec
	Netns    string `json:"netns"`
	Cgroup   string `json:"cgroup"`
	CgroupID uint64 `json:"cgroup_id"`
	ProxyURL string `json:"proxy_url"`
}

// Attach returns a handle for launching commands into the Trial, from
// any process: with the Trial's own unix, nesting and process limit
// rules, which its init and commands are made from when this launch is
// the first.
func (i TrialInfo) Attach() (*sandbox.Launcher, error) {
	tr, err := sandbox.Attach(i.ID, i.Cgroup, i.Netns)
	if err != nil {
		return nil, err
	}
	tr.Spec = i.Spec
	return tr, nil
}

type (
	// CreateRequest asks for a Trial.
	CreateRequest = trialspec.Request
	// AllowEntry is one allowlist entry as resolved at create time.
	AllowEntry = trialspec.AllowEntry
	// Owner is the process whose exit ends an owned Trial.
	Owner = trialspec.Owner
)

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

// Error is an error with a stable code, as the control API returns it.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Error codes.
const (
	CodeBadRequest     = "bad_request"
	CodeBadID          = "bad_id"
	CodeUnknownProfile = "unknown_profile"
	CodeBadAllowlist   = "bad_allowlist"
	CodeDuplicateID    = "duplicate_id"
	CodeUnknownTrial   = "unknown_trial"
	CodeInternal       = "internal"
	CodeNotRoot        = "not_root"
	// CodeHandedOver: the agent handed over to a new process while the
	// call waited, and did nothing of it; Client retries it there.
	CodeHandedOver = "handed_over"
)

func errf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
