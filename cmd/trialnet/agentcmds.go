//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/internal/procscale"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/internal/termsafe"
	"github.com/trialnet/trialnet/internal/timerslack"
	"github.com/trialnet/trialnet/keeper"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// exitRefused: the agent refused the request (unknown Trial, duplicate id,
// bad allowlist) as opposed to failing.
const exitRefused = 3

// agentCode maps an agent error to an exit code: refusals and failures
// differ, as the issue asks.
func agentCode(err error) int {
	var e *client.Error
	if errors.As(err, &e) && e.Code != client.CodeInternal {
		return exitRefused
	}
	return exitFailure
}

func cmdAgent(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("agent", "agent [--config F] [--resolver ADDR]... [--allow-cidr CIDR]... [--metrics-addr ADDR] [--log-format text|json] [--teardown-on-exit] [--drain-timeout D] [--keeper PATH|off]",
		"sudo trialnet agent --config /etc/trialnet/trialnet.yaml --metrics-addr 127.0.0.1:9464", stderr)
	var cf configFlags
	cf.register(fs, "profiles, resolvers, allowed CIDRs, limits, paths")
	socket := fs.String("socket", "", "control socket (default: the config's paths.socket, else "+client.DefaultSocket+")")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus metrics on ADDR (e.g. 127.0.0.1:9464)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	teardown := fs.Bool("teardown-on-exit", false, "destroy every Trial on SIGTERM/SIGINT (default: leave them enforced for the next agent)")
	drain := fs.Duration("drain-timeout", 0, "after handing over to a new agent, serve open tunnels this long before cutting them (default: the config's drain_timeout, else 15m)")
	keeperSock := fs.String("keeper", "", "the keeper's socket, which holds the listeners across an agent crash (default: beside the control socket, started if none runs); off: none")
	pidFile := fs.String("pid-file", "", "write this agent's pid to F once it serves (health --pid-file checks it)")
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	if *drain < 0 {
		return cli.Fail(stdout, stderr, false, exitUsage, usageError{"agent: --drain-timeout must be positive (e.g. 15m), or left out for the config's drain_timeout"})
	}
	var handler slog.Handler = slog.NewTextHandler(stderr, nil)
	switch *logFormat {
	case "text":
	case "json":
		handler = slog.NewJSONHandler(stderr, nil)
	default:
		return cli.Fail(stdout, stderr, false, exitUsage, usageError{"agent: --log-format is text or json"})
	}
	log := slog.New(handler)
	if err := timerslack.Set(timerslack.Proxy); err != nil {
		log.Info("kept the default timer slack, which only costs CPU per CONNECT", "error", err)
	}
	// Checked before it is read, now and at each reload (TrustConfig),
	// and read by the real path checked.
	var given string
	if cf.path != "" {
		real, err := rootsConfig(cf.path)
		if err != nil {
			return cli.Fail(stdout, stderr, false, exitUsage, fmt.Errorf("agent --config %s: %w", cf.path, err))
		}
		if given, err = rootdir.Unclean(cf.path); err != nil {
			return cli.Fail(stdout, stderr, false, exitUsage, err)
		}
		cf.path = real
	}
	file, cidrs, err := cf.load()
	if err == nil {
		err = pathsRootsAlone(file)
	}
	if err != nil {
		return cli.Fail(stdout, stderr, false, exitUsage, err)
	}
	cfg := agent.AgentConfig{
		Host:       hostConfig(file),
		DataDir:    or(file.Paths.DataDir, agent.DefaultDataDir),
		File:       file,
		Resolvers:  cf.resolvers,
		AllowCIDRs: cidrs,
		Logger:     log,
	}
	for _, d := range [][2]string{{"state_dir", cfg.Host.StateDir}, {"data_dir", cfg.DataDir}} {
		if code, err := madeRootsAlone(d[0], d[1]); err != nil {
			return cli.Fail(stdout, stderr, false, code, err)
		}
	}
	if given != "" {
		// The name given, not the file it led to: a reload after root
		// points a link there at a new file (as config management does)
		// reads the new one.
		cfg.ConfigPath = given
		cfg.TrustConfig = rootsConfig
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP reloads the config file (systemctl reload); without a
	// handler it would end the agent.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// SIGUSR2 starts the executable again (an upgraded build), which takes
	// over by hand-over (systemctl reload).
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	defer signal.Stop(usr2)
	sc := agent.ServeConfig{
		AgentConfig:    cfg,
		Socket:         or(*socket, file.Paths.Socket),
		MetricsAddr:    *metricsAddr,
		TeardownOnExit: *teardown,
		Reload:         hup,
		Upgrade:        usr2,
		DrainTimeout:   *drain,
		PIDFile:        *pidFile,
		// One P while the Trials' load fits on one CPU, as `trialnet
		// proxy` does (internal/procscale, docs/performance.md); from
		// when it serves, so that loading eBPF and adopting Trials keep
		// every P.
		Serving: func() { go procscale.Run(ctx) },
	}
	restarts(&sc, file, *keeperSock)
	err = agent.Serve(ctx, sc)
	if err != nil {
		return cli.Fail(stdout, stderr, false, exitFailure, err)
	}
	return exitOK
}

// restarts fills in how the agent hands over and outlives a crash: the
// drain timeout (flag, else the file's) and the keeper (a socket path;
// "" is the default beside the control socket, started when none runs;
// "off" is none).
func restarts(sc *agent.ServeConfig, file *config.File, keeperSock string) {
	if sc.DrainTimeout == 0 {
		sc.DrainTimeout, _ = file.Drain() // checked when the file was read
	}
	switch keeperSock {
	case "off":
	case "":
		sc.Keeper, sc.SpawnKeeper = keeper.DefaultSocket(or(sc.Socket, client.DefaultSocket)), true
	default:
		sc.Keeper = keeperSock
	}
}

// cmdKeeper holds the agent's listeners (keeper.Run).
func cmdKeeper(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("keeper", "keeper [--socket PATH] [--trials DIR]", "sudo trialnet keeper --socket /run/trialnet/agent.keeper --trials /run/trialnet/trials", stderr)
	sock := fs.String("socket", keeper.DefaultSocket(client.DefaultSocket), "where the agent reaches the keeper")
	trials := fs.String("trials", agent.DefaultStateDir, "the agent's state directory: a Trial's listeners go once its record there does")
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	// The agent's own signals (a ^C in its terminal, a setsid child's
	// hang-up) are not the keeper's: only SIGTERM, or the agent's quit,
	// ends it.
	signal.Ignore(os.Interrupt, syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()
	if err := keeper.Run(ctx, *sock, *trials, slog.New(slog.NewTextHandler(stderr, nil))); err != nil {
		return cli.Fail(stdout, stderr, false, exitFailure, err)
	}
	return exitOK
}

// hostConfig is where the config file puts the host's pieces.
func hostConfig(file *config.File) agent.Config {
	return agent.Config{PinDir: file.Paths.PinDir, NetnsDir: file.Paths.NetnsDir, Parent: file.Paths.CgroupParent,
		StateDir: or(file.Paths.StateDir, agent.DefaultStateDir)}
}

// pathsRootsAlone refuses a config whose paths: lead through, or are,
// a directory anyone but root owns or may write (sticky ones above
// excepted, as for a report): root makes, writes, mounts and removes
// there, and such a user could put a link or their own directory in
// its place (a state directory of records the agent then acts on).
func pathsRootsAlone(file *config.File) error {
	p := file.Paths
	for _, c := range []struct{ key, path string }{{"socket", filepath.Dir(p.Socket)}, {"state_dir", p.StateDir}, {"data_dir", p.DataDir},
		{"pin_dir", p.PinDir}, {"netns_dir", p.NetnsDir}, {"cgroup_parent", p.CgroupParent}} {
		if c.path == "" || c.path == "." {
			continue
		}
		// The directory itself judged as the one a file is made in.
		if err := rootdir.OthersOutOfReach(c.path+"/_", 0, 0); err != nil {
			return usageError{fmt.Sprintf("config paths: %s %s: %v: root makes and writes there; give a directory only root can change", c.key, c.path, err)}
		}
	}
	return nil
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// unixFlags are the pathname unix sockets a Trial may use, or none confined.
func unixFlags(fs *flag.FlagSet) (*stringList, *bool) {
	var allow stringList
	fs.Var(&allow, "unix-allow", "a pathname unix socket the Trial may connect to (repeatable; without the BPF LSM layer only a path only root can change)")
	return &allow, fs.Bool("no-unix-confine", false, "do not confine pathname unix sockets (needed on kernels before 6.7 without the BPF LSM layer)")
}

func noTransparentFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("no-transparent", false, "no transparent mode: no DNS stub in the Trial, and only clients that use the proxy (HTTPS_PROXY) get out (as does a profile with transparent: false)")
}

func nestedFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("nested", false, "let the Trial run sandboxes of its own (bwrap): user namespaces, never as uid 0; needs the BPF LSM layer")
}

// nonceFlag is --nonce. Given, it must be a valid nonce: an empty one
// (a harness's unset variable) would bind nothing, and is refused.
func nonceFlag(fs *flag.FlagSet, usage string) *string {
	n := new(string)
	fs.Func("nonce", usage, func(v string) error {
		if err := agent.ValidNonce(v); err != nil {
			return err
		}
		*n = v
		return nil
	})
	return n
}

const nonceUsage = "the harness's own value for this run (a UUID, say), signed into the Trial's receipt: verify --nonce STR accepts no other run's"

func strictFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("strict", false, "allow only the proxy endpoint on loopback, not all of the Trial's loopback")
}

