package trial

// Request is what a Trial's creator asks for (the control API's
// CreateRequest); config makes a Spec of it (File.Spec).
type Request struct {
	ID         string   `json:"id,omitempty"`
	Allow      []string `json:"allow,omitempty"`
	Profiles   []string `json:"profiles,omitempty"`
	RequireTLS bool     `json:"require_tls,omitempty"`
	Strict     bool     `json:"strict,omitempty"`
	// Learn makes a learning Trial (as does a profile with learn: true).
	Learn bool `json:"learn,omitempty"`
	// Limits replace the config's limits for this Trial.
	Limits *Limits `json:"limits,omitempty"`
	// MaxProcesses overrides the limits' max_processes for this Trial's
	// commands (0: theirs).
	MaxProcesses int      `json:"max_processes,omitempty"`
	UnixAllow    []string `json:"unix_allow,omitempty"` // pathname unix sockets the Trial may use
	UnixOpen     bool     `json:"unix_open,omitempty"`  // no unix socket confinement (kernels before 6.7)
	// Nested lets the Trial run sandboxes of its own (as does a profile
	// with nested: true); it needs the BPF LSM layer.
	Nested bool `json:"nested,omitempty"`
	// NoTransparent turns transparent mode off (as does a profile with
	// transparent: false); it is on by default, also for callers that
	// predate it.
	NoTransparent bool `json:"no_transparent,omitempty"`
	// Owned ties the Trial to the life of the process that asks: the agent
	// destroys it when that process exits, however it ends. The owner is
	// the control socket's peer as the kernel names it, never a field of
	// the request. An ephemeral agent's Trials are its own process's.
	Owned bool `json:"owned,omitempty"`
	// Nonce: see Spec.Nonce; agent.ValidNonce says what it may be.
	Nonce string `json:"nonce,omitempty"`
	// Report: see Spec.Report; an absolute path.
	Report string `json:"report,omitempty"`
}
