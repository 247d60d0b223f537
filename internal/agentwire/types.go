package agentwire

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/trialnet/trialnet/trial"
)

// TrialInfo describes a live Trial: its description and where it lives.
type TrialInfo struct {
	trial.Spec
	Netns    string `json:"netns"`
	Cgroup   string `json:"cgroup"`
	CgroupID uint64 `json:"cgroup_id"`
	ProxyURL string `json:"proxy_url"`
	// GatewayURL is what a Trial with credential gateway routes gets as
	// TRIALNET_GATEWAY: its proxy endpoint, which serves the routes
	// under their paths; empty without routes.
	GatewayURL string `json:"gateway_url,omitempty"`
	// AgentDirs are the directories the agent keeps its own state in, as
	// its config puts them (state, data, receipt key, namespace and bpffs
	// pins): trialnet oci-hook refuses a container that mounts one. Only
	// Get and ContainerTrial fill it.
	AgentDirs []string `json:"agent_dirs,omitempty"`
	// BPFLSM says that the agent's BPF LSM layer is attached, which
	// refuses a Trial's containers the socket families no network
	// namespace holds (AF_VSOCK): without it, trialnet oci-hook asks
	// their seccomp profile to. Only Get and ContainerTrial fill it; an
	// agent from before it leaves it false, and the hook asks.
	BPFLSM bool `json:"bpf_lsm,omitempty"`
}

// Error is an error with a stable code, as the control API returns it.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Stats, with a destroy that failed (a process outlived the kill, the
	// counters could not be read), are the final stats it made all the
	// same: an UNKNOWN or ALARM verdict and its signed receipt, which the
	// error must not hide. Raw: this package links no client types.
	Stats json.RawMessage `json:"stats,omitempty"`
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
	// CodeBadConfig: a reload found the config file unreadable or invalid,
	// or changing what cannot change while the agent runs.
	CodeBadConfig = "bad_config"
)

// AllowChange changes a live Trial's allowlist (PATCH /v1/trials/{id}/allow).
// Entries are parsed and refused exactly as at create. The change applies
// to every CONNECT not yet answered; open tunnels stay unless Cut is set,
// and then only those a removed entry allowed are ended.
type AllowChange struct {
	Add        []string `json:"add,omitempty"`
	Remove     []string `json:"remove,omitempty"`
	RequireTLS bool     `json:"require_tls,omitempty"` // for the added entries
	Cut        bool     `json:"cut,omitempty"`
}

// AllowChanged is the answer to an AllowChange.
type AllowChanged struct {
	Trial      TrialInfo `json:"trial"`
	TunnelsCut int       `json:"tunnels_cut"`
	// Note says what the change does not do: on a learning Trial, a
	// removed name is still let through (as would_deny).
	Note string `json:"note,omitempty"`
}

// ReloadRequest asks the agent to read its config file again.
type ReloadRequest struct {
	// Reprofile also gives every live Trial made from profiles the new
	// allowlist of its profiles (its explicit --allow entries stay).
	Reprofile bool `json:"reprofile,omitempty"`
}

// ReloadResult says what a reload applied.
type ReloadResult struct {
	Config     string   `json:"config"`
	Profiles   []string `json:"profiles"`
	Reprofiled []string `json:"reprofiled"` // Trials whose allowlist was replaced
	// Note says what the reload did not do: the agent this one took over
	// from, still draining, did not confirm a reprofiled Trial's list.
	Note string `json:"note,omitempty"`
}

// Health is what /healthz reports.
type Health struct {
	OK bool `json:"ok"`
	// EBPF is "attached" when every link is pinned and is the loaded
	// program's, else why not.
	EBPF   string `json:"ebpf"`
	Agent  string `json:"agent"` // "serving", or why not
	Trials int    `json:"trials_live"`
	// PID is the answering agent's process: during a hand-over the old
	// or the new one (health --pid-file tells them apart).
	PID int `json:"pid"`
	// Layers are the defences this host gives a Trial; the optional ones
	// (Landlock, BPF LSM) being off does not make the agent unhealthy.
	Layers Layers `json:"layers"`
}

