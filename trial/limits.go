package trial

// The proxy's per-Trial defaults: what a zero ProxyLimits field means.
const (
	DefaultMaxTunnels   = 256 // concurrent CONNECTs per Trial
	defaultConnectRate  = 50  // CONNECTs per second per Trial, sustained
	defaultConnectBurst = 200 // CONNECTs per Trial in a burst
	// DefaultMaxClientConns bounds a Trial's client connections of every
	// kind (waiting for their head, tunnelling, being refused): room for
	// DefaultMaxTunnels tunnels and as many again, yet 16 such Trials
	// still leave the proxy-wide cap (proxy.Config.MaxConnections) to the others.
	DefaultMaxClientConns = 512
	// defaultMaxPendingHeads bounds a Trial's connections that have not
	// finished their request head; each may wait HeaderTimeout. Real
	// clients send the head at once, so a few dozen is plenty.
	defaultMaxPendingHeads = 64
	// defaultRecordRate and defaultRecordBurst bound the records of
	// requests refused before the CONNECT rate charged them (malformed,
	// rate-limited, over a connection cap, timed out): a real client
	// meets these refusals rarely, a flood meets them at line rate.
	// Records past them are counted in summary records instead.
	defaultRecordRate  = 20
	defaultRecordBurst = 200
	// defaultMaxLogBytes bounds the decision records one Trial writes.
	// Past it, its decisions are only counted in summaries. An ordinary
	// record is a few hundred bytes: 64 MiB holds some 150,000, days of
	// an agent's work.
	defaultMaxLogBytes = 64 << 20
)

// Limits bound what one Trial may use, in two halves: the proxy
// enforces ProxyLimits, the sandbox PoolLimits. In YAML (the config's
// limits:) and JSON both halves are one flat mapping.
type Limits struct {
	ProxyLimits `yaml:",inline"`
	PoolLimits  `yaml:",inline"`
}

// ProxyLimits bound what the proxy lets one Trial do. Zero fields take
// the defaults (WithDefaults). MaxClientConns and MaxPendingHeads are
// charged when a connection is accepted, before the proxy-wide limit, so
// a Trial at its caps never uses up the proxy's connections for the
// other Trials.
type ProxyLimits struct {
	MaxTunnels      int     `yaml:"max_tunnels" json:"max_tunnels"`
	ConnectRate     float64 `yaml:"connects_per_second" json:"connects_per_second"`
	ConnectBurst    int     `yaml:"connect_burst" json:"connect_burst"`
	MaxClientConns  int     `yaml:"max_client_connections" json:"max_client_connections"`
	MaxPendingHeads int     `yaml:"max_pending_heads" json:"max_pending_heads"`
	// RecordRate and RecordBurst bound the decision records (log and
	// journal alike) of requests refused before ConnectRate applies;
	// records of requests it admitted are bounded by it already.
	RecordRate  float64 `yaml:"records_per_second" json:"records_per_second"`
	RecordBurst int     `yaml:"record_burst" json:"record_burst"`
	// MaxLogBytes bounds the bytes of decision records (as JSON lines)
	// that one Trial writes, past which its decisions are only counted,
	// in summaries within a reserve past it, then one last summary (see
	// record.Gate and Bounds.SummaryReserve): the file's size is bounded,
	// not only its rate.
	MaxLogBytes int64 `yaml:"max_log_bytes" json:"max_log_bytes"`
}

// PoolLimits bound the Trial's share of the host's pools; the sandbox
// applies them, and 0 is its default.
type PoolLimits struct {
	// MaxProcesses is the process limit (RLIMIT_NPROC) of each command
	// in the Trial (sandbox.Command.MaxProcs).
	MaxProcesses int `yaml:"max_processes" json:"max_processes,omitempty"`
	// MaxPids and MaxMemory (bytes) bound the Trial's tasks and memory,
	// all its commands together, through the cgroup controllers.
	MaxPids   int64 `yaml:"max_pids" json:"max_pids,omitempty"`
	MaxMemory int64 `yaml:"max_memory" json:"max_memory,omitempty"`
}

// WithDefaults is l with each zero or negative field at its default.
func (l ProxyLimits) WithDefaults() ProxyLimits {
	if l.MaxTunnels <= 0 {
		l.MaxTunnels = DefaultMaxTunnels
	}
	if l.ConnectRate <= 0 {
		l.ConnectRate = defaultConnectRate
	}
	if l.ConnectBurst <= 0 {
		l.ConnectBurst = defaultConnectBurst
	}
	if l.MaxClientConns <= 0 {
		l.MaxClientConns = DefaultMaxClientConns
	}
	if l.MaxPendingHeads <= 0 {
		l.MaxPendingHeads = defaultMaxPendingHeads
	}
	if l.RecordRate <= 0 {
		l.RecordRate = defaultRecordRate
	}
	if l.RecordBurst <= 0 {
		l.RecordBurst = defaultRecordBurst
	}
	if l.MaxLogBytes <= 0 {
		l.MaxLogBytes = defaultMaxLogBytes
	}
	return l
}

// PoolBound is what bounds one pool (PoolLimits' tasks or memory) on a
// host: the sandbox finds it, a Trial's layers report it.
type PoolBound struct {
	Pool    string `json:"pool"`
	Bounded bool   `json:"bounded"`
	Bound   string `json:"bound"`
}

// PoolUse is a Trial's use of one pool: now, at its peak, its bound,
// and how often the bound was met (forks refused at pids.max; OOM kills).
// The sandbox reads it; stats and receipts carry it.
type PoolUse struct {
	Pool    string `json:"pool"`
	Bound   string `json:"bound"`
	Max     int64  `json:"max,omitempty"`
	Current int64  `json:"current"`
	Peak    int64  `json:"peak"`
	Events  int64  `json:"events"` // pids: forks refused at the bound; memory: OOM kills
}
