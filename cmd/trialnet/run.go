package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/internal/procscale"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/internal/termsafe"
	"github.com/trialnet/trialnet/internal/timerslack"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

const runUsage = "run [--allow HOST:PORT]... [--profile NAME]... [--learn] [--config F] [--resolver ADDR]... [--allow-cidr CIDR]... [--strict] [--uid N] [--gid N] [--max-procs N] [--workdir DIR] [--timeout D] [--unix-allow PATH]... [--no-unix-confine] [--nested] [--no-transparent] [--show-refusals] [--id ID] [--nonce STR] [--report FILE | --report-dir DIR | --report-fd N] [-v] [-j] -- CMD [ARGS]"

// cmdRun runs CMD in an ephemeral Trial (client.Run) and says how it went.
func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	go warmSignals()
	go warmPidfd()
	// Only sysmon's thread: the launch's threads fork the Trial, which
	// would inherit a slack. Without CAP_SYS_NICE the run is as before.
	go func() { _ = timerslack.SetMonitor(timerslack.Launcher) }()
	fs := cli.NewFlags("run", runUsage, "sudo trialnet run --allow api.anthropic.com:443 --timeout 30m -- claude -p 'fix the failing test'", stderr)
	var f runFlags
	f.register(fs)
	// Flags end at CMD (or "--"): everything from CMD on is its own.
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return cli.Fail(stdout, stderr, *f.asJSON, exitUsage, usageError{"run: no command given; put it after --"})
	}
	id := *f.id
	if id == "" {
		id = agent.NewID()
	} else if err := sandbox.ValidID(id); err != nil {
		return cli.Fail(stdout, stderr, *f.asJSON, exitUsage, usageError{"run --id: " + err.Error()})
	}
	u, g, userChecked, err := trialUserBeside(f.user)
	if err != nil {
		return cli.Fail(stdout, stderr, *f.asJSON, exitUsage, err)
	}
	// The user's check runs beside what follows, the embedded agent's
	// start above all. Its refusal ends the run as if it came first:
	// before any later error, before a report directory is made or a
	// report written, before a Trial is made.
	if *f.reportDir != "" {
		if err := userChecked(); err != nil {
			return cli.Fail(stdout, stderr, *f.asJSON, exitUsage, err)
		}
	}
	report, err := openReport(*f.reportFile, *f.reportDir, *f.reportFD, id, u, g)
	if err != nil {
		return cli.Fail(stdout, stderr, *f.asJSON, exitUsage, cmp.Or(userChecked(), err))
	}
	if *f.asJSON && report == nil {
		return cli.Fail(stdout, stderr, true, exitUsage, cmp.Or(userChecked(), error(usageError{"run: -j writes trialnet's result as JSON where the Trial cannot write, never on its stdout: add --report FILE, --report-dir DIR or --report-fd N"})))
	}
	// Every way out from here writes the report, a refusal included: a
	// report left at FILE by an earlier run is not read as this one's. It
	// carries no receipt: verify says the run ended without a verdict.
	failRun := func(code int, err error) int {
		if uerr := userChecked(); uerr != nil {
			return cli.Fail(stdout, stderr, *f.asJSON, exitUsage, uerr)
		}
		if report != nil {
			failed := map[string]any{"trial": id, "exit_code": code, "error": err.Error()}
			if *f.nonce != "" {
				failed["nonce"] = *f.nonce
			}
			if werr := report.write(failed); werr != nil {
				err = errors.Join(err, werr)
				code = exitFailure
			}
		}
		return cli.Fail(stdout, stderr, false, code, err)
	}
	if len(hostOwnDirPaths(fs.Args())) > 0 {
		// Its notes, which spec prints, come after a refusal of the user.
		if err := userChecked(); err != nil {
			return cli.Fail(stdout, stderr, *f.asJSON, exitUsage, err)
		}
	}
	spec, cmd, err := f.spec(fs, id, u, g, stderr)
	if err != nil {
		return failRun(exitUsage, err)
	}
	var notices heldNotices
	cmd.Notices = &notices
	if report != nil && report.path != "" {
		spec.Create.Report = report.path
		if *f.reportDir != "" {
			fmt.Fprintf(stderr, "trialnet: Trial %s: its report will be %s\n", id, report.path)
		}
	}
	trials, started, closeTrials, code, err := f.trials(ctx, u, g, report != nil)
	if err != nil {
		return failRun(code, err)
	}
	defer closeTrials()
	cmd.Started = started
	spec.Launch = agent.Launch{Command: cmd}
	if err := userChecked(); err != nil {
		return cli.Fail(stdout, stderr, *f.asJSON, exitUsage, err)
	}
	res, err := client.Run(ctx, trials, spec)
	// The Trial is over and its output drained: undo what it may have
	// left the terminal in, so that what follows reads as trialnet's.
	resetTerminal(stderr)
	notices.say(stderr, false)
	if err != nil {
		return failRun(runErrCode(res, err), err)
	}
	return f.finish(res, cmd.Args[0], report, stderr)
}

