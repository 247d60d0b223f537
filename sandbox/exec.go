//go:build linux

package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// execArg0 marks a re-executed trialnet binary that must become a Trial
// command: it finishes the confinement a fork cannot express and execs CMD.
const execArg0 = "trialnet-exec"

// trialnet-exec's argument on where its command may make unix sockets
// and FIFOs (Command.SocketsAnywhere).
const (
	socketsConfined = "sockets=trial"
	socketsAnywhere = "sockets=anywhere"
	// nestedMode is a nested Trial's command (nested.go): user namespaces
	// allowed, and Landlock's scopes without its filesystem rules.
	nestedMode = "nested"
)

// Exit codes of a command that could not be started, as shells use them.
const (
	ExitCannotExecute = 126
	ExitNotFound      = 127
)

// Command is one process to run in a Trial.
type Command struct {
	// Args[0] is looked up in the PATH of Env, as the Trial's user.
	Args []string
	// Env is the process environment; proxy variables are added to it.
	Env []string
	Dir string
	// ProxyURL, when set, becomes HTTPS_PROXY, HTTP_PROXY and their lower
	// case forms, with NO_PROXY for loopback and NODE_USE_ENV_PROXY=1 (see
	// trial.ProxyEnv).
	ProxyURL string
	// GatewayURL, when set, becomes TRIALNET_GATEWAY: where the Trial's
	// credential gateway routes are served.
	GatewayURL string
	UID, GID   uint32
	// MaxProcs is the command's RLIMIT_NPROC (soft and hard): forks past
	// it fail with EAGAIN. The kernel counts every process and thread of
	// the real uid, in this Trial, in others and outside any, so Trials
	// sharing a uid share it; uid 0 is never held to it. 0 means the
	// Trial's (its Spec's max_processes), else DefaultMaxProcs.
	MaxProcs int
	// SocketsAnywhere lets the command make unix sockets and FIFOs
	// wherever it may write, for a Trial made without unix confinement
	// (Spec.UnixOpen). Otherwise it makes them only in the Trial's own
	// /dev/shm: one at a path it shares with the host (/tmp, its home, its
	// work directory) would be a way in, for a host client that looks for
	// a server there (psql and /tmp/.s.PGSQL.5432).
	SocketsAnywhere bool

	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Notices is where the terminal relay says what the operator must
	// know and the Trial's output must not carry: trialnet's own stderr
	// (the terminal's answers to the Trial's queries may still come as
	// typed input). nil: nowhere.
	Notices io.Writer
	// Started, when set, is called by Exec once the command has started,
	// before it waits for it.
	Started func()
}

// Bounds of Command.MaxProcs.
const (
	// DefaultMaxProcs is room for a Harness with its build tools and
	// test runners, yet a few hundred times short of the 32,768 pids a
	// host has by default.
	DefaultMaxProcs = 4096
	// MaxMaxProcs is the kernel's PID_MAX_LIMIT: no host has more pids.
	MaxMaxProcs = 1 << 22
)

// CheckMaxProcs refuses a process limit that is not 0 (the default) or
// between 1 and MaxMaxProcs.
func CheckMaxProcs(n int) error {
	if n < 0 || n > MaxMaxProcs {
		return fmt.Errorf("the process limit %d is out of range: give 1 to %d (0: the default, %d)", n, MaxMaxProcs, DefaultMaxProcs)
	}
	return nil
}

var proxyVars = []string{"HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "NO_PROXY", "no_proxy",
	"ALL_PROXY", "all_proxy", "NODE_USE_ENV_PROXY", GatewayVar}

// GatewayVar names the variable that tells a Trial's processes where its
// credential gateway routes are served (docs/gateway.md).
const GatewayVar = "TRIALNET_GATEWAY"

func (c Command) environ() []string {
	env := make([]string, 0, len(c.Env)+len(proxyVars))
	for _, kv := range c.Env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(proxyVars, name) {
			env = append(env, kv)
		}
	}
	if c.ProxyURL != "" {
		env = append(env, trial.ProxyEnv(c.ProxyURL)...)
	}
	if c.GatewayURL != "" {
		env = append(env, GatewayVar+"="+c.GatewayURL)
	}
	return env
}

// StartError means the command never ran; Code is 126 or 127.
type StartError struct {
	Code int
	Msg  string
}

func (e *StartError) Error() string { return e.Msg }

// StartCode is Code: it makes a StartError a client.StartError, which
// client.Run matches without linking the sandbox.
func (e *StartError) StartCode() int { return e.Code }

