//go:build linux

package sandbox

import (
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// stoppable reads from a descriptor that may block forever (a terminal, a
// socket whose peer never writes) and can still be ended at once: it polls
// the source together with a wake-up pipe, which stop closes. Go's own
// copies cannot be interrupted while they wait to read.
type stoppable struct {
	src          *os.File
	wakeR, wakeW *os.File
}

func newStoppable(src *os.File) (*stoppable, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	return &stoppable{src: src, wakeR: r, wakeW: w}, nil
}

// Read returns io.EOF once stop was called.
func (s *stoppable) Read(buf []byte) (int, error) {
	fds := []unix.PollFd{{Fd: int32(s.src.Fd()), Events: unix.POLLIN}, {Fd: int32(s.wakeR.Fd()), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			return 0, err
		}
		if fds[1].Revents != 0 {
			return 0, io.EOF
		}
		n, err := unix.Read(int(s.src.Fd()), buf)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// stop ends Read; the reader closes wakeR when it is done with it.
func (s *stoppable) stop() { _ = s.wakeW.Close() }

func (s *stoppable) close() { _ = s.wakeR.Close() }

// stdinRelay gives a command a pipe for stdin and copies the caller's
// stdin (a socket that must not reach the Trial) into it, until stop.
type stdinRelay struct {
	in   *stoppable
	r, w *os.File // the pipe: r is the command's stdin
	wg   sync.WaitGroup
}

func newStdinRelay(src *os.File) (*stdinRelay, error) {
	in, err := newStoppable(src)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		in.stop()
		in.close()
		return nil, err
	}
	return &stdinRelay{in: in, r: r, w: w}, nil
}

// started lets the copy run once the command holds its end of the pipe.
func (s *stdinRelay) started() {
	if s == nil {
		return
	}
	_ = s.r.Close()
	s.wg.Go(func() {
		_, _ = io.Copy(s.w, s.in)
		_ = s.w.Close()
		s.in.close()
	})
}

// stop ends the copy and waits for it. Closing the pipe also ends a write
// that waits for a reader who never comes (a child left behind).
func (s *stdinRelay) stop() {
	if s == nil {
		return
	}
	s.in.stop()
	_ = s.w.Close()
	s.wg.Wait()
}
