// Package config is trialnet's configuration: the agent's YAML file
// (profiles, resolvers, allowed CIDRs, host facts, limits, paths and
// retention), the merge of that file with what a command line adds into
// the proxy's settings, and profiles learned from decision records.
package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/guard"
	"github.com/trialnet/trialnet/internal/ident"
	"github.com/trialnet/trialnet/resolve"
	"github.com/trialnet/trialnet/trial"
	"github.com/trialnet/trialnet/upstream"
)

// File is the proxy part of trialnet's YAML configuration: named
// allowlist profiles (one per Harness), resolvers, allowed CIDRs and
// limits. See examples/trialnet.yaml.
type File struct {
	Profiles   map[string]Profile `yaml:"profiles"`
	Resolvers  []string           `yaml:"resolvers"`
	AllowCIDRs []string           `yaml:"allow_cidrs"`
	// HostAddresses and NAT64Prefixes are HostFacts (see there).
	HostAddresses  []string     `yaml:"host_addresses"`
	NAT64Prefixes  []string     `yaml:"nat64_prefixes"`
	Limits         trial.Limits `yaml:"limits"`
	MaxConnections int          `yaml:"max_connections"`
	// Paths and Retention are read by the agent; the proxy ignores them.
	Paths     Paths     `yaml:"paths"`
	Retention Retention `yaml:"retention"`
	// DrainTimeout is how long an agent that handed over to a new one
	// serves its open tunnels before it cuts them (a Go duration, e.g.
	// "15m"); empty: the agent's default.
	DrainTimeout string `yaml:"drain_timeout"`
	// UpstreamProxy is the HTTP proxy allowed connections go out through
	// (docs/upstream.md); absent: they are dialled directly.
	UpstreamProxy upstream.Config `yaml:"upstream_proxy"`
	// Prepared is how many Trial shells (a Trial's network namespace,
	// listeners and pool groups, made ahead) the agent keeps ready for
	// the next creates; absent: DefaultPrepared, 0: none.
	Prepared *int `yaml:"prepared"`

	cidrs []netip.Prefix
	facts guard.HostFacts
}

// DefaultPrepared is how many Trial shells an agent keeps ready when the
// file does not say (prepared); MaxPrepared bounds what it may say: each
// shell holds a network namespace.
const (
	DefaultPrepared = 2
	MaxPrepared     = 16
)

// PreparedShells is how many Trial shells the agent keeps ready.
func (f *File) PreparedShells() int {
	if f == nil || f.Prepared == nil {
		return DefaultPrepared
	}
	return *f.Prepared
}

// Paths are where the agent keeps its pieces; empty means the default.
type Paths struct {
	Socket       string `yaml:"socket"`        // control API socket
	StateDir     string `yaml:"state_dir"`     // live Trials, for re-adoption
	DataDir      string `yaml:"data_dir"`      // final stats and decision logs
	PinDir       string `yaml:"pin_dir"`       // bpffs pins
	NetnsDir     string `yaml:"netns_dir"`     // namespace bind mounts
	CgroupParent string `yaml:"cgroup_parent"` // the cgroup that holds every Trial
}

// Retention says how long the data of destroyed Trials (decision logs
// and final stats) is kept. Both are optional; zero means no such limit.
// A destroyed Trial's data goes when it is older than KeepDays or when it
// is not among the KeepTrials newest; a live Trial's never goes.
type Retention struct {
	KeepDays   int `yaml:"keep_days"`
	KeepTrials int `yaml:"keep_trials"`
}

// Profile is a named allowlist. In YAML it is either a list of
// host:port entries or a mapping with "allow", "require_tls" and
// "learn". A Trial given a learning profile is a learning Trial: names
// off its allowlist are let through and recorded as would_deny.
type Profile struct {
	Allow      []string `yaml:"allow"`
	RequireTLS bool     `yaml:"require_tls"`
	Learn      bool     `yaml:"learn"`
	// Nested: a Trial with this profile may run sandboxes of its own
	// (user namespaces), as --nested asks.
	Nested bool `yaml:"nested"`
	// Transparent: false turns transparent mode off for a Trial with
	// this profile, as --no-transparent does; absent or true: on.
	Transparent *bool `yaml:"transparent"`
	// HostServices are services of the host the Trial reaches as
	// host.trialnet.internal:PORT (docs/upstream.md).
	HostServices []HostService `yaml:"host_services"`
	// Gateway are credential gateway routes (docs/gateway.md); each
	// upstream must be on Allow.
	Gateway []trial.GatewayRoute `yaml:"gateway"`

	list *allow.List
}

