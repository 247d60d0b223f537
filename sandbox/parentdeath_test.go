//go:build linux

package sandbox

import (
	"bytes"
	"context"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/trial"
)

// A command that asks to die with its parent (bwrap --die-with-parent,
// setpriv --pdeathsig, supervisors) lives as long as its launcher: the
// kernel sends that signal when the *thread* that forked it exits, and
// the launch's thread is discarded. Let go as soon as the command had
// exec'd, that thread killed most such commands a moment after they
// started.
func TestPrivilegedParentDeathSignalWaitsForTheLauncher(t *testing.T) {
	privtest.RequireTool(t, "setpriv")
	h := newHost(t)
	// A busy goroutine on every P, as on a loaded host: the launch's
	// thread, back from the fork, waits for a P before it can end, and
	// the command's prctl comes first. Bounded: a minute at most.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for end := time.Now().Add(time.Minute); time.Now().Before(end); {
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	defer wg.Wait()
	defer close(stop)
	killed, runs := 0, 0
	for range 3 {
		tr := newTrial(t, h, trial.Spec{})
		for range 4 {
			var out bytes.Buffer
			code, err := tr.Exec(context.Background(), Command{Args: []string{"setpriv", "--pdeathsig", "KILL", "--", "sleep", "0.1"},
				Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: &out, Stderr: &out}, nil)
			if err != nil {
				t.Fatal(err)
			}
			runs++
			if code != 0 {
				killed++
				t.Logf("exit %d: %s", code, out.String())
			}
		}
	}
	if killed > 0 {
		t.Errorf("%d of %d commands that asked for a parent-death signal were killed: the thread that forked them exited while they ran", killed, runs)
	}
}

// The launch's thread, held for the command's life, is let go however
// the launch ends: the command exited, it was not found (trialnet-exec
// gave up), or its working directory is not one (the fork's chdir
// failed). A thread kept would stay, for the launcher's life, in the
// Trial's namespaces (its mount and network namespaces with it), one per
// launch, in a process that launches many (the tests, client.Run).
func TestPrivilegedLaunchThreadLetGo(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	env := []string{"PATH=/usr/bin:/bin"}
	for _, c := range []Command{
		{Args: []string{"true"}},
		{Args: []string{"no-such-command-trialnet"}},
		{Args: []string{"true"}, Dir: "/no-such-dir-trialnet"},
	} {
		c.Env, c.UID, c.GID = env, nobody, nobody
		code, err := tr.Exec(context.Background(), c, nil)
		t.Logf("%q in %q: exit %d, %v", c.Args, c.Dir, code, err)
	}
	// A thread let go ends once the runtime runs its goroutine: bounded.
	var held []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if held = threadsInOtherMountNS(t); len(held) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, tid := range held {
		t.Errorf("thread %s of the launcher is still in a Trial's mount namespace after every launch ended", tid)
	}
}

// threadsInOtherMountNS lists this process's threads whose mount
// namespace is not the process's (its main thread's).
func threadsInOtherMountNS(t *testing.T) []string {
	t.Helper()
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, task := range tasks {
		ns, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/mnt")
		if err == nil && ns != own {
			out = append(out, task.Name())
		}
	}
	return out
}