func cmdCreate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("create", "create [--id ID] [--allow HOST:PORT]... [--profile NAME]... [--learn] [--strict] [--max-procs N] [--unix-allow PATH]... [--no-unix-confine] [--nested] [--no-transparent] [--nonce STR] [-j]",
		"sudo trialnet create --id eval-42 --profile claude --nonce 3f1c9e0a -j", stderr)
	id := fs.String("id", "", "the Trial's id (default: generated)")
	nonce := nonceFlag(fs, nonceUsage)
	var af allowFlags
	af.register(fs, "the agent's config")
	strict := strictFlag(fs)
	learn := learnFlag(fs)
	var procs procsFlag
	procs.register(fs, "limits.max_processes of the agent's config, else "+procsDefault)
	unixAllow, noUnix := unixFlags(fs)
	nested := nestedFlag(fs)
	noTransparent := noTransparentFlag(fs)
	socket := cli.SocketFlag(fs)
	asJSON := jsonFlag(fs)
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	if err := af.check(); err != nil {
		return cli.Fail(stdout, stderr, *asJSON, exitUsage, err)
	}
	info, err := client.NewClient(*socket).Create(ctx, trialspec.Request{ID: *id, Nonce: *nonce, Allow: af.allow, Profiles: af.profiles, RequireTLS: af.requireTLS, Strict: *strict,
		Learn: *learn, MaxProcesses: int(procs), UnixAllow: *unixAllow, UnixOpen: *noUnix, Nested: *nested, NoTransparent: *noTransparent})
	if err != nil {
		return cli.Fail(stdout, stderr, *asJSON, agentCode(err), err)
	}
	if *asJSON {
		cli.PrintJSON(stdout, info)
		return exitOK
	}
	tw := newTable(stdout)
	fmt.Fprintf(tw, "id\t%s\nmode\t%s\nnetns\t%s\ncgroup\t%s\nproxy_url\t%s\n", info.ID, mode(info.Learning), info.Netns, info.Cgroup, info.ProxyURL)
	if info.GatewayURL != "" {
		fmt.Fprintf(tw, "gateway_url\t%s\n", info.GatewayURL)
	}
	_ = tw.Flush()
	return exitOK
}