// HostService is a profile's host_services entry: a port, and the host
// address the service listens on (default 127.0.0.1).
type HostService struct {
	Port    uint16 `yaml:"port"`
	Address string `yaml:"address"`
}

// UnmarshalYAML refuses unknown keys, which a profile's own decoding
// would not see.
func (h *HostService) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: a host service is a mapping with port and address", n.Line)
	}
	for i := 0; i < len(n.Content); i += 2 {
		if k := n.Content[i].Value; k != "port" && k != "address" {
			return fmt.Errorf("line %d: unknown host service key %q (want port, address)", n.Content[i].Line, k)
		}
	}
	type plain HostService
	return n.Decode((*plain)(h))
}

// defaultHostServiceAddr is where a host service listens when its entry
// names no address.
var defaultHostServiceAddr = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// hostServices checks a profile's host services and returns them with
// their addresses parsed, and the allowlist entries that name them.
func (p Profile) hostServices(profile string) ([]trial.HostService, []string, error) {
	var out []trial.HostService
	var entries []string
	for _, h := range p.HostServices {
		a := defaultHostServiceAddr
		if h.Address != "" {
			var err error
			if a, err = netip.ParseAddr(h.Address); err != nil || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() || a.IsMulticast() {
				return nil, nil, fmt.Errorf("profile %q: host_services: address %q: want the host's own unicast address the service listens on, IPv4 written as IPv4 (for example 127.0.0.1)", profile, h.Address)
			}
		}
		if h.Port == 0 {
			return nil, nil, fmt.Errorf("profile %q: host_services: each entry needs a port in 1-65535", profile)
		}
		if i := slices.IndexFunc(out, func(o trial.HostService) bool { return o.Port == h.Port }); i >= 0 {
			return nil, nil, fmt.Errorf("profile %q: host_services: port %d is listed twice", profile, h.Port)
		}
		out = append(out, trial.HostService{Port: h.Port, Address: a})
		entries = append(entries, fmt.Sprintf("%s:%d", trial.HostServiceName, h.Port))
	}
	return out, entries, nil
}

// UnmarshalYAML accepts both profile forms, refusing unknown keys.
func (p *Profile) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.SequenceNode:
		return n.Decode(&p.Allow)
	case yaml.MappingNode:
		for i := 0; i < len(n.Content); i += 2 {
			if k := n.Content[i].Value; k != "allow" && k != "require_tls" && k != "learn" && k != "nested" && k != "transparent" && k != "host_services" && k != "gateway" {
				return fmt.Errorf("line %d: unknown profile key %q (want allow, require_tls, learn, nested, transparent, host_services, gateway)", n.Content[i].Line, k)
			}
		}
		if err := checkRouteKeys(n); err != nil {
			return err
		}
		type plain Profile
		return n.Decode((*plain)(p))
	}
	return fmt.Errorf("line %d: a profile is a list of host:port entries or a mapping with allow, require_tls, learn, nested and transparent", n.Line)
}

// LoadFile reads and validates a configuration file.
func LoadFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	f, err := ParseFile(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return f, nil
}