// runFlags are run's flags.
type runFlags struct {
	af                            allowFlags
	cf                            configFlags
	user                          userFlags
	procs                         procsFlag
	workdir                       workdirFlag
	strict, learn, noUnix, nested *bool
	noTransparent                 *bool
	asJSON, verbose, showRefusals *bool
	unixAllow                     *stringList
	timeout                       *time.Duration
	socket, reportFile, reportDir *string
	id, nonce                     *string
	reportFD                      *int
}

func (f *runFlags) register(fs *flag.FlagSet) {
	f.af.register(fs, "the config")
	f.strict = strictFlag(fs)
	f.learn = learnFlag(fs)
	f.cf.register(fs, "profiles, resolvers, allowed CIDRs and limits (for the agent run embeds when none is running)")
	f.user.register(fs)
	f.procs.register(fs, "limits.max_processes of the agent's config, else "+procsDefault)
	f.workdir.register(fs)
	f.timeout = fs.Duration("timeout", 0, "kill everything in the Trial after this long, wall-clock, suspended (^Z) or not (0: no limit)")
	f.unixAllow, f.noUnix = unixFlags(fs)
	f.nested = nestedFlag(fs)
	f.noTransparent = noTransparentFlag(fs)
	f.socket = cli.SocketFlag(fs)
	f.asJSON = jsonFlag(fs)
	f.verbose = fs.Bool("v", false, "when CMD ends, print the full counter table instead of the one summary line")
	f.showRefusals = fs.Bool("show-refusals", false, "print each refusal by the proxy on stderr as it happens")
	f.reportFile = fs.String("report", "", "write the report (verdict, counters, signed receipt) as JSON to FILE, where the Trial cannot write: read the verdict there, never on the terminal")
	f.reportDir = fs.String("report-dir", "", "write the report to DIR/ID.json, DIR made if missing (for example "+suggestedReportDir+", root's); the path is printed when the run starts and shown by list")
	f.reportFD = fs.Int("report-fd", -1, "write the report to file descriptor N (3 or more), which the Trial never inherits: a pipe the harness reads (--report-fd 3 ... 3>&1 1>&2 | harness)")
	f.id = fs.String("id", "", "the Trial's id (default: generated), so that a harness knows it beforehand")
	f.nonce = nonceFlag(fs, nonceUsage)
}

