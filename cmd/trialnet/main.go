//go:build linux

// Command trialnet runs programs in Trials: network sandboxes whose only
// way out is an allowlisting proxy, enforced by namespaces and eBPF.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/sandbox"
)

// Exit codes of trialnet itself; a command run in a Trial passes its own.
const (
	exitOK      = cli.ExitOK
	exitUsage   = cli.ExitUsage      // bad flags or arguments
	exitFailure = cli.ExitFailure    // trialnet refused or failed before or around CMD
	exitTimeout = client.ExitTimeout // --timeout expired; everything in the Trial was killed
)

// No heap profile is ever taken (--pprof-dir writes CPU, block and mutex
// profiles and a trace), yet runtime/pprof, linked for those, keeps the
// runtime sampling one allocation in 512 KiB: each sample walks the stack
// and files it in a 1.4 MB table made at the first, whose pages fault in.
// In an embedded `run -- true` that was 1.2 % of the process's CPU.
func init() { runtime.MemProfileRate = 0 }

func main() {
	sandbox.Init()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// commands are trialnet's commands. An interruptible one only asks the
// agent: ^C (or SIGTERM) cancels its context, and so its call. The
// others keep the signals for what they run (run and exec forward them
// to the Trial; agent and proxy shut down on them).
var commands = []struct {
	name, summary string
	fn            func(ctx context.Context, args []string, stdout, stderr io.Writer) int
	interruptible bool
}{
	{"doctor", "check what this kernel offers trialnet", cmdDoctor, false},
	{"run", "run a command in an ephemeral Trial (through the agent, or an embedded one)", cmdRun, false},
	{"agent", "run the host agent (the daemon behind create, exec, stats, ...); one started while another runs takes over from it", cmdAgent, false},
	{"keeper", "hold the agent's listening sockets so that they outlive it (the agent starts one itself)", cmdKeeper, false},
	{"create", "create a long-lived Trial", cmdCreate, true},
	{"exec", "run a command in a Trial", cmdExec, false},
	{"list", "list live Trials", cmdList, true},
	{"stats", "show a Trial's kernel and proxy counters and the egress verdict", cmdStats, true},
	{"audit", "show a Trial's decision log, or the profile it used (--profile)", cmdAudit, true},
	{"allow", "add entries to a live Trial's allowlist", cmdAllow, true},
	{"deny", "remove entries from a live Trial's allowlist (--cut ends their open tunnels)", cmdDeny, true},
	{"reload", "make the agent re-read its config file (all or nothing; SIGHUP does the same)", cmdReload, true},
	{"health", "ask the running agent whether it is ready: enforcing (eBPF attached and pinned) and serving", cmdHealth, true},
	{"destroy", "destroy a Trial (its stats and log stay in /var/lib/trialnet)", cmdDestroy, true},
	{"verify", "check a Trial's signed receipt against this host's key", cmdVerify, false},
	{"proxy", "run the allowlisting CONNECT proxy on its own", cmdProxy, false},
	{"oci-hook", "check a container that claims a Trial, as an OCI runtime's createRuntime hook ('oci-hook install' registers it as trialnet-oci, installed beside trialnet)", cmdOCIHook, true},
	{"nri", "run the NRI plugin that makes a Trial of each pod annotated trialnet.io/profile (containerd 1.7+, CRI-O): execs trialnet-nri, installed beside trialnet", cmdNRI, false},
	{"oci-runtime", "run runc for Docker, a container that names a Trial put in it and checked by oci-hook ('oci-runtime install' registers it in daemon.json as trialnet-oci, installed beside trialnet)", cmdOCIRuntime, false},
	{"uninstall", "detach trialnet's eBPF programs and remove its pins", cmdUninstall, false},
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
			ctx := context.Background()
			if c.interruptible {
				var stop context.CancelFunc
				ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
				defer stop()
			}
			return c.fn(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "trialnet: unknown command %q; 'trialnet help' lists the commands\n", args[0])
	return exitUsage
}

func printHelp(w io.Writer) {
	fmt.Fprintln(w, "trialnet: run untrusted programs in Trials whose only way out is an allowlisting proxy.")
	fmt.Fprintln(w, "\nUsage: trialnet COMMAND [flags]\n\nCommands:")
	tw := newTable(w)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\n'trialnet COMMAND -h' shows a command's flags and an example.")
}

func jsonFlag(fs *flag.FlagSet) *bool {
	j := new(bool)
	fs.BoolVar(j, "j", false, "print JSON")
	fs.BoolVar(j, "json", false, "print JSON")
	return j
}

func cmdDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("doctor", "doctor [-j] [--config FILE]", "sudo trialnet doctor --config /etc/trialnet/trialnet.yaml", stderr)
	asJSON := jsonFlag(fs)
	configPath := fs.String("config", "", "the agent's YAML config file: also check what it needs of this host (upstream proxy, host services, gateway secret files and trust store)")
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	checks := agent.Doctor()
	if *configPath != "" {
		file, err := config.LoadFile(*configPath)
		if err != nil {
			return cli.Fail(stdout, stderr, *asJSON, exitUsage, err)
		}
		checks = append(checks, agent.ConfigChecks(file)...)
		checks = append(checks, agent.GatewayChecks(file)...)
	}
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
		cli.PrintJSON(stdout, out)
	} else {
		tw := newTable(stdout)
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

func cmdUninstall(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("uninstall", "uninstall [--config F] [--force]", "sudo trialnet uninstall --config /etc/trialnet/trialnet.yaml --force", stderr)
	configPath := fs.String("config", "", "the agent's YAML config file, whose paths: (cgroup parent, pins, namespaces, state and data directories) are the ones uninstall clears")
	force := fs.Bool("force", false, "uninstall even while Trials are live, destroying them first (their processes are killed)")
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	file := &config.File{}
	if *configPath != "" {
		real, err := rootsConfig(*configPath)
		if err != nil {
			return cli.Fail(stdout, stderr, false, exitUsage, fmt.Errorf("uninstall --config %s: %w", *configPath, err))
		}
		f, err := config.LoadFile(real)
		if err == nil {
			err = pathsRootsAlone(f)
		}
		if err != nil {
			return cli.Fail(stdout, stderr, false, exitUsage, err)
		}
		file = f
	}
	cfg := hostConfig(file)
	if err := agent.Uninstall(cfg, or(file.Paths.DataDir, agent.DefaultDataDir), *force); err != nil {
		return cli.Fail(stdout, stderr, false, exitFailure, err)
	}
	fmt.Fprintf(stdout, "removed trialnet's pins from %s; its eBPF programs are detached\n", or(cfg.PinDir, bpf.DefaultPinDir))
	return exitOK
}

// rootsConfig refuses a config file that anyone but root could have
// written: uninstall removes, as root, what its paths name (a netns_dir
// of /etc and a cgroup_parent holding a directory "shadow" removed
// /etc/shadow), so its paths must be root's word. It returns the file's
// real path, which is what the caller reads: a link at the name is
// followed only if root's, and to a path checked in turn, since one
// someone else owns (in /tmp, say) could lead elsewhere once checked,
// when the file is read or the agent's SIGHUP reads it again.
func rootsConfig(path string) (string, error) { return trustedConfig(path, 0) }

// trustedConfig is rootsConfig where the word of owner, a uid besides
// root, is good too (0: root's alone): run's caller under sudo, whose
// own files root reads for it.
func trustedConfig(path string, owner uint32) (string, error) {
	who, keep := "root", "keep it root's (sudo install -D -m 0644 FILE /etc/trialnet/trialnet.yaml)"
	if owner != 0 {
		who = fmt.Sprintf("root or uid %d (who ran sudo)", owner)
		keep = fmt.Sprintf("keep it and its directories %s's alone, or install it as root's (sudo install -D -m 0644 FILE /etc/trialnet/trialnet.yaml)", who)
	}
	// Not cleaned: TrustedPath takes "link/.." as the kernel does.
	next, err := rootdir.Unclean(path)
	if err != nil {
		return "", err
	}
	for links := 0; ; links++ {
		real, err := rootdir.TrustedPath(next, owner)
		if err != nil {
			return "", fmt.Errorf("someone but %s could change what it names: %w; %s", who, err, keep)
		}
		var st unix.Stat_t
		if err := unix.Lstat(real, &st); err != nil {
			return "", err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			if (st.Uid != 0 && st.Uid != owner) || st.Mode&0o022 != 0 {
				return "", fmt.Errorf("it is uid %d's with mode %04o: someone but %s could have written it (its paths, which trialnet makes, writes and removes as root, and its policy); %s and not writable by others (sudo chmod go-w %s)", st.Uid, st.Mode&0o7777, who, keep, real)
			}
			return real, nil
		}
		if st.Uid != 0 && st.Uid != owner {
			return "", fmt.Errorf("%s is a link owned by uid %d, not %s: its owner can point it at another file once it is checked; pass the path of the file it leads to instead (readlink -f %s shows it)", real, st.Uid, who, path)
		}
		if links >= maxConfigLinks {
			return "", fmt.Errorf("%s: more than %d links on the way (a loop of links?): name the file itself", real, maxConfigLinks)
		}
		target, err := os.Readlink(real)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Dir(real) + "/" + target
		}
		next = target
	}
}