// ParseFile parses and validates configuration. Unknown keys, malformed
// or too broad entries, bad CIDRs and bad resolvers are errors: a
// configuration is used whole or not at all.
func ParseFile(data []byte) (*File, error) {
	f := &File{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(f); err != nil && !errors.Is(err, io.EOF) /* empty file: empty configuration */ {
		return nil, err
	}
	// The decoder reads one document: a second one after "---" (limits,
	// upstream_proxy or host_addresses appended to a file) would be
	// dropped without a word, and the agent run without what it says.
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		line := 0
		if err == nil {
			line = more.Line
		}
		return nil, fmt.Errorf("line %d: a second YAML document (after ---), which trialnet would not read: put everything in one document (%v)", line, cmp.Or(err, errors.New("remove the --- line")))
	}
	if err := f.validate(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *File) validate() error {
	for name, p := range f.Profiles {
		if !ident.Valid(name) {
			return fmt.Errorf("profile name %q: use lower-case letters, digits, '-' and '_'", name)
		}
		_, hostEntries, err := p.hostServices(name)
		if err != nil {
			return err
		}
		if len(p.Allow) == 0 && len(hostEntries) == 0 && !p.Learn {
			return fmt.Errorf("profile %q allows nothing; list its host:port entries (or set learn: true to learn them)", name)
		}
		for _, e := range p.Allow {
			if ae, err := allow.ParseEntry(e); err == nil && ae.Name == trial.HostServiceName {
				return fmt.Errorf("profile %q: allow: %q: the host's services are named under host_services, with the address they listen on", name, e)
			}
		}
		l, err := allow.ParseProfile(append(slices.Clone(p.Allow), hostEntries...), p.RequireTLS, name)
		if err != nil {
			return fmt.Errorf("profile %q: %w", name, err)
		}
		p.list = l
		if err := checkRoutes(p.Gateway, l); err != nil {
			return fmt.Errorf("profile %q: %w", name, err)
		}
		f.Profiles[name] = p
	}
	for _, p := range []struct{ key, path string }{{"socket", f.Paths.Socket}, {"state_dir", f.Paths.StateDir}, {"data_dir", f.Paths.DataDir},
		{"pin_dir", f.Paths.PinDir}, {"netns_dir", f.Paths.NetnsDir}, {"cgroup_parent", f.Paths.CgroupParent}} {
		// Relative, it would be resolved against the working directory of
		// whoever starts trialnet: a project a Trial can write, where root
		// would then make and read its state.
		if p.path != "" && !filepath.IsAbs(p.path) {
			return fmt.Errorf("paths: %s: %q is a relative path, which trialnet would resolve against the directory it is started in; give an absolute path", p.key, p.path)
		}
	}
	for _, s := range f.Resolvers {
		if _, err := resolve.ParseServer(s); err != nil {
			return err
		}
	}
	for _, s := range f.AllowCIDRs {
		p, err := guard.CheckAllowCIDR(s)
		if err != nil {
			return err
		}
		f.cidrs = append(f.cidrs, p)
	}
	for _, l := range []struct {
		key  string
		in   []string
		into *[]netip.Prefix
	}{{"host_addresses", f.HostAddresses, &f.facts.Addrs}, {"nat64_prefixes", f.NAT64Prefixes, &f.facts.NAT64}} {
		for _, s := range l.in {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return fmt.Errorf("%s: %q: %v", l.key, s, err)
			}
			*l.into = append(*l.into, p)
		}
	}
	if err := f.facts.Check(); err != nil {
		return err
	}
	if l := f.Limits; l.MaxTunnels < 0 || l.ConnectRate < 0 || l.ConnectBurst < 0 || l.MaxClientConns < 0 || l.MaxPendingHeads < 0 ||
		l.RecordRate < 0 || l.RecordBurst < 0 || l.MaxLogBytes < 0 || l.MaxProcesses < 0 || l.MaxPids < 0 || l.MaxMemory < 0 || f.MaxConnections < 0 {
		return errors.New("limits cannot be negative (0 means the default)")
	}
	// YAML spells them .nan and .inf: a NaN rate never refills its bucket
	// (every CONNECT refused), an infinite one is no bound at all.
	for _, r := range []struct {
		key string
		v   float64
	}{{"connects_per_second", f.Limits.ConnectRate}, {"records_per_second", f.Limits.RecordRate}} {
		if math.IsNaN(r.v) || math.IsInf(r.v, 0) {
			return fmt.Errorf("limits: %s: %v is not a rate; give a finite number of them a second (0 means the default)", r.key, r.v)
		}
	}
	if f.Retention.KeepDays < 0 || f.Retention.KeepTrials < 0 {
		return errors.New("retention: keep_days and keep_trials cannot be negative (0 means no such limit)")
	}
	if p := f.Prepared; p != nil && (*p < 0 || *p > MaxPrepared) {
		return fmt.Errorf("prepared: %d is out of range: give 0 (none) to %d", *p, MaxPrepared)
	}
	if _, err := f.Drain(); err != nil {
		return err
	}
	if _, err := upstream.Parse(f.UpstreamProxy); err != nil {
		return err
	}
	return nil
}

// Drain is DrainTimeout as a duration; 0 when it is not set.
func (f *File) Drain() (time.Duration, error) {
	if f == nil || f.DrainTimeout == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(f.DrainTimeout)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("drain_timeout: %q is not a positive duration (write it like 15m or 90s)", f.DrainTimeout)
	}
	return d, nil
}

// learns reports whether any of the named profiles is a learning one.
// Unknown names are Allowlist's to refuse.
func (f *File) learns(profiles []string) bool {
	if f == nil {
		return false
	}
	return slices.ContainsFunc(profiles, func(n string) bool { return f.Profiles[n].Learn })
}

// nests reports whether any of the named profiles asks for nesting.
func (f *File) nests(profiles []string) bool {
	if f == nil {
		return false
	}
	return slices.ContainsFunc(profiles, func(n string) bool { return f.Profiles[n].Nested })
}