// hideStdio keeps the caller's stdio out of the Trial but for a
// terminal, which becomes a pty of the Trial's, and a device such as
// /dev/null: stdin, stdout and stderr that are a pipe, FIFO, file or
// socket reach the command through pipes of trialnet's. Handed in, a
// socket's peer may be a process outside the Trial (SO_PEERPIDFD gives
// a pidfd of it), unix sockets carry descriptors, and a socket of the
// host's namespace is a way out that no hook of the Trial judges. A pipe
// or file could be opened again through /proc/self/fd, where the kernel
// checks the file's mode but no directory on its path: output read back
// (a log every run appends to, other writers of a pipe of the Trial's
// uid), stdin written (see stdinRelay). And an open file the Trial
// shares with the caller is the caller's too: its offset moved back, its
// reads and writes made non-blocking (O_NONBLOCK is the open file's),
// the caller's next read or write after trialnet met EAGAIN. It returns
// what it set up: stdin's relay and the outputs' duplicates.
func hideStdio(cmd *exec.Cmd, gid uint32) (_ *hiddenStdio, err error) {
	h := &hiddenStdio{gid: gid}
	defer func() {
		if err != nil {
			h.stop()
		}
	}()
	if f, ok := cmd.Stdin.(*os.File); ok && f != nil {
		if mode, ok := relayed(f); ok {
			if h.in, err = newStdinRelay(f, mode, gid); err != nil {
				return nil, err
			}
			cmd.Stdin = h.in.r
		}
	}
	out, _ := cmd.Stdout.(*os.File)
	if _, ok := relayed(out); ok {
		if cmd.Stdout, err = h.output(out); err != nil {
			return nil, err
		}
	}
	if f, _ := cmd.Stderr.(*os.File); f != nil {
		if _, ok := relayed(f); ok {
			if cmd.Stdout != io.Writer(out) && sameOpenFile(f, out) {
				// One file (>log 2>&1) is one pipe, as exec.Cmd makes for
				// one writer: through two, copied each on its own, the
				// command's output and errors lost their order.
				cmd.Stderr = cmd.Stdout
			} else if cmd.Stderr, err = h.output(f); err != nil {
				return nil, err
			}
		}
	}
	if len(h.outs) > 0 {
		// What the command left behind may hold the pipes open: its
		// output after it exits is not waited for.
		cmd.WaitDelay = time.Second
	}
	return h, nil
}

// output is where a hidden output f is copied to.
func (h *hiddenStdio) output(f *os.File) (io.Writer, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, fmt.Errorf("output %s: %w", f.Name(), err)
	}
	dup := os.NewFile(uintptr(fd), f.Name())
	h.outs = append(h.outs, dup)
	return relayOutput{dup, h.gid}, nil
}

// relayed says how stdio f reaches the command: through a pipe of
// trialnet's (see hideStdio; for stdin, the relay's mode), or, for a
// terminal or a device such as /dev/null, as it is (ok false). A nil f
// is none.
func relayed(f *os.File) (_ relayMode, ok bool) {
	if f == nil {
		return 0, false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || !shareable(f) {
		return relaySocket, true
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return relayPipe, true
	case unix.S_IFREG:
		return relayFile, true
	}
	return 0, false
}

func shareable(f *os.File) bool {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return true
	case unix.S_IFREG:
		// A namespace file looks regular; it has no business as stdio.
		var fs unix.Statfs_t
		return unix.Fstatfs(int(f.Fd()), &fs) == nil && fs.Type != unix.NSFS_MAGIC
	case unix.S_IFCHR:
		if term.IsTerminal(int(f.Fd())) {
			return true // replaced by the Trial's own pty
		}
		// /dev/null, zero, full, random, urandom; no other device.
		minor := unix.Minor(st.Rdev)
		return unix.Major(st.Rdev) == 1 && (minor == 3 || minor == 5 || minor == 7 || minor == 8 || minor == 9)
	}
	return false
}

// relayOutput is where a hidden stdout or stderr is copied to: a
// duplicate of the caller's descriptor, as the caller may close its own
// once the command started. Written through its number, 1 or 2, EPIPE
// on this process's own stdout or stderr (trialnet run's, its reader
// gone: ... | head) raised SIGPIPE here, and trialnet died of it, where
// the command handed the pipe would have; os.File does so for 1 and 2
// alone, never for a duplicate. The copy stops on the error and the
// command, its pipe's reader gone too, gets the signal instead (see
// Process.Wait).
//
// The pipe the command writes is root's and the command's group's, which
// may write it alone (pipeGroup), as a terminal's pty lets it write: `echo
// >/dev/stderr` opens it again, as it could the caller's pipe; reading its
// own output back, or changing the pipe's mode, it cannot.
type relayOutput struct {
	f   *os.File
	gid uint32
}

func (w relayOutput) Write(p []byte) (int, error) { return w.f.Write(p) }

func (w relayOutput) pipeGroup() (gid uint32, mode uint32) { return w.gid, 0o620 }

// hiddenStdio is what hideStdio set up: the relay that feeds stdin, if
// any, and the duplicates of the caller's outputs.
type hiddenStdio struct {
	in   *stdinRelay
	outs []*os.File
	gid  uint32 // the command's: its pipes' group
}