// spec checks the flags and CMD into the run (its Trial and deadline)
// and its command, as whom. Every error is a usage error.
func (f *runFlags) spec(fs *flag.FlagSet, id string, u, g uint32, stderr io.Writer) (client.RunSpec, sandbox.Command, error) {
	argv := fs.Args()
	for _, p := range hostOwnDirPaths(argv) {
		fmt.Fprintf(stderr, "trialnet: note: %s is in the host's %s; the Trial has its own (empty) /tmp, /var/tmp and /dev/shm and will not find it: put what CMD needs in a directory outside them\n",
			termsafe.String(p), termsafe.String(sandbox.OwnDirOf(p)))
	}
	err := f.af.check()
	if err == nil && *f.nested && u == 0 {
		err = usageError{"run --nested: a nested Trial runs no command as uid 0 (its /proc is left unmasked for the sandboxes inside, and uid 0 owns what is there); pass --uid N"}
	}
	spec := client.RunSpec{
		Create: trialspec.Request{ID: id, Nonce: *f.nonce, Allow: f.af.allow, Profiles: f.af.profiles, RequireTLS: f.af.requireTLS, Strict: *f.strict,
			Learn: *f.learn, MaxProcesses: int(f.procs), UnixAllow: *f.unixAllow, UnixOpen: *f.noUnix, Nested: *f.nested, NoTransparent: *f.noTransparent},
		Timeout: *f.timeout,
		Signals: forwardedSignals,
	}
	if *f.showRefusals {
		spec.OnDecision = func(ev record.Event) {
			if ev.Decision == record.DecisionDeny || ev.Decision == record.DecisionSuppressed {
				fmt.Fprintln(stderr, refusalLine(ev))
			}
		}
	}
	cmd := sandbox.Command{Args: argv, Env: os.Environ(), UID: u, GID: g, Dir: string(f.workdir), Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	return spec, cmd, err
}

// trials is the agent that serves the run: the one running on the
// socket, or, without one, an agent embedded for the life of this
// command, so that a laptop needs no daemon. started is for the
// command's start (nil: nothing to do then). On an error, code is the
// exit code it calls for. uid and gid are the Trial's; reported says a
// report takes the receipt, which an embedded agent signs only then (it
// keeps no data directory: the report is the one place a receipt goes).
func (f *runFlags) trials(ctx context.Context, uid, gid uint32, reported bool) (_ client.Trials, started, closeTrials func(), code int, _ error) {
	c := client.NewClient(*f.socket)
	running, err := c.Running(ctx)
	if err != nil {
		return nil, nil, nil, exitFailure, err
	}
	if running {
		if f.cf.given() {
			c.Release()
			return nil, nil, nil, exitUsage, usageError{"run: --config, --resolver and --allow-cidr configure an embedded agent, but an agent is running on " + *f.socket + " with its own configuration; drop them or stop that agent"}
		}
		return c, nil, c.Release, exitOK, nil
	}
	real, err := configOutOfReach(f.cf.path, uid, gid)
	if err == nil && f.cf.path != "" {
		real, err = callersConfig(f.cf.path)
	}
	if err != nil {
		return nil, nil, nil, exitUsage, err
	}
	if real != "" {
		f.cf.path = real // read what was checked
	}
	file, cidrs, err := f.cf.load()
	if err == nil {
		err = pathsRootsAlone(file)
	}
	if err != nil {
		return nil, nil, nil, exitUsage, err
	}
	// The config's paths (pins, cgroup parent, namespaces) are honoured.
	// Its Trials are this process's: their records, apart from the
	// daemon's, name it, so that a run killed outright (no teardown)
	// leaves nothing that the next run does not remove.
	host := hostConfig(file)
	host.StateDir += "-ephemeral"
	if code, err := madeRootsAlone("state_dir", host.StateDir); err != nil {
		return nil, nil, nil, code, err
	}
	a, err := agent.Start(agent.AgentConfig{Host: host, File: file, Resolvers: f.cf.resolvers, AllowCIDRs: cidrs, Ephemeral: true, SteerAhead: !*f.noTransparent,
		NoReceipt: !reported})
	if err != nil {
		return nil, nil, nil, exitFailure, err
	}
	// The embedded agent serves the Trial's proxy: one P while that fits
	// on one CPU, as a running agent does, from one window after the
	// command's start. Not before the start: the launch's thread waits
	// in the command's vfork holding its P until the goroutine that lets
	// the command go has run, which on one P waits for the runtime's
	// monitor to take that P back (up to 10 ms or more, each launch).
	// And a window later: each change of Ps stops the world, which a
	// command shorter than that would pay twice for nothing. Both
	// closures run on the goroutine that runs the command.
	scaleCtx, stopScale := context.WithCancel(ctx)
	var scale *time.Timer
	started = func() { scale = time.AfterFunc(procscale.Window, func() { procscale.Run(scaleCtx) }) }
	return a, started, func() {
		if scale != nil {
			scale.Stop()
		}
		stopScale()
		a.Close(true)
	}, exitOK, nil
}

// madeRootsAlone makes dir (0700) if it is missing and then judges it as
// pathsRootsAlone does: what was missing there (root's to make) another
// user may have made first beneath a sticky directory, for the agent to
// keep, read and sweep its records in; and run's state directory is
// state_dir's name with -ephemeral, which pathsRootsAlone never saw.
// Judged once made, it cannot change after. The code is exit's on an error.
func madeRootsAlone(key, dir string) (int, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return exitFailure, fmt.Errorf("config paths: %s: create %s: %w", key, dir, err)
	}
	if err := rootdir.OthersOutOfReach(dir+"/_", 0, 0); err != nil {
		return exitUsage, usageError{fmt.Sprintf("config paths: %s: %s: %v: root keeps its records there; give a %s in a directory only root can change", key, dir, err, key)}
	}
	return exitOK, nil
}

