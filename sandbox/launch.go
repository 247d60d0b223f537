//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// launchIO is the stdio plumbing exec.Cmd.Start would have done for a
// command that startCommand started without it: a file passes as it is,
// nil is /dev/null, and any other reader or writer is copied through a
// pipe, as exec.Cmd does, WaitDelay included.
type launchIO struct {
	child           [3]*os.File // the command's stdin, stdout and stderr
	closeAfterStart []*os.File  // the command's ends, and /dev/null
	parentEnds      []*os.File  // the launcher's ends, closed after Wait
	outputs         []*os.File  // those of parentEnds the command writes to
	copiers         []func() error
	done            chan error
	// launched is closed once the launch's own goroutine has let go of
	// what it held (its end of the started pipe): wait waits for it, so
	// that no descriptor outlives the command's Wait.
	launched chan struct{}
	waited   bool // a second Wait finds the copies done
}

// newLaunchIO sets up cmd's stdio; on failure it leaves nothing open.
func newLaunchIO(cmd *exec.Cmd) (*launchIO, error) {
	l := &launchIO{}
	var err error
	if l.child[0], err = l.input(cmd.Stdin); err == nil {
		l.child[1], err = l.output(cmd.Stdout)
	}
	if err == nil {
		if cmd.Stderr != nil && interfaceEqual(cmd.Stderr, cmd.Stdout) {
			l.child[2] = l.child[1] // one pipe: the two interleave as written
		} else {
			l.child[2], err = l.output(cmd.Stderr)
		}
	}
	if err != nil {
		l.abort()
		return nil, err
	}
	return l, nil
}

func (l *launchIO) input(r io.Reader) (*os.File, error) {
	if r == nil {
		f, err := os.Open(os.DevNull)
		if err == nil {
			l.closeAfterStart = append(l.closeAfterStart, f)
		}
		return f, err
	}
	if f, ok := r.(*os.File); ok {
		return f, nil
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	l.closeAfterStart = append(l.closeAfterStart, pr)
	l.parentEnds = append(l.parentEnds, pw)
	l.copiers = append(l.copiers, func() error {
		_, err := io.Copy(pw, r)
		if errors.Is(err, syscall.EPIPE) {
			err = nil // the command stopped reading: not an error, as in exec.Cmd
		}
		return errors.Join(err, ignoreClosed(pw.Close()))
	})
	return pr, nil
}

func (l *launchIO) output(w io.Writer) (*os.File, error) {
	if w == nil {
		f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err == nil {
			l.closeAfterStart = append(l.closeAfterStart, f)
		}
		return f, err
	}
	if f, ok := w.(*os.File); ok {
		return f, nil
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	if o, ok := w.(interface{ pipeGroup() (uint32, uint32) }); ok {
		gid, mode := o.pipeGroup()
		if err := givePipe(int(pw.Fd()), gid, mode); err != nil {
			_, _ = pr.Close(), pw.Close()
			return nil, fmt.Errorf("the command's output pipe: %w", err)
		}
	}
	l.closeAfterStart = append(l.closeAfterStart, pw)
	l.parentEnds = append(l.parentEnds, pr)
	l.outputs = append(l.outputs, pr)
	l.copiers = append(l.copiers, func() error {
		_, err := io.Copy(w, pr)
		_ = pr.Close()
		return err
	})
	return pw, nil
}

// ignoreClosed drops the error of closing what WaitDelay closed already.
func ignoreClosed(err error) error {
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

// interfaceEqual is exec.Cmd's: a == b, false for types that cannot be
// compared.
func interfaceEqual(a, b any) (eq bool) {
	defer func() {
		if recover() != nil {
			eq = false
		}
	}()
	return a == b
}

// started closes the command's ends and starts the copying.
func (l *launchIO) started() {
	for _, f := range l.closeAfterStart {
		_ = f.Close()
	}
	l.done = make(chan error, len(l.copiers))
	for _, c := range l.copiers {
		go func() { l.done <- c() }()
	}
}

// abort closes everything of a launch that did not start.
func (l *launchIO) abort() {
	for _, f := range l.closeAfterStart {
		_ = f.Close()
	}
	l.closeParentEnds()
}

func (l *launchIO) closeParentEnds() {
	for _, f := range l.parentEnds {
		_ = f.Close()
	}
}

// wait waits for the copying once the command has exited, at most delay
// (0: for ever) before it closes the pipes, as exec.Cmd.Wait does; it
// returns the first copy error, or exec.ErrWaitDelay. Past delay, a copy
// still draining an output nobody holds is waited for until giveUp
// closes (nil: for ever), then left to end with this process.
func (l *launchIO) wait(delay time.Duration, giveUp <-chan struct{}) error {
	if l == nil || l.waited {
		return nil
	}
	l.waited = true
	if l.launched != nil {
		<-l.launched
	}
	var timeout <-chan time.Time
	if delay > 0 {
		timer := time.NewTimer(delay)
		defer timer.Stop()
		timeout = timer.C
	}
	var first error
	for i := range l.copiers {
		select {
		case err := <-l.done:
			if first == nil {
				first = err
			}
		case <-timeout:
			// What the command left running holds a pipe open: what it
			// sends is not waited for. An output pipe that no one holds
			// any more carries what was written before, copied in full
			// however slowly its reader takes it, as the command handed
			// the reader's pipe would have waited: cut here, the tail was
			// lost (run ... | less, paged after the command exited).
			// The copies' errors are those of the closing: not reported.
			for _, f := range l.parentEnds {
				if !slices.Contains(l.outputs, f) || !unheld(f) {
					_ = f.Close()
				}
			}
			for range len(l.copiers) - i {
				select {
				case <-l.done:
				case <-giveUp:
					// Blocked writing to its reader: closing what it
					// reads does not wake it.
					l.closeParentEnds()
					return exec.ErrWaitDelay
				}
			}
			l.closeParentEnds()
			return exec.ErrWaitDelay
		}
	}
	l.closeParentEnds()
	return first
}

// unheld says no writer holds the pipe that f reads any more: it reads
// what is left, then the end.
func unheld(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	hup := false
	_ = rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p, 0)
		hup = err == nil && n == 1 && p[0].Revents&unix.POLLHUP != 0
	})
	return hup
}

// givePipe makes the pipe fd root's and group gid's, with mode: the
// command's group may open it again through /proc/self/fd as mode lets
// it, and cannot change the mode, which only the owner may.
func givePipe(fd int, gid, mode uint32) error {
	if err := unix.Fchown(fd, 0, int(gid)); err != nil {
		return fmt.Errorf("give it to group %d: %w", gid, err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("mode %#o: %w", mode, err)
	}
	return nil
}
