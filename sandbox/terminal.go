//go:build linux

package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/internal/termquery"
	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// terminal relays a Trial command's pseudo-terminal to the caller's
// terminal, as sudo does with use_pty: the command never holds a
// descriptor of the caller's terminal, so it cannot type into the
// operator's shell (TIOCSTI), and its session and controlling terminal
// are its own. ^C and ^Z reach it through its own line discipline, and
// window size changes are copied over.
//
// Only the operator stops this process: a ^Z typed on the caller's
// terminal suspends the command's process group and this process (see
// copyInput). A stop the Trial makes (SIGSTOP to itself, a ptrace-stop,
// a stopped group) is the Trial's alone, and the relay, the agent and
// the --timeout run on; SIGTTIN and SIGTTOU are ignored, so that output
// the Trial makes this process write cannot stop it either.
type terminal struct {
	user   *os.File  // the caller's terminal: the first stdio that is one
	in     *os.File  // the caller's stdin, when it is that terminal
	out    io.Writer // where the command's terminal output goes
	master *os.File
	slave  *os.File
	saved  *term.State // the caller's mode, to restore
	// susp is the caller's own suspend character (0: none). Only it can
	// stop trialnet: the Trial sets its terminal's, and could make any
	// key (Enter) a stop of trialnet.
	susp byte
	raw  bool // the caller's terminal is in raw mode, made by the relay
	// live reports whether the Trial still has processes: suspended,
	// this process waits for the foreground only while it has.
	live func() bool

	input     *stoppable // the caller's keystrokes, while relayed
	winch     chan os.Signal
	modeMu    sync.Mutex // orders suspends and close: both change the mode
	wg        sync.WaitGroup
	closeOnce sync.Once
	// tty is out when it is a terminal: the Trial's queries reach it,
	// and its answers come back on its input.
	tty     *os.File
	scanMu  sync.Mutex
	scan    termquery.Output // what the Trial wrote to tty, as guard let it through
	guard   termquery.Guard  // no clipboard writes reach the caller's terminal
	answers termquery.Answers
	// answered counts the status reports relayed to the Trial: answers
	// to status requests of its own, which no fence waits for.
	answered atomic.Int64
	// wrote counts the bytes of output the caller's terminal took: while
	// it grows, the terminal is still taking the Trial's output in.
	wrote atomic.Int64
	// notices is trialnet's stderr, where close says that answers may
	// still come (see settle); nil: nowhere.
	notices io.Writer
}

// The bounds of the wait at the end for the terminal's answers to the
// Trial's queries (see settle). The wait lasts while the terminal shows
// signs of life (it takes output, or sends bytes) and ends after
// fenceWait without one, or settleWait after the Trial's end, whatever
// comes: a terminal that answers no status request costs fenceWait, and
// one that keeps sending cannot hold the teardown. A terminal far behind
// the output (megabytes buffered by sshd over a slow link) may show no
// sign for longer, and the operator is told (settleNotice). answerWait is
// the window when no fence can be used (the output did not drain, the
// input cannot be read), from when the output has drained: an answer from
// a terminal behind an ssh link or two.
const (
	fenceWait  = 2 * time.Second
	settleWait = 10 * time.Second
	answerWait = 500 * time.Millisecond
	drainWait  = time.Second
)

// outChunk is the most the relay writes to the caller's terminal at once,
// so that a terminal taking output slowly shows it is taking it (wrote).
const outChunk = 4096

// scanner notes what the Trial writes to the caller's terminal, then
// writes it, without the clipboard writes that termquery.Guard stops.
type scanner struct{ t *terminal }

func (s scanner) Write(p []byte) (int, error) {
	s.t.scanMu.Lock()
	q := s.t.guard.Filter(make([]byte, 0, len(p)+8), p)
	_, _ = s.t.scan.Write(q)
	s.t.scanMu.Unlock()
	n := 0
	for n < len(q) {
		m, err := s.t.out.Write(q[n:min(len(q), n+outChunk)])
		n += m
		s.t.wrote.Add(int64(m))
		if err != nil {
			return min(n, len(p)), err
		}
	}
	return len(p), nil
}

