//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/internal/procscale"
	"github.com/trialnet/trialnet/internal/tcplisten"
	"github.com/trialnet/trialnet/internal/timerslack"
	"github.com/trialnet/trialnet/proxy"
	"github.com/trialnet/trialnet/record"
)

func cmdProxy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serveProxy(ctx, args, stdout, stderr, nil)
}

// proxyConfig validates the flags and config file into the proxy's
// configuration and the Trial's allowlist, before anything listens.
func proxyConfig(af *allowFlags, cf *configFlags) (*allow.List, proxy.Config, error) {
	file, cidrs, err := cf.load()
	if err != nil {
		return nil, proxy.Config{}, err
	}
	list, err := file.Allowlist(af.profiles, af.allow, af.requireTLS)
	if err != nil {
		return nil, proxy.Config{}, err
	}
	set, err := file.ProxySettings(cidrs, cf.resolvers, nil)
	return list, proxy.Config{ProxySettings: set}, err
}

// checkListen defaults the listening addresses and checks each is an
// IP:PORT.
func checkListen(listen *stringList) error {
	if len(*listen) == 0 {
		*listen = stringList{"127.0.0.1:3128"}
	}
	for _, l := range *listen {
		if _, err := netip.ParseAddrPort(l); err != nil {
			return usageError{fmt.Sprintf("proxy: --listen %q: want IP:PORT, such as 127.0.0.1:3128 or [::1]:3128", l)}
		}
	}
	return nil
}

// recordsTo writes decision records to stdout, one per line as in the
// agent's decisions.jsonl, encoded once, by the proxy's record gate; a
// failure to write is said once on stderr (every later one fails alike).
func recordsTo(stdout, stderr io.Writer) record.Sink {
	out := record.NewWriter(stdout)
	var writeFailed atomic.Bool
	return func(ev *record.Event, line []byte) {
		if err := out.Write(ev, line); err != nil && !writeFailed.Swap(true) {
			fmt.Fprintf(stderr, "trialnet proxy: decision records are not being written to stdout: %v\n", err)
		}
	}
}

// listenAll listens on every address, or on none.
func listenAll(ctx context.Context, listen []string) ([]net.Listener, error) {
	var lns []net.Listener
	for _, l := range listen {
		ln, err := tcplisten.Config().Listen(ctx, "tcp", l)
		if err != nil {
			for _, o := range lns {
				_ = o.Close()
			}
			return nil, fmt.Errorf("proxy: listen on %s: %w (is another proxy running there?)", l, err)
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// serveProxy runs the standalone proxy until ctx ends. ready, if set, is
// told the listening addresses (tests use port 0).
func serveProxy(ctx context.Context, args []string, stdout, stderr io.Writer, ready func([]net.Addr)) int {
	fs := cli.NewFlags("proxy", "proxy [--listen ADDR]... (--allow HOST:PORT | --profile NAME --config FILE)... [--resolver ADDR]... [--allow-cidr CIDR]... [--require-tls] [--trial ID] [--pprof-dir DIR]",
		"trialnet proxy --listen 127.0.0.1:3128 --allow api.anthropic.com:443   # then HTTPS_PROXY=http://127.0.0.1:3128 (http_proxy too for http:// URLs)", stderr)
	var listen stringList
	fs.Var(&listen, "listen", "listen on ADDR:PORT (repeatable; default 127.0.0.1:3128)")
	trial := fs.String("trial", "proxy", "the Trial id written in every decision record")
	pprofDir := fs.String("pprof-dir", "", "write CPU, block and mutex profiles and an execution trace of this run into DIR when it stops (performance work: costs CPU)")
	var af allowFlags
	af.register(fs, "the config file")
	var cf configFlags
	cf.register(fs, "profiles, resolvers, allowed CIDRs and limits")
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	list, cfg, err := proxyConfig(&af, &cf)
	if err != nil {
		return cli.Fail(stdout, stderr, false, exitUsage, fmt.Errorf("proxy: %w", err))
	}
	if len(list.Entries()) == 0 {
		return cli.Fail(stdout, stderr, false, exitUsage, usageError{"proxy: nothing is allowed; give --allow HOST:PORT or --profile NAME --config FILE"})
	}
	if err := noGateway(&af, &cf); err != nil {
		return cli.Fail(stdout, stderr, false, exitUsage, err)
	}
	if err := checkListen(&listen); err != nil {
		return cli.Fail(stdout, stderr, false, exitUsage, err)
	}
	if *pprofDir != "" {
		stopProfiles, err := startProfiles(*pprofDir)
		if err != nil {
			return cli.Fail(stdout, stderr, false, exitFailure, err)
		}
		defer func() {
			if err := stopProfiles(); err != nil {
				fmt.Fprintf(stderr, "trialnet proxy: %v\n", err)
			}
		}()
	}
	// Decision records go to stdout, what goes wrong in serving to stderr.
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	cfg.OnEvent = recordsTo(stdout, stderr)
	if err := timerslack.Set(timerslack.Proxy); err != nil {
		fmt.Fprintf(stderr, "trialnet proxy: kept the default timer slack, which only costs CPU per CONNECT: %v\n", err)
	} else if err := timerslack.SetMonitor(timerslack.Monitor); err != nil {
		fmt.Fprintf(stderr, "trialnet proxy: kept the runtime monitor's timer slack, which only costs CPU per CONNECT: %v\n", err)
	}
	// One P while the load fits on one CPU: see internal/procscale.
	scaleCtx, stopScale := context.WithCancel(ctx)
	defer stopScale()
	go procscale.Run(scaleCtx)
	p, err := proxy.New(cfg)
	if err != nil {
		return cli.Fail(stdout, stderr, false, exitFailure, fmt.Errorf("proxy: %w", err))
	}
	defer p.Close()
	if err := p.AddTrial(proxy.TrialPolicy{Spec: trialspec.Spec{ID: *trial}, Allow: list}); err != nil {
		return cli.Fail(stdout, stderr, false, exitUsage, err)
	}
	lns, err := listenAll(ctx, listen)
	if err != nil {
		return cli.Fail(stdout, stderr, false, exitFailure, err)
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
	fmt.Fprintf(stderr, "trialnet proxy: listening on %v for Trial %q; allowing %s\n", addrs, *trial, strings.Join(allow.Strings(list.Entries()), ", "))
	if ready != nil {
		ready(addrs)
	}
	select {
	case <-ctx.Done():
	case err := <-errs:
		return cli.Fail(stdout, stderr, false, exitFailure, err)
	}
	_ = p.Close()
	wg.Wait()
	return exitOK
}

// noGateway refuses a profile with credential gateway routes: they are
// served to Trials by the agent (run, create), which keeps the secrets
// out of them; a bare proxy has no Trial to keep them from.
func noGateway(af *allowFlags, cf *configFlags) error {
	if cf.path == "" {
		return nil
	}
	f, err := config.LoadFile(cf.path)
	if err != nil {
		return err
	}
	for _, name := range af.profiles {
		if len(f.Profiles[name].Gateway) > 0 {
			return usageError{fmt.Sprintf("proxy: profile %q has credential gateway routes, which only Trials get (trialnet run or create --profile %s); give trialnet proxy a profile without them", name, name)}
		}
	}
	return nil
}
