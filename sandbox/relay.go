//go:build linux

package sandbox

import (
	"fmt"
	"io"
	"math"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// stoppable reads from a descriptor that may block forever (a terminal, a
// socket whose peer never writes) and can still be ended at once: it polls
// the source together with a wake-up pipe, which stop closes. Go's own
// copies cannot be interrupted while they wait to read.
type stoppable struct {
	src          int
	wakeR, wakeW *os.File
}

func newStoppable(src int) (*stoppable, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	return &stoppable{src: src, wakeR: r, wakeW: w}, nil
}

// Read returns io.EOF once stop was called.
func (s *stoppable) Read(buf []byte) (int, error) {
	for {
		if !s.wait(s.src, unix.POLLIN) {
			return 0, io.EOF
		}
		n, err := unix.Read(s.src, buf)
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

// wait polls fd for events (an error or hang-up counts too) and returns
// true once it has one, or false once stop was called.
func (s *stoppable) wait(fd int, events int16) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: events}, {Fd: int32(s.wakeR.Fd()), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err == unix.EINTR {
			continue
		} else if err != nil {
			return false
		}
		return fds[1].Revents == 0
	}
}

// stop ends Read; the reader closes wakeR when it is done with it.
func (s *stoppable) stop() { _ = s.wakeW.Close() }

func (s *stoppable) close() { _ = s.wakeR.Close() }

// stdinRelay gives a command a pipe of trialnet's for stdin and copies
// the caller's stdin into it, until stop. The Trial never holds the
// caller's own stdin: through /proc/self/fd/0 it could open a pipe or
// file of its uid again for writing and put text before the caller's
// next reader (a shell reading its script from that pipe ran it outside
// the Trial, seen in an attacker's review), and through the shared open
// file it could move a file's offset back (that shell ran lines again)
// or make the caller's reads non-blocking.
//
// A socket is copied as it comes (what the command does not read is
// lost to the caller: a socket cannot be read again). A pipe or FIFO,
// and a regular file, are passed on so that the caller's input moves on
// by exactly what the command read, as it would have shared: a `while
// read` loop whose body runs a Trial keeps its next lines. A pipe's bytes
// are copied with tee, which leaves them in the caller's pipe, one chunk
// at a time into a pipe one page long, and taken from the caller's only
// once the command has read the whole chunk, or, at stop, as much of it
// as the command read. A file is read with pread, which leaves its
// offset, and at stop the offset is moved on by what the command read.
type stdinRelay struct {
	src  int // a duplicate of the caller's stdin: the caller may close its own once the command started
	in   *stoppable
	mode relayMode
	r    *os.File // the command's stdin; kept open here to count what it left, but for a socket
	w    *os.File // a socket's relay: the pipe's write end
	wfd  int      // a pipe's or file's relay: the pipe's write end
	// Pipes: a chunk copied to the command and not yet taken from the
	// caller's pipe, and where taken bytes go.
	chunk   int
	devNull int
	// Files: the caller's offset at the start, and what was copied since.
	start, sent int64
	wg          sync.WaitGroup
}

type relayMode int

const (
	relaySocket relayMode = iota
	relayPipe
	relayFile
)

// stdinMode lets the command's group read its stdin pipe, as a terminal's
// pty lets it read: `cat /dev/stdin` opens it again. Writing into it, or
// changing the mode (root's), it cannot.
const stdinMode = 0o440

func newStdinRelay(src *os.File, mode relayMode, gid uint32) (_ *stdinRelay, err error) {
	s := &stdinRelay{mode: mode, src: -1, wfd: -1, devNull: -1}
	defer func() {
		if err != nil {
			s.release()
		}
	}()
	if s.src, err = unix.FcntlInt(src.Fd(), unix.F_DUPFD_CLOEXEC, 3); err != nil {
		s.src = -1
		return nil, fmt.Errorf("stdin: %w", err)
	}
	if s.in, err = newStoppable(s.src); err != nil {
		return nil, err
	}
	if mode == relaySocket {
		// Through the poller: stop's Close ends a write that waits.
		if s.r, s.w, err = os.Pipe(); err != nil {
			return nil, err
		}
		return s, givePipe(int(s.r.Fd()), gid, stdinMode)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("stdin: make a pipe: %w", err)
	}
	s.r, s.wfd = os.NewFile(uintptr(p[0]), "stdin"), p[1]
	if err := givePipe(p[0], gid, stdinMode); err != nil {
		return nil, fmt.Errorf("stdin: %w", err)
	}
	if mode == relayFile {
		if s.start, err = unix.Seek(s.src, 0, io.SeekCurrent); err != nil {
			return nil, fmt.Errorf("stdin: read the file's offset: %w", err)
		}
		return s, unix.SetNonblock(s.wfd, true)
	}
	page := os.Getpagesize()
	if _, err := unix.FcntlInt(uintptr(s.wfd), unix.F_SETPIPE_SZ, page); err != nil {
		return nil, fmt.Errorf("stdin: make the command's pipe one page long: %w", err)
	}
	if n, err := unix.FcntlInt(uintptr(s.wfd), unix.F_GETPIPE_SZ, 0); err != nil || n != page {
		return nil, fmt.Errorf("stdin: the command's pipe is %d bytes long, not one page (%v)", n, err)
	}
	if s.devNull, err = unix.Open("/dev/null", unix.O_WRONLY|unix.O_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("stdin: open /dev/null: %w", err)
	}
	return s, nil
}

// release closes what the relay holds, its duplicate of the caller's
// stdin among it (the caller's own stays open).
func (s *stdinRelay) release() {
	if s.in != nil {
		s.in.stop()
		s.in.close()
		s.in = nil
	}
	for _, f := range []*os.File{s.r, s.w} {
		if f != nil {
			_ = f.Close()
		}
	}
	for _, fd := range []int{s.src, s.wfd, s.devNull} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
	s.r, s.w, s.src, s.wfd, s.devNull = nil, nil, -1, -1, -1
}

// started lets the copy run once the command holds its end of the pipe.
func (s *stdinRelay) started() {
	if s == nil {
		return
	}
	if s.mode == relaySocket {
		_ = s.r.Close()
		s.r = nil
		s.wg.Go(func() {
			_, _ = io.Copy(s.w, s.in)
			_ = s.w.Close()
		})
		return
	}
	s.wg.Go(func() {
		if s.mode == relayPipe {
			s.copyPipe()
		} else {
			s.copyFile()
		}
		// The command reads on to the end of what it was given.
		_ = unix.Close(s.wfd)
		s.wfd = -1
	})
}

// copyPipe passes the caller's pipe on a chunk at a time (see stdinRelay).
func (s *stdinRelay) copyPipe() {
	src := s.src
	for {
		for s.chunk == 0 {
			// tee first: it ends at once where no writer is (a FIFO that
			// never had one reports no hang-up to poll).
			n, err := unix.Tee(src, s.wfd, math.MaxInt32, unix.SPLICE_F_NONBLOCK)
			switch {
			case err == unix.EAGAIN:
				if !s.in.wait(src, unix.POLLIN) {
					return
				}
			case err == unix.EINTR:
			case err != nil || n == 0:
				return // the caller's input ended
			default:
				s.chunk = int(n)
			}
		}
		if !s.in.wait(s.wfd, unix.POLLOUT) {
			return // stop settles the chunk
		}
		unread, err := s.unread()
		if err != nil {
			return
		}
		take(src, s.devNull, s.chunk-unread)
		if s.chunk = unread; unread > 0 {
			// Room with bytes unread: the command made its pipe longer
			// (F_SETPIPE_SZ needs only a descriptor of it). One page
			// again, so that room means all of it was read.
			_, _ = unix.FcntlInt(uintptr(s.wfd), unix.F_SETPIPE_SZ, os.Getpagesize())
		}
	}
}

// unread is what the command left in its pipe (TIOCINQ is FIONREAD).
func (s *stdinRelay) unread() (int, error) {
	return unix.IoctlGetInt(int(s.r.Fd()), unix.TIOCINQ)
}

// copyFile passes the caller's file on from its offset, which it leaves
// where it is (see stdinRelay).
func (s *stdinRelay) copyFile() {
	src := s.src
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Pread(src, buf, s.start+s.sent)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return
		}
		for p := buf[:n]; len(p) > 0; {
			m, err := unix.Write(s.wfd, p)
			switch {
			case err == unix.EAGAIN:
				if !s.in.wait(s.wfd, unix.POLLOUT) {
					return
				}
			case err == unix.EINTR:
			case err != nil:
				return
			default:
				s.sent += int64(m)
				p = p[m:]
			}
		}
	}
}