// patience bounds a wait at the end that goes on while the terminal
// shows signs of life: it ends quiet after the last, or at end.
type patience struct {
	end   time.Time
	quiet time.Duration
	last  time.Time
	wrote int64 // the terminal's output count last seen
}

func newPatience(quiet, total time.Duration) *patience {
	now := time.Now()
	return &patience{end: now.Add(total), quiet: quiet, last: now}
}

// alive notes a sign of life.
func (p *patience) alive() { p.last = time.Now() }

// took notes the count of output the terminal has taken: a change is a
// sign of life.
func (p *patience) took(wrote int64) {
	if wrote != p.wrote {
		p.wrote = wrote
		p.alive()
	}
}

// left is how long the wait may still last.
func (p *patience) left() time.Duration {
	quiet := time.Until(p.last.Add(p.quiet))
	return min(quiet, time.Until(p.end))
}

// terminalOf is v when it is a terminal, else nil.
func terminalOf(v any) *os.File {
	f, ok := v.(*os.File)
	if ok && f != nil && term.IsTerminal(int(f.Fd())) {
		return f
	}
	return nil
}

// wantsTerminal reports whether newTerminal gives cmd a pty.
func wantsTerminal(cmd *exec.Cmd) bool {
	return terminalOf(cmd.Stdin) != nil || terminalOf(cmd.Stdout) != nil || terminalOf(cmd.Stderr) != nil
}