// maxConfigLinks bounds the links rootsConfig follows at the file's own
// name, as the kernel's limit does.
const maxConfigLinks = 40

// warmSignals starts the runtime's signal machinery (os/signal's loop and
// the thread that keeps the signal mask) beside a run's or an exec's
// other work: the first signal.Notify in a process waits for both, 0.3-1.3
// ms on a guest where thread creation is a hypercall, and
// forwardedSignals' comes between the Trial's create and its command's
// start. On SIGWINCH, which the runtime's handler, installed for every
// signal at start, ignores when nothing is notified: caught into a
// channel no one reads, it is dropped as before.
func warmSignals() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGWINCH)
}

// warmPidfd makes the os package's one check of pidfd support (pidfd_open,
// waitid, pidfd_send_signal, and a vfork'd child that exits at once,
// reaped) beside a run's or an exec's other work: the first process a
// launch starts, a Trial's init or its command, made it on the launch's
// path (0.09-1.9 ms, p50 0.12, at load 6-10 here). Finding this process
// is the cheapest call that makes it.
func warmPidfd() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Release()
	}
}

// forwardedSignals relays SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
// SIGUSR2 to CMD's process group. CMD has a session (and, on a terminal,
// a pty) of its own, so a ^C on the caller's terminal never reaches it
// directly: on a raw terminal it travels as a byte through the pty, and
// otherwise it lands here. Left to the Go runtime, SIGQUIT ended trialnet
// with a goroutine dump and the Trial outlived it, and SIGUSR1 and
// SIGUSR2 were dropped. SIGHUP and SIGINT ignored when trialnet started
// (nohup, a script's `cmd &`) stay ignored, by trialnet and so by CMD, as
// a plain exec would leave them: caught, they reached CMD with their
// defaults and killed it. stop ends the relay.
func forwardedSignals() (_ <-chan os.Signal, stop func()) {
	in := make(chan os.Signal, 4)
	out := make(chan os.Signal) // relayPending keeps what waits
	sigs := []os.Signal{syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}
	for _, s := range []os.Signal{syscall.SIGINT, syscall.SIGHUP} {
		if !signal.Ignored(s) {
			sigs = append(sigs, s)
		}
	}
	signal.Notify(in, sigs...)
	done := make(chan struct{})
	go relayPending(in, out, done)
	return out, func() {
		signal.Stop(in)
		close(done)
	}
}

// relayPending passes what comes on in to out until done closes. What
// out cannot take yet waits, one of each kind, as the kernel keeps a
// process's pending signals: a burst of one kind merges, and never
// displaces another (four SIGUSR1 queued dropped a SIGTERM after them).
func relayPending(in <-chan os.Signal, out chan<- os.Signal, done <-chan struct{}) {
	var pending []os.Signal // at most one of each signal relayed
	for {
		var send chan<- os.Signal // nil, never ready, while none waits
		var next os.Signal
		if len(pending) > 0 {
			send, next = out, pending[0]
		}
		select {
		case s := <-in:
			if !slices.Contains(pending, s) {
				pending = append(pending, s)
			}
		case send <- next:
			pending = pending[1:]
		case <-done:
			return
		}
	}
}