// opaque reports whether any of the named profiles turns transparent
// mode off.
func (f *File) opaque(profiles []string) bool {
	if f == nil {
		return false
	}
	return slices.ContainsFunc(profiles, func(n string) bool {
		t := f.Profiles[n].Transparent
		return t != nil && !*t
	})
}

// cidrList returns the validated allowed cidrList.
func (f *File) cidrList() []netip.Prefix { return slices.Clone(f.cidrs) }

// hostFacts returns the validated host addresses and NAT64 prefixes.
func (f *File) hostFacts() guard.HostFacts {
	return guard.HostFacts{Addrs: slices.Clone(f.facts.Addrs), NAT64: slices.Clone(f.facts.NAT64)}
}

// ProfileNames lists the profiles, sorted.
func (f *File) ProfileNames() []string {
	var out []string
	for n := range f.Profiles {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// ErrUnknownProfile is wrapped by Allowlist for a profile that the
// configuration does not define.
var ErrUnknownProfile = errors.New("unknown profile")

// Allowlist builds a Trial's allowlist from named profiles and explicit
// entries. An unknown profile is an error, never an empty or open list.
// Each entry remembers its profile (Entry.Profile); explicit entries have
// none.
// f may be nil when no configuration file is used.
func (f *File) Allowlist(profiles, entries []string, requireTLS bool) (*allow.List, error) {
	var lists []*allow.List
	for _, name := range profiles {
		var p Profile
		ok := false
		if f != nil {
			p, ok = f.Profiles[name]
		}
		if !ok {
			known := "no config file gives profiles; pass --config FILE"
			if f != nil && len(f.Profiles) > 0 {
				known = "known: " + strings.Join(f.ProfileNames(), ", ")
			}
			return nil, fmt.Errorf("%w %q (%s)", ErrUnknownProfile, name, known)
		}
		lists = append(lists, p.list)
	}
	explicit, err := allow.Parse(entries, requireTLS)
	if err != nil {
		return nil, err
	}
	return allow.Union(append(lists, explicit)...), nil
}

// ProxySettings are the proxy-wide settings: what Proxy.New starts with
// and Proxy.Reconfigure replaces.
type ProxySettings struct {
	// AllowCIDRs lets private, CGNAT, reserved or link-local destinations
	// through (never loopback, unspecified, this host's or metadata
	// addresses). Validate them with guard.CheckAllowCIDR.
	AllowCIDRs []netip.Prefix
	// HostFacts are what the guard cannot learn from this host (see
	// guard.HostFacts); validate them with HostFacts.Check. A
	// reconfiguration changes them for live Trials too: they only say
	// where this host is.
	HostFacts guard.HostFacts
	// Resolver resolves allowed names; nil: the host's resolv.conf
	// servers (a reconfiguration with nil keeps the current one).
	Resolver resolve.Resolver
	// Limits are the per-Trial defaults; zero fields take the defaults.
	// The pool half of the config's limits is the sandbox's (File.Spec).
	Limits trial.ProxyLimits
	// MaxConnections caps client connections, every Trial together (0:
	// the proxy's default). Being proxy-wide, a new cap applies at once
	// to new connections of every Trial; it never closes an admitted one.
	MaxConnections int
	// Upstream is the proxy allowed connections go out through; nil:
	// dialled directly.
	Upstream *upstream.Proxy
}

// ProxySettings merges f (nil: no file) with what its caller adds: the
// allowed CIDRs add to the file's, resolvers given replace the file's,
// and a resolver r given replaces both (an embedder's own).
func (f *File) ProxySettings(cidrs []netip.Prefix, resolvers []string, r resolve.Resolver) (ProxySettings, error) {
	s := ProxySettings{AllowCIDRs: slices.Clone(cidrs), Resolver: r}
	if f != nil {
		s.AllowCIDRs = append(f.cidrList(), cidrs...)
		s.HostFacts = f.hostFacts()
		s.Limits, s.MaxConnections = f.Limits.ProxyLimits, f.MaxConnections
		up, err := upstream.Load(f.UpstreamProxy)
		if err != nil {
			return ProxySettings{}, err
		}
		s.Upstream = up
		if len(resolvers) == 0 {
			resolvers = f.Resolvers
		}
	}
	if s.Resolver == nil {
		dns, err := resolve.NewDNSResolver(resolvers)
		if err != nil {
			return ProxySettings{}, err
		}
		s.Resolver = dns
	}
	return s, nil
}