// newTerminal gives cmd a pseudo-terminal in place of each of its stdio
// streams that is a terminal; others pass through untouched, so pipes and
// files stay exact. The pty comes from the Trial's own devpts instance
// (through its init's root), so that inside the Trial it has a name, and
// belongs to uid:gid, as a login terminal does. live says whether the
// Trial still has processes; notices is trialnet's stderr (see
// Command.Notices). It returns nil when none is a terminal.
func newTerminal(cmd *exec.Cmd, init initProc, uid, gid uint32, live func() bool, notices io.Writer) (_ *terminal, err error) {
	in, out, errf := terminalOf(cmd.Stdin), terminalOf(cmd.Stdout), terminalOf(cmd.Stderr)
	t := &terminal{in: in, live: live, notices: notices}
	for _, f := range []*os.File{in, out, errf} {
		if f != nil && t.user == nil {
			t.user = f
		}
	}
	if t.user == nil {
		return nil, nil
	}
	// Ignored, a read or mode change from the background fails and a
	// write goes through, where the kernel would stop this process: the
	// relay waits for the foreground itself (awaitForeground), and stops
	// only while the Trial lives.
	signal.Ignore(syscall.SIGTTIN, syscall.SIGTTOU)
	switch {
	case out != nil:
		t.out, t.tty = out, out
	case errf != nil:
		t.out, t.tty = errf, errf
	default:
		t.out = io.Discard // only stdin is a terminal; its echo is not output
	}
	if err := t.open(fmt.Sprintf("/proc/%d/root/dev/pts/ptmx", init.pid), uid, gid); err != nil {
		t.close()
		return nil, fmt.Errorf("open the Trial's terminal: %w", err)
	}
	if !init.alive() {
		t.close()
		return nil, errors.New("open the Trial's terminal: the Trial's init is gone")
	}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	ctty := -1
	if in != nil {
		cmd.Stdin, ctty = t.slave, 0
	}
	if out != nil {
		cmd.Stdout = t.slave
		if ctty < 0 {
			ctty = 1
		}
	}
	if errf != nil {
		cmd.Stderr = t.slave
		if ctty < 0 {
			ctty = 2
		}
	}
	cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, ctty
	if in != nil {
		// Started in the background (&), it waits for fg, as a job that
		// sets the mode would.
		if !t.awaitForeground() {
			return nil, errors.New("open the Trial's terminal: the Trial ended (its --timeout?) while trialnet waited, stopped, to be brought to the foreground of its terminal")
		}
		if err := t.makeRaw(); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// open makes the pty pair with the caller's terminal mode and size.
func (t *terminal) open(ptmx string, uid, gid uint32) error {
	m, err := unix.Open(ptmx, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	// Non-blocking: the runtime poller then serves reads with deadlines.
	t.master = os.NewFile(uintptr(m), "pty-master")
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		return err
	}
	// TIOCGPTPEER opens the peer without a path, so no other pty can be
	// swapped in under /dev/pts between unlock and open.
	s, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		return errno
	}
	t.slave = os.NewFile(s, "pty-slave")
	if err := unix.Fchown(int(s), int(uid), int(gid)); err != nil {
		return err
	}
	if tio, err := unix.IoctlGetTermios(int(t.user.Fd()), unix.TCGETS); err == nil {
		_ = unix.IoctlSetTermios(int(s), unix.TCSETS, tio)
	}
	t.copySize()
	return nil
}

func (t *terminal) copySize() {
	if ws, err := unix.IoctlGetWinsize(int(t.user.Fd()), unix.TIOCGWINSZ); err == nil {
		_ = unix.IoctlSetWinsize(int(t.master.Fd()), unix.TIOCSWINSZ, ws)
	}
}

// started drops this process's copy of the slave once the command has it,
// so that the master sees EOF when the Trial is done with it.
func (t *terminal) started() {
	if t != nil && t.slave != nil {
		_ = t.slave.Close()
		t.slave = nil
	}
}

// relay copies output and input and follows window size changes for the
// command p.
func (t *terminal) relay(p *Process) {
	if t == nil {
		return
	}
	t.wg.Go(func() {
		var w io.Writer = t.out
		if t.tty != nil {
			w = scanner{t}
		}
		_, _ = io.Copy(w, t.master)
	})
	t.winch = make(chan os.Signal, 1)
	signal.Notify(t.winch, syscall.SIGWINCH)
	go func() {
		for range t.winch {
			t.copySize()
		}
	}()
	if t.in == nil {
		return
	}
	var err error
	if t.input, err = newStoppable(int(t.in.Fd())); err == nil {
		t.wg.Go(func() { t.copyInput(p.Pid()) })
	}
}

// copyInput relays the caller's keystrokes to the command whose process
// group is pid, until close stops it.
func (t *terminal) copyInput(pid int) {
	defer t.input.close()
	buf := make([]byte, 4096)
	retried := false
	for {
		n, err := t.input.Read(buf)
		if errors.Is(err, unix.EIO) && !t.foreground() {
			// Read from the background (SIGTTIN is ignored): the
			// keystrokes are the shell's until this process is in the
			// foreground again.
			retried = false
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if errors.Is(err, unix.EIO) && !retried {
			// Read from the background, then brought to the foreground
			// (fg) before the check: read again. A terminal whose other
			// side is gone gives EIO in the foreground too; it ends the
			// relay at the second.
			retried = true
			continue
		}
		if err != nil {
			return
		}
		retried = false
		in := buf[:n]
		t.answered.Add(int64(t.answers.Scan(in)))
		if i := t.suspendAt(in, pid); i >= 0 {
			if _, err := t.master.Write(in[:i]); err != nil {
				return
			}
			// The command leads a session of its own, so its process
			// group is orphaned and the kernel drops the SIGTSTP its
			// line discipline sends: a handler still runs, and SIGSTOP
			// does what ^Z means. The relay then stops this process.
			_ = unix.Kill(-pid, unix.SIGTSTP)
			_ = unix.Kill(-pid, unix.SIGSTOP)
			waitState(pid, 'T', time.Second)
			t.suspend(pid)
			in = in[i+1:]
		}
		if _, err := t.master.Write(in); err != nil {
			return
		}
	}
}

// suspendAt is the index of the caller's suspend character (^Z) in in,
// when the Trial's terminal would also turn it into SIGTSTP for the
// command's own process group, or -1: when the command turned signals off (an editor in raw
// mode) or put another group in the foreground (a shell with job
// control, which stops its own jobs), the byte is the command's.
func (t *terminal) suspendAt(in []byte, pid int) int {
	tio, err := unix.IoctlGetTermios(int(t.master.Fd()), unix.TCGETS)
	if err != nil || tio.Lflag&unix.ISIG == 0 || t.susp == 0 || tio.Cc[unix.VSUSP] != t.susp {
		return -1
	}
	if fg, err := unix.IoctlGetInt(int(t.master.Fd()), unix.TIOCGPGRP); err != nil || fg != pid {
		return -1
	}
	return bytes.IndexByte(in, tio.Cc[unix.VSUSP])
}

// suspend stops this process, with the caller's terminal mode restored,
// while the command is stopped by the operator's ^Z; once in the
// foreground again (fg) it makes the terminal raw again and continues the
// command. Continued in the background (bg) it stops again, as a job that
// sets the mode would; continued once the Trial is gone (the --timeout
// watchdog killed it) it returns, for the teardown to follow.
func (t *terminal) suspend(pid int) {
	t.modeMu.Lock()
	defer t.modeMu.Unlock()
	t.restoreMode()
	stopSelf()
	if !t.awaitForeground() {
		return
	}
	// The size may have changed meanwhile.
	_ = t.makeRaw()
	t.copySize()
	_ = unix.Kill(-pid, unix.SIGCONT)
}

// awaitForeground stops this process until it is in the foreground of
// the caller's terminal, or the Trial has no process left, and reports
// whether it is.
func (t *terminal) awaitForeground() bool {
	for !t.foreground() {
		if !t.live() {
			return false
		}
		stopSelf()
	}
	return true
}

// stopSelf stops this process and returns once it is continued. The stop
// is sent to this thread: sent to the process, it is taken by any thread,
// and this one would run on for a moment, deciding on a stale view.
func stopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = unix.Tgkill(unix.Getpid(), unix.Gettid(), unix.SIGSTOP)
}

// foreground reports whether this process's group is the foreground one
// of the caller's terminal, or the terminal is not its controlling one
// (no job control applies then).
func (t *terminal) foreground() bool {
	pgrp, err := unix.IoctlGetInt(int(t.user.Fd()), unix.TIOCGPGRP)
	return err != nil || pgrp == unix.Getpgrp()
}

// makeRaw puts the caller's terminal in raw mode, keeping its mode to
// restore.
func (t *terminal) makeRaw() error {
	if tio, err := unix.IoctlGetTermios(int(t.in.Fd()), unix.TCGETS); err == nil && tio.Lflag&unix.ISIG != 0 {
		t.susp = tio.Cc[unix.VSUSP]
	}
	st, err := term.MakeRaw(int(t.in.Fd()))
	if err != nil {
		return err
	}
	t.saved, t.raw = st, true
	return nil
}

// restoreMode gives the caller's terminal its mode back. Input not yet
// relayed is dropped: it is the Trial's, or a terminal's answer to a
// query the Trial wrote, never the caller's shell's. In the background it
// leaves the terminal alone: its mode is the shell's then.
func (t *terminal) restoreMode() {
	if t.raw && t.foreground() {
		_ = term.Restore(int(t.in.Fd()), t.saved)
		_ = unix.IoctlSetInt(int(t.in.Fd()), unix.TCFLSH, unix.TCIFLUSH)
	}
	t.raw = false
}

// settle drops what the caller's terminal sends until it has answered
// every query the Trial wrote, whatever stdin is: answers (cursor
// position, device attributes, colours) would otherwise wait in the
// terminal's input for the caller's shell, as typed text, however late
// they come (output buffered over ssh is read long after it was written).
// After output that may hold a query it writes a fence (termquery.Fence:
// a status request) and reads the terminal's input until the fence's
// answer, which a terminal sends after the answers to everything before
// it, for as long as p lets it. relayed says that the relay's copies
// ended, so that nothing else writes to the terminal or reads its input.
// In the background it leaves the terminal alone: its input is the
// shell's then. It returns why answers may still come, or "".
func (t *terminal) settle(relayed bool, p *patience) string {
	if !t.foreground() {
		return ""
	}
	flush := func() { _ = unix.IoctlSetInt(int(t.user.Fd()), unix.TCFLSH, unix.TCIFLUSH) }
	defer flush()
	t.scanMu.Lock()
	query, status := t.scan.Pending()
	quiet := t.scan.Quiet()
	t.scanMu.Unlock()
	if t.tty == nil || !query {
		return ""
	}
	drained := drain(t.tty)
	until := time.Now().Add(answerWait)
	if relayed && drained {
		// Each status request of the Trial's not yet answered is
		// answered before the fence: its answer has the same shape.
		switch t.fence(max(1, status-int(t.answered.Load())+1), !quiet, p) {
		case fenceAnswered, fenceGone:
			return ""
		case fenceUnanswered:
			// The wait outlasted the window.
			return fmt.Sprintf("the terminal did not answer trialnet's status request, written after the Trial's output, within %v of its last sign of life (%v at most): it may be far behind that output (a slow link) or answer no status request", fenceWait, settleWait)
		}
		// Unused, the window is what is left.
	}
	for time.Now().Before(until) {
		time.Sleep(10 * time.Millisecond)
		flush()
	}
	return "the terminal could not be asked whether it had answered every query of the Trial's (its output had not all gone out, or its input could not be read)"
}

// settleNotice is what close says on trialnet's stderr when settle gave
// up (why): the operator, not the Trial, may still stop an answer from
// running as a command.
func settleNotice(why string) string {
	return "trialnet: " + why + "; its answers to the Trial's queries may still come and be typed into your shell: clear the line (Ctrl-U) before you type\n"
}

// What came of a fence.
type fenceResult int

const (
	fenceAnswered   fenceResult = iota
	fenceUnanswered             // not within the wait
	fenceUnusable               // not written, or its answer could not be read
	fenceGone                   // the terminal hung up: no shell reads it now
)

// fence writes the fence after the Trial's output (ending a sequence it
// left unfinished, when cancel) and drops the terminal's input until the
// want-th status report, for as long as p lets it: every byte that comes
// is a sign of life.
func (t *terminal) fence(want int, cancel bool, p *patience) fenceResult {
	fd, release, err := t.answerInput()
	if err != nil {
		return fenceUnusable
	}
	defer release()
	f := termquery.Fence
	if cancel {
		f = termquery.Cancel + f
	}
	// A terminal that takes no output (a stalled link) would hold the
	// write, and the teardown with it: the write is left behind.
	wrote := make(chan error, 1)
	go func() {
		_, err := io.WriteString(t.tty, f)
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			return fenceUnusable
		}
	case <-time.After(min(drainWait, p.left())):
		return fenceUnusable
	}
	p.alive()
	buf := make([]byte, 4096)
	for {
		left := p.left()
		if left <= 0 {
			return fenceUnanswered
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(left.Milliseconds())+1); err != nil && err != unix.EINTR {
			return fenceUnusable
		}
		if fds[0].Revents&unix.POLLIN == 0 {
			if fds[0].Revents != 0 {
				return fenceGone
			}
			continue
		}
		n, err := unix.Read(fd, buf)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return fenceGone
		}
		p.alive()
		if want -= t.answers.Scan(buf[:n]); want <= 0 {
			t.scanMu.Lock()
			t.scan.Settle()
			t.scanMu.Unlock()
			t.answered.Store(0)
			return fenceAnswered
		}
	}
}