// configOutOfReach refuses a --config file the Trial's uid or gid could
// change: one in the operator's project, which a Trial running as the
// operator writes, would hand the next run that reads it whatever the
// Trial put there (learn: true, more names, host services, a state
// directory of its choosing that root then makes and writes). A link at
// the name (/etc's are links on NixOS) is followed if it and its
// directories are out of the Trial's reach, and the file it leads to is
// judged in turn; the path returned is that file's, the one to read.
func configOutOfReach(path string, uid, gid uint32) (string, error) {
	if path == "" {
		return "", nil
	}
	real, err := followConfigLinks(path, uid, gid)
	if err == nil {
		err = rootdir.FileOutOfReach(real, uid, gid)
	}
	if err != nil {
		return "", usageError{fmt.Sprintf("run --config %s: the Trial (uid %d) could change this file, and with it the allowlist and paths of every later run that reads it: %v; "+
			"put it where only root can write (sudo install -m 0644 %s /etc/trialnet/trialnet.yaml) and pass that, or run the Trial as a dedicated --uid and --gid",
			path, uid, err, path)}
	}
	return real, nil
}

// callersConfig refuses a --config file that someone but root, or the
// user who ran sudo, could change: out of the Trial's reach is not
// enough, since another user of the host (a colleague, a service
// account, whoever made /tmp/x first) who could rewrite it would have
// root's embedded agent take their allowlist, learn: true, and paths
// that root then makes and writes. It returns the file's real path.
func callersConfig(path string) (string, error) {
	owner, _ := sudoCaller()
	real, err := trustedConfig(path, owner)
	if err != nil {
		return "", usageError{fmt.Sprintf("run --config %s: %v", path, err)}
	}
	return real, nil
}

// sudoCaller is the user who ran trialnet under sudo (SUDO_UID and
// SUDO_GID), whose files root reads and writes for them; 0 and 0 (root
// alone) when trialnet does not run as root through sudo.
func sudoCaller() (uid, gid uint32) {
	if os.Geteuid() != 0 {
		return 0, 0
	}
	u, uerr := strconv.ParseUint(os.Getenv("SUDO_UID"), 10, 32)
	g, gerr := strconv.ParseUint(os.Getenv("SUDO_GID"), 10, 32)
	if uerr != nil {
		return 0, 0
	}
	if gerr != nil {
		g = 0
	}
	return uint32(u), uint32(g)
}

