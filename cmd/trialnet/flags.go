//go:build linux

package main

import (
	"flag"
	"fmt"
	"net/netip"
	"strings"

	"github.com/trialnet/trialnet/proxy"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// configFlags configure a proxy or agent that the command starts itself:
// the config file, resolvers and allowed CIDRs (proxy, agent, run).
type configFlags struct {
	path             string
	resolvers, cidrs stringList
}

func (c *configFlags) register(fs *flag.FlagSet, holds string) {
	fs.StringVar(&c.path, "config", "", "YAML config file: "+holds)
	fs.Var(&c.resolvers, "resolver", "DNS server ADDR[:PORT] for allowed names (repeatable; overrides the config's; default /etc/resolv.conf)")
	fs.Var(&c.cidrs, "allow-cidr", "also allow destinations in this private or reserved CIDR (repeatable; adds to the config's; never loopback, host or metadata)")
}

func (c *configFlags) given() bool {
	return c.path != "" || len(c.resolvers) > 0 || len(c.cidrs) > 0
}

// load reads the config file (an empty configuration without --config)
// and checks the CIDRs: everything is validated before anything starts.
func (c *configFlags) load() (*proxy.File, []netip.Prefix, error) {
	file := &proxy.File{}
	if c.path != "" {
		f, err := proxy.LoadFile(c.path)
		if err != nil {
			return nil, nil, err
		}
		file = f
	}
	var cidrs []netip.Prefix
	for _, s := range c.cidrs {
		p, err := proxy.CheckAllowCIDR(s)
		if err != nil {
			return nil, nil, err
		}
		cidrs = append(cidrs, p)
	}
	return file, cidrs, nil
}

// allowFlags are a Trial's allowlist (proxy, create, run).
type allowFlags struct {
	allow, profiles stringList
	requireTLS      bool
}

func (a *allowFlags) register(fs *flag.FlagSet, profilesFrom string) {
	fs.Var(&a.allow, "allow", "allow CONNECT to HOST:PORT, exact or *.suffix (repeatable)")
	fs.Var(&a.profiles, "profile", "allow the hosts of this profile from "+profilesFrom+" (repeatable)")
	fs.BoolVar(&a.requireTLS, "require-tls", false, "the first bytes through tunnels to --allow hosts must be a TLS ClientHello naming the host")
}

// check parses the entries given on the command line, so that a
// malformed one is a usage error before any agent is asked.
func (a *allowFlags) check() error {
	if _, err := proxy.ParseAllowlist(a.allow, false); err != nil {
		return usageError{fmt.Sprintf("--allow: %v", err)}
	}
	return nil
}