// started lets stdin's relay copy once the command holds its pipe.
func (h *hiddenStdio) started() {
	if h != nil {
		h.in.started()
	}
}

// stop ends stdin's relay and lets the outputs go, once what was copied
// to them is done with or given up (Process.Wait).
func (h *hiddenStdio) stop() {
	if h == nil {
		return
	}
	h.in.stop()
	for _, f := range h.outs {
		_ = f.Close()
	}
	h.outs = nil
}

// sameOpenFile says a and b hold the one file (or pipe, or socket).
func sameOpenFile(a, b *os.File) bool {
	sa, err1 := a.Stat()
	sb, err2 := b.Stat()
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// Process is a command running in a Trial.
type Process struct {
	cmd   *exec.Cmd
	tty   *terminal    // nil unless the caller's stdio is a terminal
	stdio *hiddenStdio // nil unless the caller's stdio is copied
	io    *launchIO    // nil unless startCommand copies its stdio
	// free lets the thread that forked the command exit (spawn).
	free func()
	// giveUp, closed by abandonOutput, ends Wait's wait for output
	// still being copied to a reader that does not take it.
	giveUp     chan struct{}
	giveUpOnce sync.Once
	// reaped is set once Wait has reaped the command: its pid, and so
	// the number of its group, is then free for the kernel to reuse.
	reaped atomic.Bool
	// initWords is the Trial init's lastWords when this launch started
	// the init, whose stderr only this process reads.
	initWords func() []byte
}

// Pid is the process id of the command, as the caller's namespace sees it.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the command's process group: the command is the
// leader of its own session and group, so its children get it too, as
// they would from a terminal. Once the command is reaped (Wait may still
// be copying its output) nothing is sent: the group's number is the
// command's pid, which another process, one of the host's among them,
// may get once the group is empty. What the command left in the Trial is
// killed with the Trial.
func (p *Process) Signal(sig os.Signal) error {
	if p.reaped.Load() {
		return os.ErrProcessDone
	}
	s, ok := sig.(syscall.Signal)
	if !ok {
		return p.cmd.Process.Signal(sig)
	}
	if err := unix.Kill(-p.Pid(), s); err != nil {
		// The group is gone, or the command left it: the command itself.
		return p.cmd.Process.Signal(sig)
	}
	return nil
}

// Wait waits for the command and returns its exit code; a command killed
// by a signal exits 128+signal, as in a shell.
func (p *Process) Wait() (int, error) {
	err := p.cmd.Wait()
	p.reaped.Store(true)
	p.free()
	if cerr := p.io.wait(p.cmd.WaitDelay, p.giveUp); err == nil {
		err = cerr
	}
	p.tty.close()
	p.stdio.stop()
	if errors.Is(err, exec.ErrWaitDelay) || errors.Is(err, syscall.EPIPE) {
		// The command exited; copying what it left behind stopped, or
		// its output's reader went away (relayOutput).
		err = nil
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return -1, err
	}
	ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return 128 + int(ws.Signal()), p.initDied(ws.Signal())
	}
	return ws.ExitStatus(), nil
}

// abandonOutput makes Wait stop waiting for the command's output to
// be copied to a reader that does not take it (a pipe nobody reads): once
// the command's deadline has passed, trialnet returns then, not when the
// reader reads. exec.Cmd.Wait abandons its copies so after WaitDelay.
func (p *Process) abandonOutput() {
	p.giveUpOnce.Do(func() { close(p.giveUp) })
}

