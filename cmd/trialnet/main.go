//go:build linux

// Command trialnet runs programs in Trials: network sandboxes whose only
// way out is an allowlisting proxy, enforced by namespaces and eBPF.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/termsafe"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
)

// Exit codes of trialnet itself; a command run in a Trial passes its own.
const (
	exitOK      = 0
	exitUsage   = 2   // bad flags or arguments
	exitFailure = 125 // trialnet refused or failed before or around CMD
	exitTimeout = 124 // --timeout expired; everything in the Trial was killed
)

func main() {
	sandbox.Init()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

var commands = []struct {
	name, summary string
	fn            func(args []string, stdout, stderr io.Writer) int
}{
	{"doctor", "check what this kernel offers trialnet", cmdDoctor},
	{"run", "run a command in an ephemeral Trial (through the agent, or an embedded one)", cmdRun},
	{"agent", "run the host agent (the daemon behind create, exec, stats, ...)", cmdAgent},
	{"create", "create a long-lived Trial", cmdCreate},
	{"exec", "run a command in a Trial", cmdExec},
	{"list", "list live Trials", cmdList},
	{"stats", "show a Trial's kernel and proxy counters and the egress verdict", cmdStats},
	{"audit", "show a Trial's decision log, or the profile it used (--profile)", cmdAudit},
	{"allow", "add entries to a live Trial's allowlist", cmdAllow},
	{"deny", "remove entries from a live Trial's allowlist (--cut ends their open tunnels)", cmdDeny},
	{"reload", "make the agent re-read its config file (all or nothing; SIGHUP does the same)", cmdReload},
	{"health", "ask the running agent whether it is ready: enforcing (eBPF attached and pinned) and serving", cmdHealth},
	{"destroy", "destroy a Trial (its stats and log stay in /var/lib/trialnet)", cmdDestroy},
	{"verify", "check a Trial's signed receipt against this host's key", cmdVerify},
	{"proxy", "run the allowlisting CONNECT proxy on its own", cmdProxy},
	{"uninstall", "detach trialnet's eBPF programs and remove its pins", cmdUninstall},
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printHelp(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.fn(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "trialnet: unknown command %q; 'trialnet help' lists the commands\n", args[0])
	return exitUsage
}

func printHelp(w io.Writer) {
	fmt.Fprintln(w, "trialnet: run untrusted programs in Trials whose only way out is an allowlisting proxy.")
	fmt.Fprintln(w, "\nUsage: trialnet COMMAND [flags]\n\nCommands:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\n'trialnet COMMAND -h' shows a command's flags and an example.")
}

func newFlags(name, usage, example string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: trialnet %s\n\n", usage)
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\nExample:\n  %s\n", example)
	}
	return fs
}

func jsonFlag(fs *flag.FlagSet) *bool {
	j := new(bool)
	fs.BoolVar(j, "j", false, "print JSON")
	fs.BoolVar(j, "json", false, "print JSON")
	return j
}

// printJSON writes v as json.Encoder does, one line, with what a terminal
// could act on escaped (termsafe.JSON): the JSON holds the same values.
func printJSON(w io.Writer, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	_, _ = w.Write(append(termsafe.JSON(b), '\n'))
}

// fail reports err once, as JSON under -j (bpftool's convention) or as a
// line on stderr, and returns the exit code.
func fail(stdout, stderr io.Writer, asJSON bool, code int, err error) int {
	if asJSON {
		printJSON(stdout, map[string]string{"error": err.Error()})
	} else {
		fmt.Fprintf(stderr, "trialnet: %v\n", err)
	}
	return code
}

func cmdDoctor(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("doctor", "doctor [-j]", "sudo trialnet doctor", stderr)
	asJSON := jsonFlag(fs)
	if err := parseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	checks := agent.Doctor()
	bad := bpf.CanEnforce(checks)
	if *asJSON {
		type row struct {
			Check    string `json:"check"`
			OK       bool   `json:"ok"`
			Required bool   `json:"required"`
			Error    string `json:"error,omitempty"`
		}
		out := struct {
			Checks     []row `json:"checks"`
			CanEnforce bool  `json:"can_enforce"`
		}{CanEnforce: bad == nil}
		for _, c := range checks {
			r := row{Check: c.Name, OK: c.Err == nil, Required: c.Required}
			if c.Err != nil {
				r.Error = c.Err.Error()
			}
			out.Checks = append(out.Checks, r)
		}
		printJSON(stdout, out)
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, c := range checks {
			state, detail := "ok", ""
			if c.Err != nil {
				state, detail = "missing", c.Err.Error()
				if !c.Required {
					state = "missing (optional)"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, state, detail)
		}
		_ = tw.Flush()
		switch {
		case bad != nil:
			fmt.Fprintln(stdout, "trialnet cannot enforce a Trial on this machine.")
		case slices.ContainsFunc(checks, func(c bpf.Check) bool { return c.Name == agent.UnixConfineCheck && c.Err != nil }):
			fmt.Fprintln(stdout, "trialnet can enforce Trials on this machine, but cannot confine their unix sockets: run them with --no-unix-confine.")
		default:
			fmt.Fprintln(stdout, "trialnet can enforce Trials on this machine.")
		}
	}
	if bad != nil {
		return exitFailure
	}
	return exitOK
}

func cmdUninstall(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("uninstall", "uninstall [--config F] [--force]", "sudo trialnet uninstall --config /etc/trialnet/trialnet.yaml --force", stderr)
	configPath := fs.String("config", "", "the agent's YAML config file, whose paths: (cgroup parent, pins, namespaces, state) are the ones to remove")
	force := fs.Bool("force", false, "uninstall even while Trials are live, destroying them first (their processes are killed)")
	if err := parseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	file := &config.File{}
	if *configPath != "" {
		f, err := config.LoadFile(*configPath)
		if err != nil {
			return fail(stdout, stderr, false, exitUsage, err)
		}
		file = f
	}
	cfg := hostConfig(file)
	if err := agent.Uninstall(cfg, *force); err != nil {
		return fail(stdout, stderr, false, exitFailure, err)
	}
	fmt.Fprintf(stdout, "removed trialnet's pins from %s; its eBPF programs are detached\n", or(cfg.PinDir, bpf.DefaultPinDir))
	return exitOK
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("run", "run [--allow HOST:PORT]... [--profile NAME]... [--learn] [--config F] [--resolver ADDR]... [--allow-cidr CIDR]... [--strict] [--uid N] [--gid N] [--max-procs N] [--timeout D] [--unix-allow PATH]... [--no-unix-confine] [--nested] [--show-refusals] [--report FILE | --report-fd N] [-v] [-j] -- CMD [ARGS]",
		"sudo trialnet run --allow api.anthropic.com:443 --timeout 30m -- claude -p 'fix the failing test'", stderr)
	var af allowFlags
	af.register(fs, "the config")
	strict := strictFlag(fs)
	learn := learnFlag(fs)
	var cf configFlags
	cf.register(fs, "profiles, resolvers, allowed CIDRs and limits (for the agent run embeds when none is running)")
	var user userFlags
	user.register(fs)
	var procs procsFlag
	procs.register(fs, "limits.max_processes of the agent's config, else "+procsDefault)
	timeout := fs.Duration("timeout", 0, "kill everything in the Trial after this long, wall-clock, suspended (^Z) or not (0: no limit)")
	unixAllow, noUnix := unixFlags(fs)
	nested := nestedFlag(fs)
	socket := socketFlag(fs)
	asJSON := jsonFlag(fs)
	verbose := fs.Bool("v", false, "when CMD ends, print the full counter table instead of the one summary line")
	showRefusals := fs.Bool("show-refusals", false, "print each refusal by the proxy on stderr as it happens")
	reportFile := fs.String("report", "", "write the report (verdict, counters, signed receipt) as JSON to FILE, where the Trial cannot write: read the verdict there, never on the terminal")
	reportFD := fs.Int("report-fd", -1, "write the report to file descriptor N (3 or more), which the Trial never inherits")
	// Flags end at CMD (or "--"): everything from CMD on is its own.
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	report, err := openReport(*reportFile, *reportFD)
	if err != nil {
		return fail(stdout, stderr, *asJSON, exitUsage, err)
	}
	if *asJSON && report == nil {
		return fail(stdout, stderr, true, exitUsage, usageError{"run: -j writes trialnet's result as JSON where the Trial cannot write, never on its stdout: add --report FILE or --report-fd N"})
	}
	// Every way out after this point writes the report, a refusal
	// included: a report left at FILE by an earlier run is never read as
	// this one's.
	failRun := func(code int, err error) int {
		if report != nil {
			if werr := report.write(map[string]any{"exit_code": code, "error": err.Error()}); werr != nil {
				err = errors.Join(err, werr)
			}
		}
		return fail(stdout, stderr, false, code, err)
	}
	argv := fs.Args()
	if len(argv) == 0 {
		fs.Usage()
		return failRun(exitUsage, usageError{"run: no command given; put it after --"})
	}
	for _, p := range hostOwnDirPaths(argv) {
		fmt.Fprintf(stderr, "trialnet: note: %s is in the host's %s; the Trial has its own (empty) /tmp, /var/tmp and /dev/shm and will not find it: put what CMD needs in a directory outside them\n",
			termsafe.String(p), termsafe.String(sandbox.OwnDirOf(p)))
	}
	u, g, err := trialUser(user)
	if err == nil {
		err = af.check()
	}
	if err == nil && *nested && u == 0 {
		err = usageError{"run --nested: a nested Trial runs no command as uid 0 (its /proc is left unmasked for the sandboxes inside, and uid 0 owns what is there); pass --uid N"}
	}
	if err != nil {
		return failRun(exitUsage, err)
	}
	// Owned: the Trial ends with this process, however it ends (SIGKILL
	// included), not only when run tears it down.
	req := agent.CreateRequest{ID: agent.NewID(), Allow: af.allow, Profiles: af.profiles, RequireTLS: af.requireTLS,
		Strict: *strict, Learn: *learn, MaxProcesses: int(procs), UnixAllow: *unixAllow, UnixOpen: *noUnix, Nested: *nested, Owned: true}

	// A running agent serves the Trial; without one, an agent is embedded
	// for the life of this command, so a laptop needs no daemon.
	var b runBackend
	client := agent.NewClient(*socket)
	running, err := client.Running()
	if err != nil {
		return failRun(exitFailure, err)
	}
	if running {
		if cf.given() {
			return failRun(exitUsage, usageError{"run: --config, --resolver and --allow-cidr configure an embedded agent, but an agent is running on " + *socket + " with its own configuration; drop them or stop that agent"})
		}
		b = client
	} else {
		file, cidrs, err := cf.load()
		if err != nil {
			return failRun(exitUsage, err)
		}
		// The config's paths (pins, cgroup parent, namespaces) are honoured.
		// Its Trials are this process's: their records, apart from the
		// daemon's, name it, so that a run killed outright (no teardown)
		// leaves nothing that the next run does not remove.
		host := hostConfig(file)
		host.StateDir += "-ephemeral"
		a, err := agent.Start(agent.AgentConfig{Host: host, File: file, Resolvers: cf.resolvers, AllowCIDRs: cidrs, Ephemeral: true})
		if err != nil {
			return failRun(exitFailure, err)
		}
		defer a.Close(true)
		b = a
	}
	info, err := b.Create(req)
	if err != nil {
		return failRun(agentCode(err), err)
	}
	start := time.Now()
	stopRefusals := func() {}
	if *showRefusals {
		stopRefusals = showRefusalsOf(b, info.ID, stderr)
	}
	ctx := context.Background()
	var deadline time.Time
	if *timeout > 0 {
		deadline = start.Add(*timeout)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
		// This process's own timer cannot fire while it is stopped (^Z)
		// or blocked: a process of its own enforces the deadline too.
		wd, err := sandbox.WatchDeadline(info.Cgroup, deadline)
		if err != nil {
			_, derr := b.DestroyExit(info.ID, nil)
			stopRefusals()
			return failRun(exitFailure, errors.Join(
				fmt.Errorf("run: %w; --timeout needs it, so CMD was not started (run without --timeout to go without one)", err), derr))
		}
		defer wd.Release()
	}
	code, runErr := execIn(ctx, info, sandbox.Command{
		Args: argv, Env: os.Environ(), UID: u, GID: g,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
	})
	// Not ctx.Err(): continued by the watchdog after the deadline, this
	// process may get here before its own timer has fired.
	timedOut := !deadline.IsZero() && !time.Now().Before(deadline)
	exit := code
	if timedOut {
		exit = exitTimeout
	}
	var se *sandbox.StartError
	if errors.As(runErr, &se) {
		exit = se.Code
	}
	st, derr := b.DestroyExit(info.ID, &exit)
	stopRefusals()
	// The Trial is over and its output drained: undo what it may have
	// left the terminal in, so that what follows reads as trialnet's.
	resetTerminal(stderr)
	switch {
	case errors.As(runErr, &se):
		return failRun(se.Code, errors.Join(runErr, derr))
	case timedOut:
		code = exitTimeout
		fmt.Fprintf(stderr, "trialnet: %s timed out after %v; every process in the Trial was killed\n", argv[0], *timeout)
	case runErr != nil:
		fmt.Fprintf(stderr, "trialnet: %v\n", runErr)
		if code == 0 {
			code = exitFailure
		}
	}
	if derr != nil {
		fmt.Fprintf(stderr, "trialnet: %v\n", derr)
		if code == 0 {
			code = exitFailure
		}
	}
	result := map[string]any{
		"trial":                 info.ID,
		"learning":              st.Learning,
		"exit_code":             code,
		"counters":              st.Kernel,
		"proxy":                 st.Proxy,
		"pools":                 st.Pools,
		"direct_egress_packets": st.Egress,
		"foreign_socket_uses":   st.Foreign,
		"layers":                st.Layers,
		"verdict":               st.Verdict,
		"receipt":               st.Receipt,
	}
	if report != nil {
		result["summary"] = summary(st, code, time.Since(start))
		if err := report.write(result); err != nil {
			fmt.Fprintf(stderr, "trialnet: %v\n", err)
			if code == 0 {
				code = exitFailure
			}
		}
	}
	if *verbose {
		fmt.Fprintf(stderr, "exit_code %d\n", code)
		printStats(stderr, st)
	} else {
		fmt.Fprintln(stderr, summary(st, code, time.Since(start)))
	}
	return code
}

// summary is the one line run prints when CMD ends: the Trial, CMD's exit
// code, tunnels allowed and refused with the most refused targets, the
// verdict and the active layers.
func summary(st agent.Stats, code int, took time.Duration) string {
	var top []string
	for _, t := range st.TopRefused {
		top = append(top, fmt.Sprintf("%s ×%d", termsafe.String(t.Target), t.Count))
	}
	refused := fmt.Sprintf("%d refused", st.Proxy.Denied)
	if len(top) > 0 {
		refused += " (" + strings.Join(top, ", ") + ")"
	}
	return fmt.Sprintf("trialnet: Trial %s: exit %d after %s; tunnels: %d allowed, %s; %s; %s",
		termsafe.String(st.Trial), code, took.Round(time.Millisecond), st.Proxy.Allowed, refused,
		termsafe.String(strings.TrimPrefix(st.Verdict, "verdict: ")), termsafe.String(st.Layers.String()))
}

// showRefusalsOf prints each refusal in Trial id on w as it happens, one
// line each, until the Trial is destroyed; stop waits (briefly) for the
// last of them.
func showRefusalsOf(b runBackend, id string, w io.Writer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = b.Watch(ctx, id, func(ev record.Event) {
			if ev.Decision == record.DecisionDeny || ev.Decision == record.DecisionSuppressed {
				fmt.Fprintln(w, refusalLine(ev))
			}
		})
	}()
	return func() {
		select {
		case <-done: // the Trial is gone and its last decision was shown
		case <-time.After(2 * time.Second):
		}
		cancel()
		<-done
	}
}

// refusalLine is one refusal, or a summary of suppressed records, as
// --show-refusals prints it.
func refusalLine(ev record.Event) string {
	if ev.Decision == record.DecisionSuppressed {
		return "trialnet: " + termsafe.String(ev.Detail) + suppressedReasons(ev.Suppressed)
	}
	line := fmt.Sprintf("trialnet: refused %s %s: %s", termsafe.String(ev.Method), termsafe.String(ev.Target), termsafe.String(string(ev.Reason)))
	if ev.Detail != "" {
		line += " (" + termsafe.String(ev.Detail) + ")"
	}
	return line
}

// suppressedReasons is what a summary counts, by reason: " (bad_target
// ×55, rate_limited ×3)".
func suppressedReasons(s *record.Suppressed) string {
	if s == nil || len(s.ByReason) == 0 {
		return ""
	}
	var by []string
	for r, n := range s.ByReason {
		by = append(by, fmt.Sprintf("%s ×%d", termsafe.String(string(r)), n))
	}
	slices.Sort(by)
	return " (" + strings.Join(by, ", ") + ")"
}

// runBackend is what run needs from an agent, running or embedded.
type runBackend interface {
	Create(agent.CreateRequest) (agent.TrialInfo, error)
	DestroyExit(id string, exit *int) (agent.Stats, error)
	Watch(ctx context.Context, id string, fn func(record.Event)) error
}

// execIn runs c in the Trial info describes, with its proxy variables.
func execIn(ctx context.Context, info agent.TrialInfo, c sandbox.Command) (int, error) {
	tr, err := info.Attach()
	if err != nil {
		return -1, err
	}
	sigs, stopSignals := forwardedSignals()
	defer stopSignals()
	c.ProxyURL = info.ProxyURL
	c.SocketsAnywhere = info.UnixOpen
	if c.MaxProcs == 0 && info.Limits != nil {
		c.MaxProcs = info.Limits.MaxProcesses // 0 in records older than it: the default
	}
	return tr.Exec(ctx, c, sigs)
}

// hostOwnDirPaths are the paths among CMD's arguments (whole, or after
// an "=") that exist on the host beneath a directory a Trial has its own
// of: a common surprise, worth a note before the Trial starts.
func hostOwnDirPaths(argv []string) []string {
	var out []string
	for _, a := range argv {
		if _, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(v, "/") {
			a = v
		}
		if d := sandbox.OwnDirOf(a); !strings.HasPrefix(a, "/") || d == "" || d == filepath.Clean(a) {
			continue
		}
		if _, err := os.Lstat(a); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// trialUser decides who CMD runs as: never root. Without a single
// capability, a uid-0 process still owns every root-owned file, and the
// kernel checks many of them by owner alone: trialnet's binary and state,
// /proc/sys (core_pattern runs a program as root), other Trials' cgroup
// files, its runtime directory (a socket bound there answers as the
// agent). No layer of the Trial closes that, so it is refused; gid 0
// likewise, for the root group's writable files. sudo from your own
// account gives your uid.
func trialUser(u userFlags) (uint32, uint32, error) {
	uid, gid := u.uid, u.gid
	if !uid.set {
		s := os.Getenv("SUDO_UID")
		if s == "" {
			return 0, 0, usageError{"who should CMD run as? Pass --uid N (and --gid N; a dedicated user for untrusted code is best), or run trialnet under sudo from your own account to use your uid"}
		}
		if err := uid.Set(s); err != nil {
			return 0, 0, usageError{fmt.Sprintf("SUDO_UID=%q is not a user id (%v); pass --uid", s, err)}
		}
		if uid.id == 0 {
			return 0, 0, usageError{"SUDO_UID is 0 (sudo was run from a root shell), and a Trial never runs as root: pass --uid N for a dedicated user"}
		}
		if !gid.set {
			_ = gid.Set(os.Getenv("SUDO_GID")) // unset or not an id: the uid's, below
		}
	}
	if !gid.set {
		gid = uid
	}
	if uid.id == 0 || gid.id == 0 {
		return 0, 0, usageError{"a Trial never runs as uid 0 or gid 0: even without capabilities, root owns the files that hold every Trial in place (trialnet's state and runtime directory, other Trials' cgroups, /proc/sys), and the root group many of them. Pass --uid N (and --gid N) for a dedicated user; what needs root (installing packages) belongs in the environment prepared before the Trial"}
	}
	return uid.id, gid.id, nil
}

// forwardedSignals relays SIGINT, SIGTERM and SIGHUP to CMD's process
// group. CMD has a session (and, on a terminal, a pty) of its own, so a
// ^C on the caller's terminal never reaches it directly: on a raw
// terminal it travels as a byte through the pty, and otherwise it lands
// here. stop ends the relay.
func forwardedSignals() (_ <-chan os.Signal, stop func()) {
	in := make(chan os.Signal, 4)
	out := make(chan os.Signal, 4)
	signal.Notify(in, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-in:
				select {
				case out <- s:
				default: // CMD already has signals queued; a burst is not lost work
				}
			case <-done:
				return
			}
		}
	}()
	return out, func() {
		signal.Stop(in)
		close(done)
	}
}