// take removes n bytes from the head of the pipe fd, or what is left of
// them (another reader may have taken some).
func take(fd, devNull, n int) {
	for n > 0 {
		m, err := unix.Splice(fd, nil, devNull, nil, n, unix.SPLICE_F_NONBLOCK)
		if err == unix.EINTR {
			continue
		}
		if err != nil || m <= 0 {
			return
		}
		n -= int(m)
	}
}

// stop ends the copy and waits for it, then moves the caller's input on
// by what the command read of what it was given.
func (s *stdinRelay) stop() {
	if s == nil || s.in == nil { // never made, or stopped already
		return
	}
	s.in.stop()
	if s.mode == relaySocket {
		// Ends a write that waits for a reader who never comes (a child
		// left behind).
		_ = s.w.Close()
	}
	s.wg.Wait()
	if s.mode != relaySocket {
		if unread, err := s.unread(); err == nil {
			if s.mode == relayPipe {
				take(s.src, s.devNull, s.chunk-unread)
			} else {
				// Never back past where the command began, whatever
				// the count says.
				read := min(max(s.sent-int64(unread), 0), s.sent)
				_, _ = unix.Seek(s.src, s.start+read, io.SeekStart)
			}
		}
	}
	s.w = nil // closed by the copy
	s.release()
}