// printable keeps lines and tabs and replaces every other control byte:
// the text goes to the operator's terminal.
func printable(b []byte) []byte {
	out := bytes.Clone(b)
	for i, c := range out {
		if (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f {
			out[i] = '?'
		}
	}
	return out
}

// initDied explains a command killed because the Trial's init crashed:
// PID 1's end kills everything in its namespace. The init's stderr closes
// before that kill (its files go first as it exits), so its last words
// are in by now, or within moments.
func (p *Process) initDied(sig syscall.Signal) error {
	if sig != syscall.SIGKILL || p.initWords == nil {
		return nil
	}
	for deadline := time.Now().Add(100 * time.Millisecond); ; time.Sleep(5 * time.Millisecond) {
		if w := p.initWords(); w != nil || time.Now().After(deadline) {
			if len(bytes.TrimSpace(w)) == 0 {
				return nil // killed, not crashed (destroy, Close), or still running
			}
			return fmt.Errorf("the Trial's init (its PID 1) crashed, which killed every process in the Trial; it said: %s", printable(bytes.TrimSpace(w)))
		}
	}
}

// Start launches c inside the Trial: cloned straight into the Trial's
// cgroup, forked from a thread that joined the network, PID and mount
// namespaces of the Trial's init, in a session of its own, so the process
// never exists outside any of them. The trialnet-exec step then drops
// every capability, enters a Landlock domain of its own, installs the
// seccomp filter and execs the command, but only on a byte from this
// launcher: a Trial's first command starts beside its new init, and the
// byte comes once the init is ready. Stdio that is a pipe, file or
// socket is copied through pipes of trialnet's instead (hideStdio).
// When the caller's stdio is a terminal, the command gets a
// pseudo-terminal relayed to it instead (see terminal). The caller must
// Wait for the Process: besides the command, that reaps, it lets go of
// the thread that forked it (spawn), held until then in the Trial's
// namespaces.
func (t *Launcher) Start(c Command) (_ *Process, err error) {
	if c, err = c.checked(t.Spec.Pools().MaxProcesses); err != nil {
		return nil, err
	}
	cg, err := os.Open(t.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("start: open Trial cgroup: %w", err)
	}
	defer cg.Close()
	end, err := beginJoin(cg)
	if err != nil {
		return nil, fmt.Errorf("start in Trial %s: %w", t.ID, err)
	}
	launched := sync.OnceFunc(end) // once the process is in the cgroup, cgroup.kill reaches it
	defer launched()
	init, initReady, err := t.init(cg, c.Dir)
	if err != nil {
		return nil, t.startFailed(c, err)
	}
	defer unix.Close(init.pidfd)
	// initReady releases the launch lock: it runs on every path, once.
	ready := sync.OnceValue(initReady)
	defer func() { _ = ready() }()
	pipes, err := newExecPipes()
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	defer pipes.errR.Close()
	defer pipes.goW.Close()

	cmd, err := t.execCmd(c, cg, pipes)
	if err != nil {
		pipes.closeChildEnds()
		return nil, err
	}
	// A new init that failed makes the steps below fail too (ESRCH): its
	// own error, joined in, says why.
	tty, relay, err := t.prepareStdio(cmd, c, init, ready, pipes)
	if err != nil {
		return nil, t.startFailed(c, err)
	}
	stdio, free, err := t.spawn(cmd, init)
	launched()
	pipes.closeChildEnds()
	tty.started()
	if err != nil {
		tty.close()
		relay.stop()
		return nil, t.startFailed(c, errors.Join(err, ready()))
	}
	p := &Process{cmd: cmd, tty: tty, stdio: relay, io: stdio, free: free, giveUp: make(chan struct{}), initWords: init.lastWords}
	if err := t.release(p, c, ready, pipes); err != nil {
		return nil, err
	}
	// Only once the command runs: a socket's bytes, copied as they come,
	// were lost to the caller when it could not start.
	relay.started()
	tty.relay(p)
	return p, nil
}

// checked refuses a Command that Start cannot run and fills in the
// process limit (the Trial's, else the default), before Start touches
// anything of the Trial's.
func (c Command) checked(trialMax int) (Command, error) {
	if len(c.Args) == 0 {
		return c, errors.New("start: no command given")
	}
	if c.UID == math.MaxUint32 || c.GID == math.MaxUint32 {
		return c, fmt.Errorf("start: uid and gid must be below %d, which the kernel reads as \"no change\" (the command would keep root)", uint32(math.MaxUint32))
	}
	if c.MaxProcs == 0 {
		c.MaxProcs = trialMax
	}
	if err := CheckMaxProcs(c.MaxProcs); err != nil {
		return c, fmt.Errorf("start: %w", err)
	}
	if c.MaxProcs == 0 {
		c.MaxProcs = DefaultMaxProcs
	}
	return c, nil
}

// startFailed words a failure of Start once it has a command and a Trial
// to name, as every such failure reads.
func (t *Launcher) startFailed(c Command, err error) error {
	return fmt.Errorf("start %s in Trial %s: %w", c.Args[0], t.ID, err)
}

// execPipes join the launcher and trialnet-exec: errW (its fd 3) carries
// why it gave up, and goR (its fd 4) the byte that lets it exec.
// trialnet-exec starts while a new init still sets the Trial up (the two
// Go runtimes start side by side), and execs the command only on that
// byte, sent once the init is ready.
type execPipes struct{ errR, errW, goR, goW *os.File }

// newExecPipes makes both pipes or, failing, leaves none open.
func newExecPipes() (execPipes, error) {
	errR, errW, err := os.Pipe()
	if err != nil {
		return execPipes{}, err
	}
	goR, goW, err := os.Pipe()
	if err != nil {
		_ = errR.Close()
		_ = errW.Close()
		return execPipes{}, err
	}
	return execPipes{errR: errR, errW: errW, goR: goR, goW: goW}, nil
}

// closeChildEnds drops the launcher's copies of trialnet-exec's ends once
// it has its own (or never will), so that errR reads EOF when it execs.
func (p execPipes) closeChildEnds() {
	_ = p.errW.Close()
	_ = p.goR.Close()
}

// execCmd is the trialnet-exec that becomes c: cloned straight into cg,
// in a session of its own, with the pipes as its fds 3 and 4 and the
// seccomp filter as its fd 5 (seccompFiles).
func (t *Launcher) execCmd(c Command, cg *os.File, pipes execPipes) (*exec.Cmd, error) {
	sockets := socketsConfined
	switch {
	case t.Spec.Nested:
		if c.UID == 0 {
			return nil, fmt.Errorf("start %s in Trial %s: a nested Trial runs no command as uid 0: its /proc is left unmasked so that sandboxes inside can mount their own, and uid 0 owns what is there; give the command a uid of its own (--uid)", c.Args[0], t.ID)
		}
		sockets = nestedMode
	case c.SocketsAnywhere || t.Spec.UnixOpen:
		sockets = socketsAnywhere
	}
	filter, err := seccompFile(t.Spec.Nested)
	if err != nil {
		return nil, fmt.Errorf("start %s in Trial %s: %w", c.Args[0], t.ID, err)
	}
	args := append([]string{execArg0, strconv.FormatUint(uint64(c.UID), 10), strconv.FormatUint(uint64(c.GID), 10),
		strconv.Itoa(c.MaxProcs), sockets, "--"}, c.Args...)
	return &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       args,
		Env:        c.environ(),
		Dir:        c.Dir,
		Stdin:      c.Stdin,
		Stdout:     c.Stdout,
		Stderr:     c.Stderr,
		ExtraFiles: []*os.File{pipes.errW, pipes.goR, filter},
		SysProcAttr: &syscall.SysProcAttr{
			Setsid:      true,
			UseCgroupFD: true,
			CgroupFD:    int(cg.Fd()),
		},
	}, nil
}

