//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/trialnet/trialnet/proxy"
)

func cmdProxy(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serveProxy(ctx, args, stdout, stderr, nil)
}

// proxyFlags are the flags shared by every command that builds a proxy
// policy: the allowlist, the config file, resolvers and allowed CIDRs.
type proxyFlags struct {
	allow, profiles, resolvers, cidrs stringList
	config                            string
	requireTLS                        bool
}

func (p *proxyFlags) register(fs *flag.FlagSet) {
	fs.Var(&p.allow, "allow", "allow CONNECT to HOST:PORT, exact or *.suffix (repeatable)")
	fs.Var(&p.profiles, "profile", "allow the hosts of this profile from the config file (repeatable)")
	fs.StringVar(&p.config, "config", "", "YAML config file with profiles, resolvers, allowed CIDRs and limits")
	fs.Var(&p.resolvers, "resolver", "DNS server ADDR[:PORT] for allowed names (repeatable; default: the config's, else /etc/resolv.conf)")
	fs.Var(&p.cidrs, "allow-cidr", "also allow destinations in this private or reserved CIDR (repeatable; never loopback, host or metadata)")
	fs.BoolVar(&p.requireTLS, "require-tls", false, "the first bytes through tunnels to --allow hosts must be a TLS ClientHello naming the host")
}

// proxyPolicy is what the flags and config file resolve to.
type proxyPolicy struct {
	allow  *proxy.Allowlist
	config proxy.Config
}

// build validates everything before anything listens: a bad flag or config
// is a usage error.
func (p *proxyFlags) build() (*proxyPolicy, error) {
	var file *proxy.File
	if p.config != "" {
		f, err := proxy.LoadFile(p.config)
		if err != nil {
			return nil, err
		}
		file = f
	}
	allow, err := file.Allowlist(p.profiles, p.allow, p.requireTLS)
	if err != nil {
		return nil, err
	}
	cfg := proxy.Config{}
	resolvers := []string(p.resolvers)
	if file != nil {
		cfg.AllowCIDRs = file.CIDRs()
		cfg.Limits = file.Limits
		cfg.MaxConnections = file.MaxConnections
		if len(resolvers) == 0 {
			resolvers = file.Resolvers
		}
	}
	for _, c := range p.cidrs {
		pfx, err := proxy.CheckAllowCIDR(c)
		if err != nil {
			return nil, err
		}
		cfg.AllowCIDRs = append(cfg.AllowCIDRs, pfx)
	}
	res, err := proxy.NewDNSResolver(resolvers)
	if err != nil {
		return nil, err
	}
	cfg.Resolver = res
	return &proxyPolicy{allow: allow, config: cfg}, nil
}

// serveProxy runs the standalone proxy until ctx ends. ready, if set, is
// told the listening addresses (tests use port 0).
func serveProxy(ctx context.Context, args []string, stdout, stderr io.Writer, ready func([]net.Addr)) int {
	fs := newFlags("proxy", "proxy [--listen ADDR]... (--allow HOST:PORT | --profile NAME --config FILE)... [--resolver ADDR]... [--allow-cidr CIDR]... [--require-tls] [--trial ID]",
		"trialnet proxy --listen 127.0.0.1:3128 --allow api.anthropic.com:443   # then HTTPS_PROXY=http://127.0.0.1:3128", stderr)
	var listen stringList
	fs.Var(&listen, "listen", "listen on ADDR:PORT (repeatable; default 127.0.0.1:3128)")
	trial := fs.String("trial", "proxy", "the Trial id written in every decision record")
	var pf proxyFlags
	pf.register(fs)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		return fail(stdout, stderr, false, exitUsage, usageError{fmt.Sprintf("proxy: unexpected argument %q", fs.Arg(0))})
	}
	pol, err := pf.build()
	if err != nil {
		return fail(stdout, stderr, false, exitUsage, fmt.Errorf("proxy: %w", err))
	}
	if len(pol.allow.Entries()) == 0 {
		return fail(stdout, stderr, false, exitUsage, usageError{"proxy: nothing is allowed; give --allow HOST:PORT or --profile NAME --config FILE"})
	}
	if len(listen) == 0 {
		listen = stringList{"127.0.0.1:3128"}
	}
	for _, l := range listen {
		if _, err := netip.ParseAddrPort(l); err != nil {
			return fail(stdout, stderr, false, exitUsage, usageError{fmt.Sprintf("proxy: --listen %q: want IP:PORT, such as 127.0.0.1:3128 or [::1]:3128", l)})
		}
	}

	cfg := pol.config
	cfg.Logger = slog.New(slog.NewJSONHandler(stdout, nil))
	p, err := proxy.New(cfg)
	if err != nil {
		return fail(stdout, stderr, false, exitFailure, fmt.Errorf("proxy: %w", err))
	}
	defer p.Close()
	if err := p.AddTrial(proxy.TrialPolicy{ID: *trial, Allow: pol.allow}); err != nil {
		return fail(stdout, stderr, false, exitUsage, err)
	}
	var lns []net.Listener
	for _, l := range listen {
		ln, err := net.Listen("tcp", l)
		if err != nil {
			for _, o := range lns {
				_ = o.Close()
			}
			return fail(stdout, stderr, false, exitFailure, fmt.Errorf("proxy: listen on %s: %w (is another proxy running there?)", l, err))
		}
		lns = append(lns, ln)
	}
	var addrs []net.Addr
	var wg sync.WaitGroup
	errs := make(chan error, len(lns))
	for _, ln := range lns {
		addrs = append(addrs, ln.Addr())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Serve(ln, *trial); err != nil {
				errs <- err
			}
		}()
	}
	var entries []string
	for _, e := range pol.allow.Entries() {
		entries = append(entries, e.String())
	}
	fmt.Fprintf(stderr, "trialnet proxy: listening on %v for Trial %q; allowing %s\n", addrs, *trial, strings.Join(entries, ", "))
	if ready != nil {
		ready(addrs)
	}
	select {
	case <-ctx.Done():
	case err := <-errs:
		return fail(stdout, stderr, false, exitFailure, err)
	}
	_ = p.Close()
	wg.Wait()
	return exitOK
}