func cmdExec(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	go warmSignals()
	go warmPidfd()
	fs := cli.NewFlags("exec", "exec --trial ID [--uid N] [--gid N] [--max-procs N] [--workdir DIR] -- CMD [ARGS]",
		"sudo trialnet exec --trial eval-42 -- claude -p 'fix the tests'", stderr)
	id := fs.String("trial", "", "the Trial to run CMD in")
	var user userFlags
	user.register(fs)
	var procs procsFlag
	procs.register(fs, "the Trial's")
	var workdir workdirFlag
	workdir.register(fs)
	socket := cli.SocketFlag(fs)
	// Flags end at CMD (or "--"): everything from CMD on is its own.
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *id == "" || fs.NArg() == 0 {
		fs.Usage()
		return cli.Fail(stdout, stderr, false, exitUsage, usageError{"exec: give --trial ID and a command after --"})
	}
	u, g, err := trialUser(user)
	if err != nil {
		return cli.Fail(stdout, stderr, false, exitUsage, err)
	}
	info, err := client.NewClient(*socket).Get(ctx, *id)
	if err != nil {
		return cli.Fail(stdout, stderr, false, agentCode(err), err)
	}
	sigs, stopSignals := forwardedSignals()
	defer stopSignals()
	var notices heldNotices
	code, err := agent.ExecIn(ctx, info, sandbox.Command{
		Args: fs.Args(), Env: os.Environ(), UID: u, GID: g, MaxProcs: int(procs), Dir: string(workdir),
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Notices: &notices,
	}, sigs)
	notices.say(stderr, true)
	var se *sandbox.StartError
	if errors.As(err, &se) {
		return cli.Fail(stdout, stderr, false, se.Code, err)
	}
	if err != nil {
		fmt.Fprintf(stderr, "trialnet: %v\n", err)
	}
	return code
}