// prepareStdio sets up cmd's stdio before the fork: pipes, files and
// sockets go through pipes (hideStdio) and a terminal becomes a pty of
// the Trial's. On
// failure it has already undone what it began, pipes included, in the
// order Start's own failures do.
func (t *Launcher) prepareStdio(cmd *exec.Cmd, c Command, init initProc, ready func() error, pipes execPipes) (*terminal, *hiddenStdio, error) {
	relay, err := hideStdio(cmd, c.GID)
	abort := func() {
		pipes.closeChildEnds()
		relay.stop()
	}
	if err == nil && (c.Dir != "" || wantsTerminal(cmd)) {
		// The pty comes from the Trial's devpts, and the working directory
		// is resolved at the fork: both must see what only a ready init
		// has mounted (a Dir under /proc would be the host's otherwise).
		err = ready()
	}
	if err != nil {
		abort()
		return nil, nil, err
	}
	tty, err := newTerminal(cmd, init, c.UID, c.GID, t.populated, c.Notices)
	if err != nil {
		abort()
		return nil, nil, errors.Join(err, ready())
	}
	return tty, relay, nil
}

// spawn forks trialnet-exec from a thread in the init's namespaces, in
// the Trial's cgroup v1 groups where there are any (poolMove takes the
// thread there, or joinPools the process after), before it may run
// anything of the command. It returns startCommand's stdio copying and
// what lets the forking thread go once the command has been reaped.
//
// That thread is the command's parent, and a parent-death signal the
// command asks for (bwrap --die-with-parent, setpriv --pdeathsig,
// supervisors) fires when the thread exits, not when this process does.
// Discarded after the fork, it killed such a command most times under
// load, so it is held, parked, until the command is gone.
func (t *Launcher) spawn(cmd *exec.Cmd, init initProc) (*launchIO, func(), error) {
	groups, err := t.v1Groups()
	if err != nil {
		return nil, nil, err
	}
	move := newPoolMove(groups)
	var entered atomic.Bool
	hold := make(chan struct{})
	free := sync.OnceFunc(func() { close(hold) })
	stdio, err := startCommand(cmd, func(fn func() error) error {
		entered.Store(true)
		forked := make(chan error, 2)
		go func() {
			// EnterProcess's thread is discarded after this, as poolMove
			// needs.
			err := netns.EnterProcess(init.pidfd, t.Netns.Path, func() error {
				err := move.around(func() error {
					keepStartSlack()
					return fn()
				})()
				forked <- err
				if err == nil {
					<-hold
				}
				return err
			})
			forked <- err // when it failed before the fork; else unread
		}()
		return <-forked
	})
	if !entered.Load() {
		move.close()
	}
	if errors.Is(err, unix.EAGAIN) {
		// Cloned into a group at its pids.max: say which bound.
		if perr := t.pidsBound(); perr != nil {
			err = perr
		}
	}
	if err != nil {
		free()
		return nil, nil, err
	}
	if move.Joined() {
		return stdio, free, nil // born in the Trial's groups
	}
	// Before it runs anything: the byte that lets it exec comes later
	// (release).
	if err := joinPools(groups, cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		free()
		_ = stdio.wait(cmd.WaitDelay, nil)
		return nil, nil, err
	}
	return stdio, free, nil
}