// followConfigLinks follows the links at path's last name, each checked
// out of the Trial's reach (rootdir.OutOfReach: its directories; a link
// cannot be changed in place, only replaced through its directory).
func followConfigLinks(path string, uid, gid uint32) (string, error) {
	p, err := rootdir.Unclean(path)
	if err != nil {
		return "", err
	}
	for links := 0; ; links++ {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			return p, nil // FileOutOfReach says what is wrong with it
		}
		if links >= maxConfigLinks {
			return "", fmt.Errorf("%s: more than %d links on the way (a loop of links?)", path, maxConfigLinks)
		}
		if err := rootdir.OutOfReach(p, uid, gid); err != nil {
			return "", err
		}
		target, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Dir(p) + "/" + target
		}
		p = target
	}
}

// runErrCode is the exit code of a run that never got CMD going: the
// agent's refusal of the Trial, or why CMD could not start.
func runErrCode(res client.RunResult, err error) int {
	var se *sandbox.StartError
	switch {
	case errors.As(err, &se):
		return se.Code
	case res.Info.ID == "":
		return agentCode(err)
	}
	return exitFailure
}

// finish says how the run went, on stderr and in the report, and
// returns run's exit code: CMD's, or why trialnet failed around it.
func (f *runFlags) finish(res client.RunResult, cmd string, report *reportSink, stderr io.Writer) int {
	code := res.Exit
	switch {
	case res.TimedOut:
		fmt.Fprintf(stderr, "trialnet: %s timed out after %v; every process in the Trial was killed\n", termsafe.String(cmd), *f.timeout)
	case res.Err != nil:
		fmt.Fprintf(stderr, "trialnet: %v\n", res.Err)
		if code == 0 {
			code = exitFailure
		}
	}
	if res.DestroyErr != nil {
		fmt.Fprintf(stderr, "trialnet: %v\n", res.DestroyErr)
		if code == 0 {
			code = exitFailure
		}
	}
	st := res.Stats
	if st.Trial == "" { // no stats came with a failed destroy
		st.Trial = res.Info.ID
	}
	if report != nil {
		// Whatever CMD's code: a harness must not take the run for one
		// with a verdict (CMD can exit 125 too: verify is the gate).
		if err := report.write(f.result(res, st, code)); err != nil {
			fmt.Fprintf(stderr, "trialnet: %v\n", err)
			code = exitFailure
		}
	}
	if *f.verbose {
		fmt.Fprintf(stderr, "exit_code %d\n", code)
		printStats(stderr, st)
	} else {
		fmt.Fprintln(stderr, summary(st, code, res.Took))
	}
	return code
}

// result is the report of a run that got CMD going, st its final stats.
func (f *runFlags) result(res client.RunResult, st client.Stats, code int) map[string]any {
	// exit_code is CMD's own unless trialnet's: CMD may exit 124 or
	// 125 itself, so what trialnet did is said on its own.
	result := map[string]any{"trial": res.Info.ID, "learning": st.Learning, "exit_code": code, "timed_out": res.TimedOut, "counters": st.Kernel, "proxy": st.Proxy, "dns": st.DNS,
		"pools": st.Pools, "direct_egress_packets": st.Egress, "foreign_socket_uses": st.Foreign, "layers": st.Layers,
		"verdict": st.Verdict, "receipt": st.Receipt, "summary": summary(st, code, res.Took)}
	// Counters that may not be final (UNKNOWN) are said beside them, not
	// only in the verdict's words: their zeros are no clean run's.
	if st.Unsure != "" {
		result["counters_unsure"] = st.Unsure
	}
	// No verdict (a destroy that failed through an older running agent,
	// which answered its error alone): no counter is known, and a zero is
	// no count.
	if st.Verdict == "" {
		result["direct_egress_packets"], result["foreign_socket_uses"] = nil, nil
		result["counters_unsure"] = "no final counters came with the Trial's failed destroy; the agent's data directory has the stats and receipt it made, if any ('trialnet audit' for the decisions)"
	}
	// The deadline's kill is no failure around CMD: timed_out says it,
	// as the terminal's line does.
	runErr := res.Err
	if res.TimedOut {
		runErr = nil
	}
	if err := errors.Join(runErr, res.DestroyErr); err != nil {
		result["error"] = err.Error()
	}
	// The receipt carries the nonce; without one (a destroy that failed
	// through a running agent gives none), verify checks the report's.
	if *f.nonce != "" {
		result["nonce"] = *f.nonce
	}
	return result
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
	uid, gid, defaulted, err := pickUser(u)
	if err == nil && defaulted {
		err = notAnotherGroup(uid)
	}
	if err != nil {
		return 0, 0, err
	}
	return uid, gid, nil
}