func cmdList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("list", "list [-j]", "sudo trialnet list", stderr)
	socket := cli.SocketFlag(fs)
	asJSON := jsonFlag(fs)
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	list, err := client.NewClient(*socket).List(ctx)
	if err != nil {
		return cli.Fail(stdout, stderr, *asJSON, agentCode(err), err)
	}
	if *asJSON {
		cli.PrintJSON(stdout, list)
		return exitOK
	}
	tw := newTable(stdout)
	fmt.Fprintln(tw, "ID\tMODE\tSTRICT\tALLOW\tCREATED\tREPORT")
	for _, t := range list {
		var allow []string
		for _, e := range t.Allow {
			allow = append(allow, e.Entry)
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\t%s\n", t.ID, mode(t.Learning), t.Strict, strings.Join(allow, ","), t.Created.Format(time.RFC3339), termsafe.String(or(t.Report, "-")))
	}
	_ = tw.Flush()
	return exitOK
}

func cmdStats(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("stats", "stats [--trial ID] [-j] [--watch]", "sudo trialnet stats --trial eval-42 --watch", stderr)
	id := fs.String("trial", "", "one Trial (default: every live Trial)")
	watch := fs.Bool("watch", false, "print again every second until interrupted")
	socket := cli.SocketFlag(fs)
	asJSON := jsonFlag(fs)
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	c := client.NewClient(*socket)
	// On a terminal, --watch redraws in place; elsewhere it appends.
	redraw := *watch && !*asJSON && isTerminal(stdout)
	for {
		ids := []string{*id}
		if *id == "" {
			list, err := c.List(ctx)
			if err != nil {
				return watchEnd(ctx, *watch, stdout, stderr, *asJSON, err)
			}
			ids = ids[:0]
			for _, t := range list {
				ids = append(ids, t.ID)
			}
		}
		var all []client.Stats
		for _, t := range ids {
			st, err := c.Stats(ctx, t)
			if err != nil {
				return watchEnd(ctx, *watch, stdout, stderr, *asJSON, err)
			}
			all = append(all, st)
		}
		if *asJSON {
			if *id != "" {
				cli.PrintJSON(stdout, all[0])
			} else {
				cli.PrintJSON(stdout, all)
			}
		} else {
			var buf bytes.Buffer
			if redraw {
				buf.WriteString("\x1b[H\x1b[2J") // cursor home, clear screen
				fmt.Fprintf(&buf, "every 1s: trialnet stats (%s)   ^C to stop\n\n", time.Now().Format(time.TimeOnly))
			}
			for _, st := range all {
				printStats(&buf, st)
			}
			_, _ = stdout.Write(buf.Bytes())
		}
		if !*watch {
			return exitOK
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(time.Second):
		}
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// watchEnd is how stats ends on err: a ^C that cut a --watch short
// mid-request is the way to stop it, not a failure.
func watchEnd(ctx context.Context, watch bool, stdout, stderr io.Writer, asJSON bool, err error) int {
	if watch && ctx.Err() != nil {
		return exitOK
	}
	return cli.Fail(stdout, stderr, asJSON, agentCode(err), err)
}

func cmdAudit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("audit", "audit (--trial ID | --from FILE) [--profile NAME] [-j]", "sudo trialnet audit --trial eval-42 --profile eval >> /etc/trialnet/profiles.yaml", stderr)
	id := fs.String("trial", "", "the Trial (live or destroyed)")
	from := fs.String("from", "", "read a saved decision log (decisions.jsonl) instead of asking the agent")
	profile := fs.String("profile", "", "print, as YAML config, a profile NAME allowing exactly what the Trial was let through to")
	socket := cli.SocketFlag(fs)
	asJSON := jsonFlag(fs)
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	if (*id == "") == (*from == "") {
		fs.Usage()
		return cli.Fail(stdout, stderr, *asJSON, exitUsage, usageError{"audit: give --trial ID or --from FILE"})
	}
	recs, code, err := auditRecords(ctx, *id, *from, *socket, stderr)
	if err != nil {
		return cli.Fail(stdout, stderr, *asJSON, code, err)
	}
	if *profile != "" {
		return printProfile(stdout, stderr, *asJSON, *profile, recs)
	}
	if *asJSON {
		if recs == nil {
			recs = []record.Event{}
		}
		cli.PrintJSON(stdout, recs)
		return exitOK
	}
	printAudit(stdout, recs)
	return exitOK
}

// printAudit prints decision records, one a line, in aligned columns.
// Every string goes through termsafe: a record holds what a Trial sent.
func printAudit(w io.Writer, recs []record.Event) {
	q := termsafe.String
	tw := newTable(w)
	fmt.Fprintln(tw, "START\tTARGET\tDECISION\tREASON\tRULE\tPROFILE\tDIALED\tUP\tDOWN\tDETAIL")
	for _, r := range recs {
		start := r.Time.Format(time.RFC3339Nano)
		switch r.Decision {
		case record.DecisionPolicyChange:
			fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t\t\t\t\t%s\n", start, "(allowlist)", r.Decision, q(r.Detail))
			continue
		case record.DecisionSuppressed:
			var up, down int64
			if s := r.Suppressed; s != nil {
				up, down = s.BytesUp, s.BytesDown
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t\t\t%d\t%d\t%s\n", start, "(suppressed)", r.Decision, up, down, q(r.Detail)+suppressedReasons(r.Suppressed))
			if s := r.Suppressed; s != nil {
				for _, rt := range s.Reached { // where the summarised requests got to, each named
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\t\t\t\t\t%d requests in this summary, %d would_deny, require_tls %t\n",
						start, q(net.JoinHostPort(rt.Host, strconv.Itoa(int(rt.Port)))), record.DecisionAllow, "(summarised)", rt.Requests, rt.WouldDeny, rt.RequireTLS)
				}
			}
			continue
		}
		if r.WouldDeny != "" {
			r.Detail = strings.TrimSuffix("LEARNING, would_deny "+string(r.WouldDeny)+"; "+r.Detail, "; ")
		}
		dialed := ""
		if r.Dialed.IsValid() {
			dialed = r.Dialed.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", start, q(r.Target), q(string(r.Decision)), q(string(r.Reason)),
			q(r.Rule), q(r.Profile), q(dialed), r.BytesUp, r.BytesDown, q(r.Detail))
	}
	_ = tw.Flush()
}

func cmdDestroy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("destroy", "destroy [-j] ID", "sudo trialnet destroy eval-42", stderr)
	socket := cli.SocketFlag(fs)
	asJSON := jsonFlag(fs)
	if err := cli.ParseInterspersed(fs, args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return cli.Fail(stdout, stderr, *asJSON, exitUsage, usageError{"destroy: give exactly one Trial id"})
	}
	st, err := client.NewClient(*socket).Destroy(ctx, fs.Arg(0))
	if err != nil {
		return cli.Fail(stdout, stderr, *asJSON, agentCode(err), err)
	}
	if *asJSON {
		cli.PrintJSON(stdout, st)
		return exitOK
	}
	printStats(stdout, st)
	return exitOK
}

