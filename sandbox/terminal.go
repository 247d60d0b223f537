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
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// terminal relays a Trial command's pseudo-terminal to the caller's
// terminal, as sudo does with use_pty: the command never holds a
// descriptor of the caller's terminal, so it cannot type into the
// operator's shell (TIOCSTI), and its session and controlling terminal
// are its own. ^C and ^Z reach it through its own line discipline, window
// size changes are copied over, and when it stops the caller stops too.
type terminal struct {
	user   *os.File  // the caller's terminal: the first stdio that is one
	in     *os.File  // the caller's stdin, when it is that terminal
	out    io.Writer // where the command's terminal output goes
	master *os.File
	slave  *os.File
	saved  *term.State // the caller's mode while raw; nil when not raw

	input     *stoppable // the caller's keystrokes, while relayed
	winch     chan os.Signal
	modeMu    sync.Mutex   // orders suspends and close: both change the mode
	ownStops  atomic.Int32 // stops the relay made itself (^Z) and handles
	wg        sync.WaitGroup
	closeOnce sync.Once
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
// belongs to uid:gid, as a login terminal does. It returns nil when none
// is a terminal.
func newTerminal(cmd *exec.Cmd, init initProc, uid, gid uint32) (_ *terminal, err error) {
	in, out, errf := terminalOf(cmd.Stdin), terminalOf(cmd.Stdout), terminalOf(cmd.Stderr)
	t := &terminal{in: in}
	for _, f := range []*os.File{in, out, errf} {
		if f != nil && t.user == nil {
			t.user = f
		}
	}
	if t.user == nil {
		return nil, nil
	}
	switch {
	case out != nil:
		t.out = out
	case errf != nil:
		t.out = errf
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
		if t.saved, err = term.MakeRaw(int(in.Fd())); err != nil {
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

// relay copies output and input, follows window size changes and stops
// and continues with the command p.
func (t *terminal) relay(p *Process) {
	if t == nil {
		return
	}
	t.wg.Go(func() { _, _ = io.Copy(t.out, t.master) })
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
	if t.input, err = newStoppable(t.in); err == nil {
		t.wg.Go(func() { t.copyInput(p.Pid()) })
	}
	if pidfd, err := unix.PidfdOpen(p.Pid(), 0); err == nil {
		go t.followStops(p.Pid(), pidfd)
	}
}

// copyInput relays the caller's keystrokes to the command whose process
// group is pid, until close stops it.
func (t *terminal) copyInput(pid int) {
	defer t.input.close()
	buf := make([]byte, 4096)
	for {
		n, err := t.input.Read(buf)
		if err != nil {
			return
		}
		in := buf[:n]
		if i := t.suspendAt(in, pid); i >= 0 {
			if _, err := t.master.Write(in[:i]); err != nil {
				return
			}
			// The command leads a session of its own, so its process
			// group is orphaned and the kernel drops the SIGTSTP its
			// line discipline sends: a handler still runs, and SIGSTOP
			// does what ^Z means. The relay then stops this process
			// itself; followStops leaves that stop to it.
			t.ownStops.Add(1)
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

// suspendAt is the index of a suspend character (^Z) in in that the
// Trial's terminal would turn into SIGTSTP for the command's own process
// group, or -1: when the command turned signals off (an editor in raw
// mode) or put another group in the foreground (a shell with job
// control, which stops its own jobs), the byte is the command's.
func (t *terminal) suspendAt(in []byte, pid int) int {
	tio, err := unix.IoctlGetTermios(int(t.master.Fd()), unix.TCGETS)
	if err != nil || tio.Lflag&unix.ISIG == 0 || tio.Cc[unix.VSUSP] == 0 {
		return -1
	}
	if fg, err := unix.IoctlGetInt(int(t.master.Fd()), unix.TIOCGPGRP); err != nil || fg != pid {
		return -1
	}
	return bytes.IndexByte(in, tio.Cc[unix.VSUSP])
}

// followStops stops this process when the command is stopped (^Z), with
// the caller's terminal mode restored, and continues the command when
// this process is continued (fg). It ends once the command is reaped.
func (t *terminal) followStops(pid, pidfd int) {
	defer unix.Close(pidfd)
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WSTOPPED, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// ECHILD also comes, briefly, while the command moves from
			// the discarded thread that forked it to another parent
			// thread: it is over only once the process is gone.
			if unix.PidfdSendSignal(pidfd, 0, nil, 0) == nil {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return
		}
		if t.ownStops.Load() > 0 {
			t.ownStops.Add(-1) // the relay's own ^Z: it suspends itself
			continue
		}
		t.suspend(pid)
	}
}

// suspend stops this process, with the caller's terminal mode restored,
// while the command is stopped; once continued (fg) it makes the terminal
// raw again and continues the command.
func (t *terminal) suspend(pid int) {
	t.modeMu.Lock()
	defer t.modeMu.Unlock()
	if t.saved != nil {
		_ = term.Restore(int(t.in.Fd()), t.saved)
		_ = unix.IoctlSetInt(int(t.in.Fd()), unix.TCFLSH, unix.TCIFLUSH)
	}
	_ = unix.Kill(unix.Getpid(), unix.SIGSTOP)
	// Continued: raw again, the size may have changed meanwhile.
	if st, err := term.MakeRaw(int(t.in.Fd())); err == nil {
		t.saved = st
	}
	t.copySize()
	_ = unix.Kill(-pid, unix.SIGCONT)
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
// the caller's terminal mode is restored.
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
		}
		t.wg.Wait()
		t.modeMu.Lock()
		if t.saved != nil {
			_ = term.Restore(int(t.in.Fd()), t.saved)
			// Input not yet relayed is the Trial's, or a terminal's answer
			// to a query the Trial wrote: never the caller's shell's.
			_ = unix.IoctlSetInt(int(t.in.Fd()), unix.TCFLSH, unix.TCIFLUSH)
		}
		t.modeMu.Unlock()
		if t.slave != nil {
			_ = t.slave.Close()
		}
		if t.master != nil {
			_ = t.master.Close()
		}
	})
}