// trialUserBeside is trialUser with its check through NSS (0.3-0.5 ms:
// files read, libraries loaded) run beside the caller's next steps:
// checked waits for it and returns its refusal.
func trialUserBeside(u userFlags) (uid, gid uint32, checked func() error, err error) {
	uid, gid, defaulted, err := pickUser(u)
	if err != nil || !defaulted {
		return uid, gid, func() error { return nil }, err
	}
	c := make(chan error, 1)
	go func() { c <- notAnotherGroup(uid) }()
	return uid, gid, sync.OnceValue(func() error { return <-c }), nil
}

// pickUser is trialUser without its check through NSS; defaulted says
// the gid is the uid's number, taken by default, which notAnotherGroup
// checks.
func pickUser(u userFlags) (_, _ uint32, defaulted bool, _ error) {
	uid, gid := u.uid, u.gid
	if !uid.set {
		s := os.Getenv("SUDO_UID")
		if s == "" {
			return 0, 0, false, usageError{"who should CMD run as? Pass --uid N (and --gid N; a dedicated user for untrusted code is best), or run trialnet under sudo from your own account to use your uid"}
		}
		if err := uid.Set(s); err != nil {
			return 0, 0, false, usageError{fmt.Sprintf("SUDO_UID=%q is not a user id (%v); pass --uid", s, err)}
		}
		if uid.id == 0 {
			return 0, 0, false, usageError{"SUDO_UID is 0 (sudo was run from a root shell), and a Trial never runs as root: pass --uid N for a dedicated user"}
		}
		if !gid.set {
			_ = gid.Set(os.Getenv("SUDO_GID")) // unset or not an id: the uid's, below
		}
	}
	defaulted = !gid.set
	if defaulted {
		gid = uid
	}
	if uid.id == 0 || gid.id == 0 {
		return 0, 0, false, usageError{"a Trial never runs as uid 0 or gid 0: even without capabilities, root owns the files that hold every Trial in place (trialnet's state and runtime directory, other Trials' cgroups, /proc/sys), and the root group many of them. Pass --uid N (and --gid N) for a dedicated user; what needs root (installing packages) belongs in the environment prepared before the Trial"}
	}
	return uid.id, gid.id, defaulted, nil
}

// notAnotherGroup refuses the number of uid as a gid, taken by default,
// where it is a group other than the user's own: the Trial could open
// what that group may (disk, 6 on Debian, reads raw disks: trialnet's
// receipt key and state among them). A gid no group has, or the user's
// own (its name, or its primary group), is fine.
func notAnotherGroup(uid uint32) error {
	n := strconv.FormatUint(uint64(uid), 10)
	g, err := user.LookupGroupId(n)
	if err != nil {
		return nil
	}
	if u, err := user.LookupId(n); err == nil && (u.Username == g.Name || u.Gid == n) {
		return nil
	}
	return usageError{fmt.Sprintf("uid %s without --gid would run as gid %s too, which is the group %s, not this user's own: the Trial could open whatever %s may (disk reads raw disks). Pass --gid N, the user's own group or one with no files (65534)", n, n, termsafe.String(g.Name), termsafe.String(g.Name))}
}
