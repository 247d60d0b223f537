//go:build linux

package escape

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/sandbox"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// userWideUID is the uid of both sides of the user-wide attempts: one no
// other process of this host runs as, since unconfined they act on every
// process of it.
const userWideUID = 64987

// userWideAttempts are escapee -mode user-wide's.
var userWideAttempts = []string{"renice-user", "ioprio-user", "kill-all"}

// userWideVictims are processes of userWideUID outside any Trial: one
// whose nice value is read, one whose I/O priority is (with what it was
// at the start), one that SIGUSR1 ends.
type userWideVictims struct {
	niced, ioprio, killed *exec.Cmd
	ioprioAtStart         uintptr
}

func startUserWideVictims(t *testing.T) *userWideVictims {
	t.Helper()
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: userWideUID, Gid: userWideUID}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		return cmd
	}
	v := &userWideVictims{niced: start(), ioprio: start(), killed: start()}
	v.ioprioAtStart = ioprioOf(t, v.ioprio.Process.Pid)
	return v
}

func ioprioOf(t *testing.T, pid int) uintptr {
	t.Helper()
	prio, _, errno := unix.Syscall(unix.SYS_IOPRIO_GET, 1 /* IOPRIO_WHO_PROCESS */, uintptr(pid), 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	return prio
}

// reached says whether renice-user and ioprio-user show on their victims.
func (v *userWideVictims) reached(t *testing.T) map[string]bool {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(v.niced.Process.Pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command's ")": nice is the 17th.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return map[string]bool{
		"renice-user": f[16] != "0",
		"ioprio-user": ioprioOf(t, v.ioprio.Process.Pid) != v.ioprioAtStart,
	}
}

// signalled says whether kill-all reached its victim: a signal is queued
// before kill returns, so it is pending, or already acted on (the victim
// a zombie until reaped here).
func (v *userWideVictims) signalled(t *testing.T) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(v.killed.Process.Pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, val, _ := strings.Cut(line, ":\t")
		switch k {
		case "State":
			if !strings.HasPrefix(val, "S") && !strings.HasPrefix(val, "R") {
				return true
			}
		case "SigPnd", "ShdPnd":
			if mask, err := strconv.ParseUint(val, 16, 64); err == nil && mask&(1<<(uint(unix.SIGUSR1)-1)) != 0 {
				return true
			}
		}
	}
	return false
}

// The calls that name a uid or every process (setpriority PRIO_USER,
// ioprio_set IOPRIO_WHO_USER, kill -1) reach no process outside the
// Trial; unconfined, each reaches its victim, so the test can tell.
func TestPrivilegedEscapeUserWide(t *testing.T) {
	privtest.Require(t)
	h, err := agent.OpenHost(testenv.IsolatedHost(t, "userwide"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	tr, err := h.Create(trial.Spec{ID: "userwide", UnixOpen: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = tr.Close() })
	for _, confined := range []bool{true, false} {
		v := startUserWideVictims(t)
		run := func(mode string) map[string]Result {
			var out, errOut bytes.Buffer
			args := []string{escapee(t), "-mode", mode}
			if confined {
				code, err := launched(&tr.Launcher, nil)(context.Background(), sandbox.Command{Args: args, Env: []string{"PATH=/usr/bin:/bin"},
					UID: userWideUID, GID: userWideUID, Stdout: &out, Stderr: &errOut})
				if err != nil || code != 0 {
					t.Fatalf("escapee: exit %d, %v\n%s", code, err, errOut.String())
				}
			} else {
				cmd := exec.Command(args[0], args[1:]...)
				cmd.Stdout, cmd.Stderr = &out, &errOut
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: userWideUID, Gid: userWideUID}, Setsid: true}
				if err := cmd.Run(); err != nil {
					t.Fatalf("escapee: %v\n%s", err, errOut.String())
				}
			}
			return parseUserWide(t, out.Bytes())
		}
		res := run("user-wide")
		reached := v.reached(t)
		res["kill-all"] = run("kill-all")["kill-all"]
		if confined {
			reached["kill-all"] = v.signalled(t)
		} else {
			// Reached, it ends: wait for that rather than catch it dying.
			_ = v.killed.Wait()
			ws, ok := v.killed.ProcessState.Sys().(syscall.WaitStatus)
			reached["kill-all"] = ok && ws.Signaled() && ws.Signal() == unix.SIGUSR1
		}
		for _, name := range userWideAttempts {
			switch {
			case confined && reached[name]:
				t.Errorf("ESCAPE: %s reached a process of the Trial's uid outside it (%s: %s)", name, res[name].Result, res[name].Reason)
			case !confined && !reached[name]:
				t.Errorf("unconfined %s did not reach its victim (%+v): the test could not see this escape", name, res[name])
			}
		}
	}
}

func parseUserWide(t *testing.T, out []byte) map[string]Result {
	t.Helper()
	res := map[string]Result{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r Result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("escapee output %q: %v", line, err)
		}
		res[r.Name] = r
		t.Logf("%-12s %-8s %s", r.Name, r.Result, r.Reason)
	}
	return res
}
