//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

// ServeConfig is the daemon: an agent, where its control API listens,
// where its metrics are served and what happens to Trials when it stops.
type ServeConfig struct {
	AgentConfig
	Socket      string // control socket; empty: DefaultSocket
	MetricsAddr string // Prometheus metrics on this address; empty: none
	// TeardownOnExit destroys every Trial when ctx ends; otherwise they
	// stay enforced (pinned) for the next agent to re-adopt.
	TeardownOnExit bool
	// Reload: each value received reloads the config file (SIGHUP); a
	// refused reload is logged and changes nothing. nil: none.
	Reload <-chan os.Signal
}

// Serve runs the daemon until ctx ends. The control socket is taken
// first, so that a second agent fails before it touches anything; the
// metrics port next, so that a port in use fails the start before the
// agent loads or adopts anything. Nothing is served until every listener
// is bound and the agent has started.
// AgentOOMScoreAdj is the OOM score adjustment the agent takes: far
// below a Trial's 1000, above the -1000 that would exempt it outright.
const AgentOOMScoreAdj = -900

func Serve(ctx context.Context, cfg ServeConfig) error {
	// Every Trial's proxy lives here: when memory runs out, the OOM
	// killer should end a Trial's processes (1000, set at launch), never
	// the agent. Lowering a score needs CAP_SYS_RESOURCE, which the
	// systemd unit does not give: it sets OOMScoreAdjust instead.
	oomErr := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(AgentOOMScoreAdj)), 0)
	sock := cfg.Socket
	if sock == "" {
		sock = DefaultSocket
	}
	ln, err := ListenSocket(sock)
	if err != nil {
		return err
	}
	defer os.Remove(sock)
	var mln net.Listener
	if cfg.MetricsAddr != "" {
		if mln, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			_ = ln.Close()
			return fmt.Errorf("agent: metrics on %s: %w (is something else serving that port? Pick another --metrics-addr, or leave it out)", cfg.MetricsAddr, err)
		}
	}
	a, err := Start(cfg.AgentConfig)
	if err != nil {
		_ = ln.Close()
		if mln != nil {
			_ = mln.Close()
		}
		return err
	}
	if oomErr != nil {
		a.log.Warn("could not lower the agent's OOM score: the OOM killer may choose it before a Trial (set OOMScoreAdjust in the unit, or give it CAP_SYS_RESOURCE)",
			"oom_score_adj", AgentOOMScoreAdj, "error", oomErr)
	}
	srv := a.Server()
	go a.serveHTTP(srv, ln, "control socket")
	var msrv *http.Server
	if mln != nil {
		msrv = &http.Server{Handler: a.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second}
		go a.serveHTTP(msrv, mln, "metrics")
	}
	a.log.Info("trialnet agent ready", "socket", sock, "trials", len(a.list()), "metrics", cfg.MetricsAddr)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case sig := <-cfg.Reload:
			if _, err := a.Reload(context.Background(), ReloadRequest{}); err != nil {
				a.log.Error("reload", "signal", sig.String(), "error", err)
			}
		}
	}
	a.log.Info("trialnet agent stopping", "teardown", cfg.TeardownOnExit)
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdown)
	if msrv != nil {
		err = errors.Join(err, msrv.Shutdown(shutdown))
	}
	a.Close(cfg.TeardownOnExit)
	if errors.Is(err, context.DeadlineExceeded) {
		// Clients still connected after 5 s: not a failure of the agent.
		err = nil
	}
	return err
}

// serveHTTP serves srv on ln until it is shut down. Any other end leaves
// the agent running without that listener, so it is logged.
func (a *Agent) serveHTTP(srv *http.Server, ln net.Listener, what string) {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		a.log.Error("stopped serving the "+what, "addr", ln.Addr().String(), "error", err)
	}
}
