//go:build linux

package agent

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/sandbox"
)

// TrialInfo describes a live Trial.
type TrialInfo struct {
	ID       string `json:"id"`
	Netns    string `json:"netns"`
	Cgroup   string `json:"cgroup"`
	CgroupID uint64 `json:"cgroup_id"`
	ProxyURL string `json:"proxy_url"`
	Strict   bool   `json:"strict"`
	// UnixOpen: made without unix socket confinement; its commands may
	// also make sockets anywhere they may write.
	UnixOpen bool `json:"unix_open,omitempty"`
	// Nested: its commands may make user namespaces and run sandboxes of
	// their own (bwrap); never as uid 0.
	Nested bool `json:"nested,omitempty"`
	// UnixAllow are the pathname unix sockets it may use: a launcher's
	// first command starts the Trial's init, which binds those beneath
	// /tmp, /var/tmp and /dev/shm into the Trial's own.
	UnixAllow []string `json:"unix_allow,omitempty"`
	// Learning: names off Allow are let through and recorded as
	// would_deny. Always written, so no reader takes a learning Trial for
	// an enforcing one.
	Learning bool         `json:"learning"`
	Allow    []AllowEntry `json:"allow"`
	Profiles []string     `json:"profiles,omitempty"`
	// AllowCIDRs are the private ranges the Trial may reach, as the config
	// said when it was created; a reload or restart does not widen them.
	// Absent in records older than the field: then the current ones.
	AllowCIDRs []netip.Prefix `json:"allow_cidrs"`
	// Owner is the process whose Trial this is: an ephemeral agent's, or
	// the caller of an owned create, whose exit ends the Trial.
	Owner *Owner `json:"owner,omitempty"`
	// Denied are entries removed from the live Trial with deny: a reload
	// --reprofile does not bring them back from its profiles.
	Denied  []string       `json:"denied,omitempty"`
	Limits  *config.Limits `json:"limits,omitempty"`
	Created time.Time      `json:"created"`
	// Nonce is the harness's value for this run, signed into its receipt
	// (verify --nonce), so a receipt from another run is not taken for it.
	Nonce string `json:"nonce,omitempty"`
	// Report is where the caller writes this Trial's report (run
	// --report/--report-dir), shown by list; the agent writes nothing there.
	Report string `json:"report,omitempty"`
}

// Attach returns a handle for launching commands into the Trial, from
// any process: with the Trial's own unix and nesting settings, which its
// init and commands are made from when this launch is the first.
func (i TrialInfo) Attach() (*sandbox.Launcher, error) {
	tr, err := sandbox.Attach(i.ID, i.Cgroup, i.Netns)
	if err != nil {
		return nil, err
	}
	tr.Spec.UnixPaths, tr.Spec.UnixOpen, tr.Spec.Nested = i.UnixAllow, i.UnixOpen, i.Nested
	return tr, nil
}

// AllowEntry is one allowlist entry as resolved at create time.
type AllowEntry struct {
	Entry      string `json:"entry"`
	RequireTLS bool   `json:"require_tls,omitempty"`
	Profile    string `json:"profile,omitempty"` // see allow.Entry.Profile
}

// CreateRequest asks for a Trial.
type CreateRequest struct {
	ID         string   `json:"id,omitempty"`
	Allow      []string `json:"allow,omitempty"`
	Profiles   []string `json:"profiles,omitempty"`
	RequireTLS bool     `json:"require_tls,omitempty"`
	Strict     bool     `json:"strict,omitempty"`
	// Learn makes a learning Trial (as does a profile with learn: true).
	Learn  bool           `json:"learn,omitempty"`
	Limits *config.Limits `json:"limits,omitempty"`
	// MaxProcesses overrides the config's limits.max_processes for this
	// Trial's commands (0: the config's).
	MaxProcesses int      `json:"max_processes,omitempty"`
	UnixAllow    []string `json:"unix_allow,omitempty"` // pathname unix sockets the Trial may use
	UnixOpen     bool     `json:"unix_open,omitempty"`  // no unix socket confinement (kernels before 6.7)
	// Nested lets the Trial run sandboxes of its own (as does a profile
	// with nested: true); it needs the BPF LSM layer.
	Nested bool `json:"nested,omitempty"`
	// Owned ties the Trial to the life of the process that asks: the agent
	// destroys it when that process exits, however it ends. The owner is
	// the control socket's peer as the kernel names it, never a field of
	// the request. An ephemeral agent's Trials are its own process's.
	Owned bool `json:"owned,omitempty"`
	// Nonce: see TrialInfo.Nonce; ValidNonce says what it may be.
	Nonce string `json:"nonce,omitempty"`
	// Report: see TrialInfo.Report; an absolute path.
	Report string `json:"report,omitempty"`
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