// answerInput is a descriptor to read the answers from, in a mode that
// passes them at once (not a line at a time, and unechoed), and what
// undoes both. It is the caller's terminal that the Trial's output went
// to, reopened for reading when that descriptor is write-only.
func (t *terminal) answerInput() (int, func(), error) {
	fd := int(t.tty.Fd())
	closeFd := func() {}
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil {
		return -1, nil, err
	} else if fl&unix.O_ACCMODE == unix.O_WRONLY {
		r, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return -1, nil, err
		}
		fd, closeFd = r, func() { _ = unix.Close(r) }
	}
	tio, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		closeFd()
		return -1, nil, err
	}
	if tio.Lflag&(unix.ICANON|unix.ECHO) == 0 {
		return fd, closeFd, nil // raw already: the relay's, or the caller's own
	}
	saved := *tio
	tio.Lflag &^= unix.ICANON | unix.ECHO
	tio.Cc[unix.VMIN], tio.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, tio); err != nil {
		closeFd()
		return -1, nil, err
	}
	return fd, func() {
		_ = unix.IoctlSetTermios(fd, unix.TCSETS, &saved)
		closeFd()
	}, nil
}

// drain waits, bounded by drainWait, until f's output has been sent
// (tcdrain): on a serial line, until the terminal has it. A pty reports
// it sent at once; what its reader (sshd) buffers, the fence's wait
// covers while the terminal shows signs of life.
func drain(f *os.File) bool {
	done := make(chan error, 1)
	go func() { done <- unix.IoctlSetInt(int(f.Fd()), unix.TCSBRK, 1) }()
	select {
	case err := <-done:
		return err == nil
	case <-time.After(drainWait):
		return false
	}
}