// release lets the started trialnet-exec exec the command once the init
// is ready, and learns whether it did: a StartError says why not.
func (t *Launcher) release(p *Process, c Command, ready func() error, pipes execPipes) error {
	if err := ready(); err != nil {
		// A failed init was killed, and trialnet-exec with it (it is in
		// the init's PID namespace).
		_ = pipes.goW.Close()
		_, _ = p.Wait()
		return t.startFailed(c, err)
	}
	_, _ = pipes.goW.Write([]byte{0})
	_ = pipes.goW.Close()
	// The pipe closes on exec (close-on-exec) with nothing written, or
	// carries why trialnet-exec gave up.
	msg, _ := io.ReadAll(pipes.errR)
	if len(msg) > 0 {
		code, _ := p.Wait()
		if code != ExitCannotExecute {
			code = ExitNotFound
		}
		return &StartError{Code: code, Msg: execMessage(msg)}
	}
	return nil
}

// execMessage spells what trialnet-exec (or the Trial's init) wrote on
// giving up: early.c ends its text with a NUL and the errno in decimal,
// which is spelt here, as the Go path spells it, and the init may follow
// it with a NUL and the rest of its text (a Go error's words after %w).
func execMessage(msg []byte) string {
	text, num, ok := bytes.Cut(msg, []byte{0})
	if !ok {
		return string(msg)
	}
	num, tail, _ := bytes.Cut(num, []byte{0})
	n, err := strconv.ParseUint(string(num), 10, 16)
	if err != nil {
		return string(text) + ": errno " + string(printable(num)) + string(tail)
	}
	return string(text) + ": " + syscall.Errno(n).Error() + string(tail)
}

// Exec starts c in the Trial and waits for it, forwarding each signal
// from sigs to its process group. It leaves the Trial's other processes
// alone (several commands may share a Trial, and what a command leaves
// running ends with the Trial's Close); when ctx ends the command's
// process group is killed. It returns the command's exit code. Give it
// *os.File stdio when the command may leave children behind: with other
// writers Wait copies until every holder of the pipe has closed it.
func (t *Launcher) Exec(ctx context.Context, c Command, sigs <-chan os.Signal) (int, error) {
	p, err := t.Start(c)
	if err != nil {
		return -1, err
	}
	if c.Started != nil {
		c.Started()
	}
	// The deadline ends the wait for output too: a copy blocked on a
	// reader that never reads (a pipe of the Trial's uid, a socket) held
	// trialnet past --timeout, and past SIGTERM, for ever.
	stop := relaySignals(ctx, p, sigs, func() {
		p.abandonOutput()
		_ = p.Signal(syscall.SIGKILL)
	})
	code, err := p.Wait()
	stop()
	if cerr := ctx.Err(); cerr != nil {
		err = errors.Join(fmt.Errorf("the command was killed: %w", cerr), err)
	}
	return code, err
}

