//go:build linux

package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/guard"
	"github.com/trialnet/trialnet/sandbox"
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
	fs.Var(&c.resolvers, "resolver", "DNS server ADDR[:PORT] for allowed names (repeatable; overrides the config's; default: the config's, else /etc/resolv.conf)")
	fs.Var(&c.cidrs, "allow-cidr", "also allow destinations in this private or reserved CIDR (repeatable; adds to the config's; never loopback, host or metadata)")
}

func (c *configFlags) given() bool {
	return c.path != "" || len(c.resolvers) > 0 || len(c.cidrs) > 0
}

// load reads the config file (an empty configuration without --config)
// and checks the CIDRs: everything is validated before anything starts.
func (c *configFlags) load() (*config.File, []netip.Prefix, error) {
	file := &config.File{}
	if c.path != "" {
		f, err := config.LoadFile(c.path)
		if err != nil {
			return nil, nil, err
		}
		file = f
	}
	var cidrs []netip.Prefix
	for _, s := range c.cidrs {
		p, err := guard.CheckAllowCIDR(s)
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
	if _, err := allow.Parse(a.allow, false); err != nil {
		return usageError{fmt.Sprintf("--allow: %v", err)}
	}
	return nil
}

// idFlag is --uid or --gid, unset until given: the default is decided
// later (trialUser), so the help shows that rather than a sentinel.
type idFlag struct {
	id  uint32
	set bool
}

func (f *idFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return strconv.FormatUint(uint64(f.id), 10)
}

func (f *idFlag) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return errors.New("not a number")
	case v < 0:
		return errors.New("must not be negative")
	case v > 1<<32-2: // 4294967295 is (uid_t)-1, "no change" to the kernel
		return errors.New("must be below 4294967295")
	}
	f.id, f.set = uint32(v), true
	return nil
}

// procsFlag is --max-procs: each Trial command's process limit
// (RLIMIT_NPROC), 0 until given.
type procsFlag int

func (f *procsFlag) String() string {
	if f == nil || *f == 0 {
		return ""
	}
	return strconv.Itoa(int(*f))
}

func (f *procsFlag) Set(s string) error {
	v, err := strconv.Atoi(s)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return errors.New("not a number")
	case v < 1 || v > sandbox.MaxMaxProcs:
		return fmt.Errorf("give 1 to %d", sandbox.MaxMaxProcs)
	}
	*f = procsFlag(v)
	return nil
}

var procsDefault = strconv.Itoa(sandbox.DefaultMaxProcs)

func (f *procsFlag) register(fs *flag.FlagSet, dflt string) {
	fs.Var(f, "max-procs", "limit each process of CMD's uid to `N` processes and threads (RLIMIT_NPROC; counts all of the uid's, so give each Trial its own uid) (default: "+dflt+")")
}

// userFlags say who CMD runs as (run, exec).
type userFlags struct{ uid, gid idFlag }

func (u *userFlags) register(fs *flag.FlagSet) {
	fs.Var(&u.uid, "uid", "run CMD as this user id `N` (default: $SUDO_UID under sudo; required otherwise; never 0: root owns the files that hold Trials in place)")
	fs.Var(&u.gid, "gid", "run CMD with this group id `N` (default: $SUDO_GID under sudo, else the number of the uid, refused where that number is another group, such as 6, disk, which reads raw disks: then pass --gid)")
}

// workdirFlag is --workdir: the directory CMD starts in, in the Trial
// ("" for /).
type workdirFlag string

func (f *workdirFlag) String() string {
	if f == nil {
		return ""
	}
	return string(*f)
}

func (f *workdirFlag) Set(s string) error {
	if !filepath.IsAbs(s) {
		return errors.New("give an absolute path: CMD starts in the Trial, where the caller's directory means nothing")
	}
	*f = workdirFlag(s)
	return nil
}

func (f *workdirFlag) register(fs *flag.FlagSet) {
	fs.Var(f, "workdir", "start CMD in `DIR`, an absolute path, in the Trial (default: /); a FUSE or network file system (NFS, sshfs) holding DIR stays in the Trial's view when CMD is the Trial's first command, where every other one is detached")
}
