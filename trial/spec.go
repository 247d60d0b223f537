// Package trial describes a Trial once: Spec is what a Trial is made
// with, what its record keeps across agents, and what each layer takes
// its part from (the sandbox its unix, nesting and pool rules and the
// BPF policy, the proxy its allowlist, learning, allowed CIDRs and
// limits). Request is what a creator asks for. It imports nothing of
// trialnet's, so every layer, and a client, can share it.
package trial

import (
	"fmt"
	"net/netip"
	"time"
)

// Schema is the version of Spec this build writes.
//
// The rule for reading a Spec another build wrote (Upgrade): one of a
// newer schema is refused, as its keys may mean what this build cannot
// know; an older one is brought to this schema. A key added as optional,
// whose absence means what older builds did, keeps the schema; a key
// that changes meaning or goes raises it, with the conversion in
// Upgrade and a note in UPGRADING.md.
//
// Schema 0 is a description without a "schema" key: the agent's
// TrialInfo that builds before this package kept as "meta" inside the
// sandbox's record. Its keys are Spec's (they were copied from it), so
// it reads as it is; the sandbox takes it from "meta".
const Schema = 1

// Spec is the description of one Trial. Every field but Allow and
// Denied (which an allowlist change or a reprofile replaces) is fixed
// when the Trial is made: a reload or a restart does not change it.
//
// Its JSON keys are also those of the control API's TrialInfo, which
// embeds it: they are an interface, never renamed.
type Spec struct {
	ID string `json:"id"`
	// Strict allows only the proxy endpoints on the Trial's loopback
	// instead of all of it.
	Strict bool `json:"strict"`
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
	// Container is the runtime's id of the container the Trial was made
	// around (trialnet oci-hook, trialnet.io/profile): its cgroup and
	// network namespace are the container's, and the Trial ends with it
	// (Owner is its init process).
	Container string `json:"container,omitempty"`
	// Denied are entries removed from the live Trial with deny: a reload
	// --reprofile does not bring them back from its profiles.
	Denied []string `json:"denied,omitempty"`
	// Limits bound what the Trial may use; nil (records older than them):
	// the defaults in force.
	Limits  *Limits   `json:"limits,omitempty"`
	Created time.Time `json:"created"`
	// Nonce is the harness's value for this run, signed into its receipt
	// (verify --nonce), so a receipt from another run is not taken for it.
	Nonce string `json:"nonce,omitempty"`
	// Report is where the caller writes this Trial's report (run
	// --report/--report-dir), shown by list; the agent writes nothing there.
	Report string `json:"report,omitempty"`
	// Transparent: the Trial has a DNS stub that gives the names its
	// allowlist admits pool addresses, and connections to those on any
	// port reach the proxy's checks without CONNECT. Always written;
	// absent (records older than it): off, as those Trials were made.
	Transparent bool `json:"transparent"`
	// HostServices are the services of the host the Trial reaches as
	// HostServiceName:PORT, each exactly at its address and port; fixed
	// when the Trial is made, from its profiles.
	HostServices []HostService `json:"host_services,omitempty"`
	// Gateway are the credential gateway's routes (docs/gateway.md),
	// from the Trial's profiles: served on its loopback at the gateway
	// endpoint, each with a credential the agent reads from SecretFile.
	// The secret itself is never part of a description. Absent: none.
	Gateway []GatewayRoute `json:"gateway,omitempty"`
	// Schema is the version of this description (the package's Schema).
	Schema int `json:"schema"`
}

// HostServiceName is the name a Trial reaches its host services by: it
// is never looked up in DNS, and only the ports of the Trial's
// HostServices lead anywhere.
const HostServiceName = "host.trialnet.internal"

// HostService is one service of the host a Trial may reach: the port it
// is asked for on HostServiceName, which is also the port it listens on
// at Address.
type HostService struct {
	Port    uint16     `json:"port"`
	Address netip.Addr `json:"address"`
}

// AllowEntry is one allowlist entry as resolved at create time.
type AllowEntry struct {
	Entry      string `json:"entry"`
	RequireTLS bool   `json:"require_tls,omitempty"`
	// Profile is the profile the entry came from; empty for an explicit
	// entry.
	Profile string `json:"profile,omitempty"`
}

// GatewayRoute is one credential gateway route: requests under Path
// on the gateway endpoint go to Upstream (https://host[:port]), the
// rest of their path kept, with Header set from the secret in
// SecretFile ("Bearer <secret>" when Header is authorization).
type GatewayRoute struct {
	Path       string `json:"path" yaml:"path"`
	Upstream   string `json:"upstream" yaml:"upstream"`
	Header     string `json:"header" yaml:"header"`
	SecretFile string `json:"secret_file" yaml:"secret_file"`
}

// Owner is a process, named by its pid and its start time (clock ticks
// after boot, /proc/PID/stat), so that a reused pid is not taken for it.
type Owner struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// Pools are the Trial's pool limits, zero where it has none.
func (s Spec) Pools() PoolLimits {
	if s.Limits == nil {
		return PoolLimits{}
	}
	return s.Limits.PoolLimits
}

// Upgrade brings s, as read from a record, to Schema (the rule is
// Schema's). A Spec of a newer schema is refused.
func (s *Spec) Upgrade() error {
	if s.Schema > Schema {
		return fmt.Errorf("the description of Trial %s is in schema %d, and this trialnet reads up to %d: a newer trialnet made it; run that one, or end the Trial with it", s.ID, s.Schema, Schema)
	}
	s.Schema = Schema
	return nil
}