func cmdReload(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("reload", "reload [--reprofile] [-j]", "sudo trialnet reload --reprofile", stderr)
	reprofile := fs.Bool("reprofile", false, "also give live Trials made from profiles their profiles' new allowlists (explicit --allow entries stay)")
	socket := cli.SocketFlag(fs)
	asJSON := jsonFlag(fs)
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	res, err := client.NewClient(*socket).Reload(ctx, client.ReloadRequest{Reprofile: *reprofile})
	if err != nil {
		return cli.Fail(stdout, stderr, *asJSON, agentCode(err), err)
	}
	if *asJSON {
		cli.PrintJSON(stdout, res)
		return exitOK
	}
	tw := newTable(stdout)
	fmt.Fprintf(tw, "config\t%s\nprofiles\t%s\nreprofiled\t%s\n", res.Config, strings.Join(res.Profiles, ","), strings.Join(res.Reprofiled, ","))
	if res.Note != "" {
		fmt.Fprintf(tw, "note\t%s\n", res.Note)
	}
	_ = tw.Flush()
	return exitOK
}

// healthTimeout bounds how long health waits for an answer: an agent takes
// its socket before it has loaded the eBPF layer and re-adopted its Trials,
// and a connection waits unanswered in the socket's backlog meanwhile.
const healthTimeout = 5 * time.Second