// Layers says which of a Trial's defences this host has active. The
// process boundary's PID namespace, seccomp filter and own session are
// part of the one launch path and always on for the commands trialnet
// starts (not for containers a runtime starts: Containers); the BPF LSM
// layer depends on the kernel.
type Layers struct {
	NetworkNamespace bool `json:"network_namespace"`
	CgroupEBPF       bool `json:"cgroup_ebpf"`
	UnixSocketHooks  bool `json:"unix_socket_hooks"`
	PIDNamespace     bool `json:"pid_namespace"`
	Seccomp          bool `json:"seccomp"`
	OwnSession       bool `json:"own_session"`
	// LandlockABI is the kernel's Landlock ABI (0: none); each command gets
	// a domain of its own, which keeps it from ptrace, pidfd_getfd and
	// /proc/PID/mem of anything outside, and from ABI 6 from signalling it.
	LandlockABI int  `json:"landlock_abi"`
	BPFLSM      bool `json:"bpf_lsm"`
	// BPFLSMMissing says why the BPF LSM layer is not active.
	BPFLSMMissing string `json:"bpf_lsm_missing,omitempty"`
	// Pools say what bounds each Trial's share of the host's tasks and
	// memory here, or why nothing does.
	Pools []trial.PoolBound `json:"pools,omitempty"`
	// Nested: the Trial these layers are reported for may make user
	// namespaces and run sandboxes of its own (its stats say so).
	Nested bool `json:"nested,omitempty"`
	// Transparent: the Trial these layers are reported for has transparent
	// mode (its stats say so): a DNS stub, and its name pool steered to
	// the proxy's checks by sk_lookup.
	Transparent bool `json:"transparent,omitempty"`
	// Containers is how many containers an OCI runtime started in the
	// Trial (trialnet oci-hook let them in). Their process boundary (PID
	// namespace, seccomp, capabilities, session; no Landlock) is the
	// runtime's: trialnet's launcher does not start them. The network
	// layers, BPF LSM and the pool bounds hold them as any Trial process.
	Containers int `json:"containers,omitempty"`
	// Container is the container the Trial was made around (a profile
	// annotation): its network namespace and cgroup are the container's,
	// which trialnet took on as the Trial's; its pool bounds are the
	// runtime's.
	Container string `json:"container,omitempty"`
}

// ContainerLayers says whose each layer is for a Trial's containers.
const ContainerLayers = "PID namespace, seccomp, capabilities and session are the container runtime's (no Landlock), " +
	"checked at start by trialnet oci-hook (no host namespace, no capability that leaves, no key calls); " +
	"network namespace, cgroup eBPF and BPF LSM are trialnet's, and the pool bounds of a Trial made with create"

// AroundContainerLayers says what a Trial made around a container holds
// of its network namespace and cgroup.
const AroundContainerLayers = "network namespace and cgroup are the container's, taken on by trialnet at its start " +
	"(a fresh namespace with only lo, a cgroup where a Trial's is): the network layers are trialnet's on them, and the Trial ends with the container"

// String lists the layers, active ones first.
func (l Layers) String() string {
	on := []string{"network namespace", "cgroup eBPF", "PID namespace", "seccomp", "own session"}
	var off []string
	if l.UnixSocketHooks {
		on = append(on, "unix socket hooks")
	}
	if l.LandlockABI > 0 {
		on = append(on, fmt.Sprintf("Landlock (ABI %d)", l.LandlockABI))
	} else {
		off = append(off, "Landlock (the kernel offers none)")
	}
	if l.BPFLSM {
		on = append(on, "BPF LSM")
	} else {
		off = append(off, "BPF LSM ("+l.BPFLSMMissing+")")
	}
	if l.Nested {
		on = append(on, "nested sandboxes allowed (user namespaces)")
	}
	if l.Transparent {
		on = append(on, "transparent (DNS stub, sk_lookup to the proxy's checks)")
	}
	for _, p := range l.Pools {
		if p.Bounded {
			on = append(on, p.Pool+" bound")
		} else {
			off = append(off, p.Pool+" bound ("+p.Bound+")")
		}
	}
	line := "layers: " + strings.Join(on, ", ")
	if len(off) > 0 {
		line += "; inactive: " + strings.Join(off, "; ")
	}
	if l.Containers > 0 {
		line += fmt.Sprintf("; in its %d container(s): %s", l.Containers, ContainerLayers)
	}
	if l.Container != "" {
		line += fmt.Sprintf("; made around container %s: %s", l.Container, AroundContainerLayers)
	}
	return line
}

