//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/internal/procstat"
	trialspec "github.com/trialnet/trialnet/trial"
)

func self() *trialspec.Owner {
	o := &trialspec.Owner{PID: os.Getpid()}
	o.Start, _ = procstat.StartTime(o.PID)
	return o
}

// ownerAlive reports whether the Trial spec describes has an owner that
// still runs.
func ownerAlive(spec trialspec.Spec) bool {
	if spec.Owner == nil {
		return false
	}
	start, err := procstat.StartTime(spec.Owner.PID)
	return err == nil && start == spec.Owner.Start
}

// errOwnerExited: the process a Trial was to be tied to is gone.
var errOwnerExited = errors.New("the process has exited")

// peerOwner is the process at the other end of c, as the kernel names it,
// with a pidfd of it. SO_PEERPIDFD (Linux 6.5+) gives a pidfd of the
// process that connected: unlike a pid, no reuse can make it another's.
func peerOwner(c *net.UnixConn) (*trialspec.Owner, *os.File, error) {
	fd, err := fdpass.SocketPidfd(c)
	if err != nil {
		return nil, nil, fmt.Errorf("SO_PEERPIDFD: %w", err)
	}
	o, err := pidfdOwner(fd)
	if err != nil {
		_ = unix.Close(fd)
		return nil, nil, err
	}
	return o, pidFile(fd), nil
}

// openOwner opens a pidfd of o if o still runs: the process with its pid
// has its start time.
func openOwner(o trialspec.Owner) (*os.File, error) {
	fd, err := unix.PidfdOpen(o.PID, 0)
	if err != nil {
		return nil, errOwnerExited
	}
	got, err := pidfdOwner(fd)
	if err == nil && *got != o {
		err = errOwnerExited // the pid is another process's now
	}
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return pidFile(fd), nil
}

// pidfdOwner names the process pidfd refers to. The pid comes from the
// pidfd, the start time from /proc; as the pidfd's process still runs
// after /proc was read, its pid was not reused in between, and the start
// time read is its own.
func pidfdOwner(pidfd int) (*trialspec.Owner, error) {
	pid, err := pidfdPID(pidfd)
	switch {
	case err != nil:
		return nil, err
	case pid < 0:
		return nil, errOwnerExited
	case pid == 0:
		return nil, errors.New("the process is in a PID namespace the agent cannot see into")
	}
	start, err := procstat.StartTime(pid)
	if err != nil || exited(pidfd) {
		return nil, errOwnerExited
	}
	return &trialspec.Owner{PID: pid, Start: start}, nil
}

// pidfdPID is the pid of pidfd's process in this process's PID namespace
// (its fdinfo's Pid): -1 once it has been reaped, 0 if it is not visible.
func pidfdPID(pidfd int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", pidfd))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("fd %d is not a pidfd", pidfd)
}

// exited reports whether pidfd's process has exited: a pidfd polls
// readable from then on.
func exited(pidfd int) bool {
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, 0)
		if err != unix.EINTR {
			return err == nil && n > 0
		}
	}
}

// pidFile makes pidfd an *os.File on Go's poller, so that waiting for
// its process to exit holds no thread and ends when it is closed.
func pidFile(pidfd int) *os.File {
	// Non-blocking: os.NewFile then registers it with the poller.
	_ = unix.SetNonblock(pidfd, true)
	return os.NewFile(uintptr(pidfd), "pidfd")
}

// callerOwner is the owner of a Trial asked for over conn: its peer.
func callerOwner(conn *net.UnixConn) (*trialspec.Owner, *os.File, error) {
	o, pidfd, err := peerOwner(conn)
	switch {
	case errors.Is(err, unix.ENOPROTOOPT):
		return nil, nil, errf(client.CodeInternal, "cannot tie the Trial to the life of the process that asks: this kernel does not name a unix socket's peer by pidfd (SO_PEERPIDFD, Linux 6.5+). Use 'trialnet create', 'exec' and 'destroy' instead, or stop the agent so that 'trialnet run' embeds its own")
	case errors.Is(err, errOwnerExited):
		return nil, nil, errf(client.CodeBadRequest, "the process that asked for this Trial exited before it was made; nothing was created")
	case err != nil:
		return nil, nil, errf(client.CodeBadRequest, "cannot tie the Trial to the life of the process that asks: %v; run it where the agent runs, or use 'trialnet create' and 'destroy'", err)
	}
	return o, pidfd, nil
}

// ownerPID is o's pid for the log; 0: no owner.
func ownerPID(o *trialspec.Owner) int {
	if o == nil {
		return 0
	}
	return o.PID
}

// watchOwner destroys lt, a live Trial, when its owner exits, if it is
// owned. One goroutine, parked on Go's poller until the owner's pidfd
// polls readable; it ends with no more when the Trial is destroyed
// otherwise or the agent stops (either closes the pidfd: dropOwner).
func (a *Agent) watchOwner(lt *trial) {
	a.mu.Lock()
	pidfd, gone := lt.owner, lt.ownerGone
	if pidfd == nil && !gone || a.closed.Load() {
		a.mu.Unlock()
		a.dropOwner(lt)
		return
	}
	a.owners.Add(1)
	a.mu.Unlock()
	id, pid := lt.info.ID, lt.info.Owner.PID
	go func() {
		defer a.owners.Done()
		var err error
		if !gone {
			var rc syscall.RawConn
			if rc, err = pidfd.SyscallConn(); err == nil {
				err = rc.Read(func(fd uintptr) bool { return exited(int(fd)) })
			}
			a.mu.Lock()
			dropped := lt.owner != pidfd
			a.mu.Unlock()
			if dropped {
				return
			}
		}
		if a.closed.Load() {
			return
		}
		if err != nil {
			a.log.Error("cannot watch the owner of a Trial: it stays until destroyed", "trial", id, "owner_pid", pid, "error", err)
			return
		}
		if c := lt.info.Container; c != "" {
			a.log.Info("destroying a Trial whose container ended", "trial", id, "container", c, "pid", pid)
		} else {
			a.log.Warn("destroying a Trial whose owner exited", "trial", id, "reason", fmt.Sprintf("owner pid %d exited", pid))
		}
		var e *client.Error
		_, err = a.Destroy(context.Background(), id)
		switch {
		case err == nil || errors.As(err, &e) && e.Code == client.CodeUnknownTrial:
		case errors.As(err, &e) && e.Code == client.CodeHandedOver:
			a.log.Info("a Trial whose owner exited is the new agent's to destroy", "trial", id)
		default:
			a.log.Error("destroy a Trial whose owner exited", "trial", id, "error", err)
		}
	}()
}

// dropOwner stops watching lt's owner and closes its pidfd.
func (a *Agent) dropOwner(lt *trial) {
	a.mu.Lock()
	pidfd := lt.owner
	lt.owner = nil
	a.mu.Unlock()
	if pidfd != nil {
		_ = pidfd.Close()
	}
}