func cmdHealth(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("health", "health [--live] [--timeout D] [--pid-file F] [-j]",
		"sudo trialnet health -j", stderr)
	live := fs.Bool("live", false, "exit 0 whenever the agent answers, ready or not: for a liveness probe, as restarting an agent whose pins are gone would detach the programs it still holds until the next one attaches")
	timeout := fs.Duration("timeout", healthTimeout, "give up when the agent has not answered within this long")
	pidFile := fs.String("pid-file", "", "ready only if the agent answering is the one whose pid is in F (its --pid-file): during a hand-over, a new pod's probe must not be answered by the old agent")
	socket := cli.SocketFlag(fs)
	asJSON := jsonFlag(fs)
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	if *timeout <= 0 {
		fs.Usage()
		return cli.Fail(stdout, stderr, *asJSON, exitUsage, usageError{"health: --timeout must be positive"})
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	c := client.NewClient(*socket)
	h, err := c.Health(ctx)
	if err != nil {
		return cli.Fail(stdout, stderr, *asJSON, exitFailure, err)
	}
	if *pidFile != "" {
		b, rerr := os.ReadFile(*pidFile)
		if want, perr := strconv.Atoi(strings.TrimSpace(string(b))); rerr != nil || perr != nil || want != h.PID {
			h.OK = false
			h.Agent = fmt.Sprintf("another agent: pid %d answers, and %s names %q (%v): this one has not taken over yet", h.PID, *pidFile, strings.TrimSpace(string(b)), errors.Join(rerr, perr))
		}
	}
	if *asJSON {
		cli.PrintJSON(stdout, h)
	} else {
		tw := newTable(stdout)
		fmt.Fprintf(tw, "agent\t%s\nebpf\t%s\ntrials_live\t%d\n", h.Agent, h.EBPF, h.Trials)
		_ = tw.Flush()
		fmt.Fprintln(stdout, h.Layers)
		fmt.Fprintln(stdout, healthVerdict(c.Socket, h))
	}
	if h.OK || *live {
		return exitOK
	}
	return exitFailure
}

// healthVerdict is health's last line: ready, or why not and what to do.
func healthVerdict(socket string, h client.Health) string {
	if h.OK {
		return "the trialnet agent on " + socket + " is ready: its eBPF programs are attached and pinned, and it serves"
	}
	var why []string
	if h.EBPF != "attached" {
		why = append(why, "its eBPF links are not all pinned ("+h.EBPF+"), so enforcement would not outlive it: check that bpffs is mounted at the pin directory, then restart the agent (the programs whose pins are gone detach when it exits; the next agent attaches and pins them again and re-adopts the Trials)")
	}
	if h.Agent != "serving" {
		why = append(why, "it is "+h.Agent)
	}
	return "the trialnet agent on " + socket + " is not ready: " + strings.Join(why, "; ")
}