// relaySignals forwards each signal from sigs to p, and calls cancel once
// if ctx ends first, until stop is called; stop waits for the relay. A
// SIGTERM, SIGINT or SIGHUP also gives up p's output (abandonOutput).
func relaySignals(ctx context.Context, p *Process, sigs <-chan os.Signal, cancel func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case s := <-sigs:
				_ = p.Signal(s)
				if s == syscall.SIGTERM || s == syscall.SIGINT || s == syscall.SIGHUP {
					// Asked to end: what the command left to copy to a
					// reader that does not take it is not waited for, as
					// a command in its place would have died of it with
					// that output unwritten. Waited for, only SIGKILL
					// ended trialnet, and left an embedded run's Trial.
					p.abandonOutput()
				}
			case <-ctx.Done():
				cancel()
				return
			case <-done:
				return
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// Init turns this process into a Trial's init or a Trial command when it
// was started as one. Call it first thing in main and in TestMain;
// otherwise it returns.
func Init() {
	if len(os.Args) == 0 {
		return
	}
	switch os.Args[0] {
	case initSetupArg0:
		runInit()
	case initArg0:
		runReaper()
		os.Exit(0)
	case watchdogArg0:
		os.Exit(runWatchdog(os.Args[1:]))
	case execArg0:
		// Bounding set, capabilities, no_new_privs and the seccomp filter
		// are per thread: all of it must happen on the thread that execs.
		runtime.LockOSThread()
		// One P: fewer occasions for the runtime to want a new thread,
		// which it cannot make once the uid is over its process limit.
		runtime.GOMAXPROCS(1)
		// The terminal relay ignores these, and an ignored signal stays
		// ignored across exec; a caught one is reset to the default, which
		// a command on a terminal expects.
		signal.Notify(make(chan os.Signal, 1), syscall.SIGTTIN, syscall.SIGTTOU)
		code, err := trialExec(os.Args[1:])
		report := os.NewFile(3, "trialnet-exec-errors")
		_, _ = fmt.Fprintf(report, "%v", err)
		os.Exit(code)
	}
}

// trialExec is trialnet-exec's work: it finishes the confinement of the
// Trial command and execs it, returning only when it could not.
func trialExec(args []string) (int, error) {
	a, err := parseExecArgs(args)
	if err != nil {
		return ExitCannotExecute, err
	}
	if err := isolate(); err != nil {
		return ExitCannotExecute, err
	}
	// Found as root; a command the uid may not execute fails at exec.
	path, err := exec.LookPath(a.argv[0])
	if err != nil {
		return ExitNotFound, fmt.Errorf("command %q not found or not executable as uid %d: %w", a.argv[0], a.uid, err)
	}
	// The launcher writes one byte once the Trial's init is ready (its
	// /proc and devpts mounted); nothing of CMD runs before. Read while
	// still root: see becomeCommand.
	var b [1]byte
	if n, _ := unix.Read(4, b[:]); n != 1 {
		return ExitCannotExecute, errors.New("trialnet-exec: the Trial's init did not become ready")
	}
	if err := ownCgroupNamespace(); err != nil {
		return ExitCannotExecute, err
	}
	return becomeCommand(a, path)
}

// execArgs are trialnet-exec's arguments, as Start passes them: UID GID
// NPROC SOCKETS -- CMD...
type execArgs struct {
	uid, gid, nproc        uint64
	confineSockets, nested bool
	argv                   []string
}

// parseExecArgs reads trialnet-exec's arguments before it changes
// anything, so that a malformed call is refused untouched.
func parseExecArgs(args []string) (execArgs, error) {
	if len(args) < 6 || args[4] != "--" || (args[3] != socketsConfined && args[3] != socketsAnywhere && args[3] != nestedMode) {
		return execArgs{}, errors.New("trialnet-exec: bad arguments")
	}
	uid, err1 := strconv.ParseUint(args[0], 10, 32)
	gid, err2 := strconv.ParseUint(args[1], 10, 32)
	nproc, err3 := strconv.ParseUint(args[2], 10, 32)
	if err := errors.Join(err1, err2, err3); err != nil {
		return execArgs{}, fmt.Errorf("trialnet-exec: %w", err)
	}
	// (uid_t)-1 is "no change" to setresuid: the command would stay root.
	if uid == math.MaxUint32 || gid == math.MaxUint32 {
		return execArgs{}, errors.New("trialnet-exec: bad arguments")
	}
	return execArgs{
		uid: uid, gid: gid, nproc: nproc,
		confineSockets: args[3] == socketsConfined, nested: args[3] == nestedMode,
		argv: args[5:],
	}, nil
}

// ownCgroupNamespace roots trialnet-exec's cgroup namespace at the
// Trial's cgroup, so that even a uid-0 Trial cannot move itself into a
// cgroup outside it. It comes after the launcher's byte: a command not
// born in the Trial's cgroup v1 groups is moved there before that byte
// (joinPools), and a namespace made before the move would name them
// outside it, where a JVM, joining /proc/self/cgroup with the mounts,
// finds no memory limit.
func ownCgroupNamespace() error {
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("trialnet-exec: unshare cgroup namespace: %w", err)
	}
	return nil
}

// isolate cuts trialnet-exec off from what it inherited, while it is still
// root: its OOM standing and every descriptor but stdio.
func isolate() error {
	if err := oomFirst(); err != nil {
		return fmt.Errorf("trialnet-exec: %w", err)
	}
	// Only stdio survives exec: an inherited socket is a way out.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("trialnet-exec: close inherited descriptors: %w", err)
	}
	return nil
}