// waitState waits, bounded, until process pid is in state (as
// /proc/PID/stat's third field says).
func waitState(pid int, state byte, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == state {
			return
		}
	}
}

// close ends the relay once the command has exited: what it wrote is
// drained (briefly, as children it left may hold the terminal open), and
// the caller's terminal mode is restored; when the terminal's answers
// may still come, it says so on notices, in the caller's mode. It is
// bounded (settleWait) whatever the Trial does, as the teardown waits for
// it: keystrokes waiting for a Trial that never reads them are dropped,
// and a write to a caller's terminal that nobody reads is left behind.
func (t *terminal) close() {
	if t == nil {
		return
	}
	t.closeOnce.Do(func() {
		if t.winch != nil {
			signal.Stop(t.winch)
			close(t.winch)
		}
		if t.input != nil {
			t.input.stop()
		}
		if t.master != nil {
			_ = t.master.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			_ = t.master.SetWriteDeadline(time.Now())
		}
		p := newPatience(fenceWait, settleWait)
		relayed := t.awaitRelay(p)
		t.modeMu.Lock()
		why := t.settle(relayed, p) // raw still, when the relay made it so
		t.restoreMode()
		t.modeMu.Unlock()
		if why != "" && t.notices != nil {
			_, _ = io.WriteString(t.notices, settleNotice(why))
		}
		if t.slave != nil {
			_ = t.slave.Close()
		}
		if t.master != nil {
			_ = t.master.Close()
		}
	})
}

// awaitRelay waits for the relay's copies to end, while p lets it: the
// output they write is what the terminal must take before the fence. A
// terminal that takes it slowly (over a slow link) shows signs of life;
// one that takes none ends the wait. It reports whether they ended.
func (t *terminal) awaitRelay(p *patience) bool {
	done := make(chan struct{})
	go func() {
		t.wg.Wait()
		close(done)
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return true
		case <-tick.C:
			p.took(t.wrote.Load())
			if p.left() <= 0 {
				return false
			}
		}
	}
}