// Container is a container an OCI runtime started in a Trial, as
// trialnet oci-hook saw it before letting it start: what the runtime
// gives it of the process boundary, since trialnet's launcher does not
// start it (POST /v1/trials/{id}/containers).
type Container struct {
	ID     string `json:"id"` // the runtime's container id
	PID    int    `json:"pid"`
	Bundle string `json:"bundle"`
	// Seccomp: the runtime installs a seccomp filter of its own.
	Seccomp bool `json:"seccomp"`
	// UserNamespace: the container has a user namespace of its own.
	UserNamespace bool `json:"user_namespace"`
	// Capabilities are its bounding set.
	Capabilities []string `json:"capabilities"`
}

// ContainerTrial asks for a Trial made around a container from a
// profile (trialnet oci-hook, for trialnet.io/profile=NAME): the agent
// takes on the container's network namespace and cgroup as the Trial's,
// and destroys the Trial when the container ends (POST /v1/containers).
type ContainerTrial struct {
	Profile   string    `json:"profile"`
	Container Container `json:"container"`
}

// ContainerPrepare announces a container that will have a Trial made
// around it from Profile (POST /v1/containers/prepare), before its
// runtime creates it: trialnet oci-runtime sends it for a bundle
// annotated trialnet.io/profile=NAME. The agent makes the cgroup at
// CgroupsPath (the bundle's linux.cgroupsPath: a path under the cgroup2
// mount, directly under the Trial parent) with a pending policy entry,
// so that the runtime's init may set the container up where the BPF LSM
// layer is active, and nothing in it reaches anything until the hook
// adopts it for Container (its runtime id).
type ContainerPrepare struct {
	Container   string `json:"container"`
	Profile     string `json:"profile"`
	CgroupsPath string `json:"cgroups_path"`
}

// PreparedContainer is the cgroup prepared for a container, and until
// when its pending entry waits for the hook.
type PreparedContainer struct {
	Cgroup  string    `json:"cgroup"`
	Expires time.Time `json:"expires"`
}

// ContainerEnd is what the agent did when a container ended (DELETE
// /v1/containers/{id}, trialnet oci-hook at poststop), as the hook reads
// it: client.ContainerEnd has the final stats too, which the hook does
// not read (and whose types would link record's into trialnet-oci).
type ContainerEnd struct {
	// Trial is the Trial the container was in ("": none live).
	Trial string `json:"trial,omitempty"`
	// Destroyed: the Trial was made around the container and ended with
	// it. Otherwise the Trial lives on, and the container is no longer
	// listed in it.
	Destroyed bool `json:"destroyed"`
}

// DNSStats are a Trial's DNS stub's counts, as package dnsstub keeps them
// (a dnsstub.Stats converts to it): what each question was answered.
type DNSStats struct {
	Answered    uint64 `json:"answered"`      // an address given
	NoData      uint64 `json:"nodata"`        // an admitted name, a type other than A (AAAA among them)
	NXDomain    uint64 `json:"nxdomain"`      // a name the policy does not admit, or a reverse name
	Refused     uint64 `json:"refused"`       // a class, type or name the stub never answers
	Denied      uint64 `json:"denied"`        // questions for a name the Trial may not resolve, whatever their type: off its allowlist, or no host name (reverse names and the root are not counted)
	FormErr     uint64 `json:"formerr"`       // not one parsable question, or too large
	NotImp      uint64 `json:"notimp"`        // an opcode other than QUERY
	RateLimited uint64 `json:"rate_limited"`  // REFUSED: past the query rate
	PoolFull    uint64 `json:"pool_full"`     // REFUSED: a new name past the pool's bound, or one not recorded
	Dropped     uint64 `json:"dropped"`       // not answered: shorter than a header, or itself a response
	TCPRefused  uint64 `json:"tcp_refused"`   // TCP connections closed on accept: too many open
	TCPTooLarge uint64 `json:"tcp_too_large"` // TCP connections closed: a length prefix too large
	Names       uint64 `json:"names"`         // names with an address (restored ones included)
}