// becomeCommand sets the command's limits, drops to its uid, confines it
// and execs path. It is one straight run on purpose: from setuid on, only
// raw, non-blocking syscalls on this thread may follow (see the process
// limit below), and the seccomp filter must come last before exec.
func becomeCommand(a execArgs, path string) (int, error) {
	// Set while still root (raising the hard limit needs
	// CAP_SYS_RESOURCE), and before setuid, which marks the process when
	// the uid is over it already: exec then fails with EAGAIN. From
	// setuid on, a uid over its limit cannot make a thread either: the
	// Go runtime would abort if it needed one (a blocking syscall hands
	// its P to a new thread), so only raw, non-blocking syscalls follow.
	lim := unix.Rlimit{Cur: a.nproc, Max: a.nproc}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &lim); err != nil {
		return ExitCannotExecute, fmt.Errorf("trialnet-exec: set the process limit: %w", err)
	}
	// No core dumps, hard limit too: where core_pattern pipes to a helper
	// (systemd-coredump, apport), that helper runs as root outside the
	// Trial and is handed the crashed process's memory. See CoreLimit.
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{Cur: CoreLimit, Max: CoreLimit}); err != nil {
		return ExitCannotExecute, fmt.Errorf("trialnet-exec: set the core size limit: %w", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_MSGQUEUE, &unix.Rlimit{Cur: MsgQueueBytes, Max: MsgQueueBytes}); err != nil {
		return ExitCannotExecute, fmt.Errorf("trialnet-exec: set the message queue limit: %w", err)
	}
	if err := dropPrivileges(int(a.uid), int(a.gid)); err != nil {
		return ExitCannotExecute, fmt.Errorf("trialnet-exec: %w", err)
	}
	if err := reachCwdAsUID(a.uid); err != nil {
		return ExitCannotExecute, err
	}
	// A new anonymous session keyring, the Trial user's own: the
	// launcher's (root's keys among them) is not handed in. The filter
	// refuses the key calls too; this holds where it could not (a Trial
	// that possesses a key sees it in /proc/keys).
	if _, _, errno := unix.RawSyscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0); errno != 0 && errno != unix.ENOSYS {
		return ExitCannotExecute, fmt.Errorf("trialnet-exec: join a session keyring of its own: %w", errno)
	}
	// Where the kernel has no Landlock, the PID namespace still hides
	// every pid outside; the layers report it.
	if err := enterLandlock(a.confineSockets, a.nested); err != nil && !errors.Is(err, ErrNoLandlock) {
		return ExitCannotExecute, fmt.Errorf("trialnet-exec: %w", err)
	}
	// Last before exec: from here on the Go runtime must not need a
	// refused call, and the filter is inherited by everything CMD starts.
	if err := installSeccomp(a.nested); err != nil {
		return ExitCannotExecute, fmt.Errorf("trialnet-exec: %w", err)
	}
	err := unix.Exec(path, a.argv, os.Environ())
	if errors.Is(err, unix.EACCES) {
		return ExitNotFound, fmt.Errorf("command %q not found or not executable as uid %d: %w", a.argv[0], a.uid, err)
	}
	if errors.Is(err, unix.EAGAIN) {
		return ExitCannotExecute, fmt.Errorf("exec %s: uid %d already has %d or more processes or threads, this command's process limit, which counts all of the uid's, in every Trial and outside them (give each Trial its own uid, or raise --max-procs): %w", path, a.uid, a.nproc, err)
	}
	return ExitCannotExecute, fmt.Errorf("exec %s: %w", path, err)
}

// reachCwdAsUID reaches the working directory again by its path, now as
// the command's uid: the launcher's chdir ran as root, and a link the
// Trial left at the path given as Dir (--workdir) would start the command
// beneath a directory its uid cannot search (root's 0700), where it reads
// what that directory keeps from it. Raw calls only: see becomeCommand.
func reachCwdAsUID(uid uint64) error {
	var buf [unix.PathMax]byte
	n, _, errno := unix.RawSyscall(unix.SYS_GETCWD, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0)
	if errno != 0 {
		return fmt.Errorf("trialnet-exec: read the working directory's path: %w", errno)
	}
	// "(unreachable)..." would be a path relative to the directory itself.
	if n < 2 || buf[0] != '/' {
		return fmt.Errorf("trialnet-exec: the working directory is outside the Trial's root: %w", unix.ENOENT)
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_CHDIR, uintptr(unsafe.Pointer(&buf[0])), 0, 0); errno != 0 {
		return fmt.Errorf("trialnet-exec: the working directory %q is not reachable as uid %d (give --workdir a directory that user can enter by its path): %w", buf[:n-1], uid, errno)
	}
	return nil
}

// oomFirst makes this process, and everything it starts, the kernel's
// first choice when memory runs out: a Trial that allocates without end
// (the usual way a runaway Harness fails) is what the OOM killer ends,
// not the agent or the host's services. A Trial may set its own score
// back to 0, the default, not below.
func oomFirst() error {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0); err != nil {
		return fmt.Errorf("make the Trial the OOM killer's first choice: %w", err)
	}
	return nil
}

// dropCapabilities is dropPrivileges without changing user: for the
// Trial's init, which stays uid 0 so that no Trial user may signal or
// trace it, and holds no capability.
func dropCapabilities() error { return dropPrivileges(-1, -1) }

// dropPrivileges empties the bounding set (so not even a setuid binary can
// regain net_admin, net_raw or sys_admin), switches to uid/gid unless they
// are negative, clears every capability set and sets no_new_privs.
func dropPrivileges(uid, gid int) error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if uid >= 0 {
		// On this thread only, which then execs (and exec ends the
		// others). Go's own Setuid changes every thread, and a thread of
		// a uid over its process limit cannot clone: a runtime that then
		// wanted a new thread aborted before the exec could fail with
		// EAGAIN, and the launcher saw a crash, not why. The others stay
		// root, without the bounding set, and make new threads freely.
		if _, _, errno := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); errno != 0 {
			return fmt.Errorf("setgroups: %w", errno)
		}
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); errno != 0 {
			return fmt.Errorf("setgid %d: %w", gid, errno)
		}
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); errno != 0 {
			return fmt.Errorf("setuid %d: %w", uid, errno)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	return nil
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read cap_last_cap: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
