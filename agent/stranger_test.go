//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
)

// A process that root writes into a prepared cgroup before its container
// is adopted (here a host process, in the host's network namespace, which
// the namespace scan does not see) is not made part of the Trial: the
// adoption is refused, naming it, and the pending entry goes. A child the
// container's init forked is its own, and passes.
func TestPrivilegedPreparedCgroupStrangerRefused(t *testing.T) {
	w := newPendWorld(t, time.Hour)
	ctx := context.Background()
	t.Run("a host process written in", func(t *testing.T) {
		pc, id := w.prepare(t, "ctr-stranger", "ctr-stranger")
		p := startProbe(t, pc.Cgroup)
		stranger := exec.Command("sleep", "600")
		if err := stranger.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = stranger.Process.Kill(); _ = stranger.Wait() })
		if err := os.WriteFile(filepath.Join(pc.Cgroup, "cgroup.procs"), []byte(strconv.Itoa(stranger.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
		info, err := w.a.ContainerTrial(ctx, client.ContainerTrial{Profile: "pend", Container: client.Container{ID: "ctr-stranger", PID: p.pid}})
		t.Logf("adopt with a stranger in the cgroup: %v", err)
		if err == nil {
			_, _ = w.a.Destroy(ctx, info.ID)
		}
		want := fmt.Sprintf("task %d (sleep), which is neither the container's init (process %d) nor forked by it", stranger.Process.Pid, p.pid)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("want refused: %q", want)
		}
		if w.a.host.BPF.IsPending(id) || w.a.host.BPF.HasTrial(id) {
			t.Error("a refused adoption left the cgroup an entry")
		}
	})
	t.Run("a child of the container's init", func(t *testing.T) {
		pc, _ := w.prepare(t, "ctr-child", "ctr-child")
		cg, err := os.Open(pc.Cgroup)
		if err != nil {
			t.Fatal(err)
		}
		defer cg.Close()
		// sh is the init; its sleep, forked after, is in its cgroup and
		// network namespace, as an init's child is.
		init := exec.Command("sh", "-c", "sleep 600 & echo ready; wait")
		init.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, UseCgroupFD: true, CgroupFD: int(cg.Fd())}
		out, err := init.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := init.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = os.WriteFile(filepath.Join(pc.Cgroup, "cgroup.kill"), []byte("1"), 0)
			_ = init.Process.Kill()
			_ = init.Wait()
		})
		if _, err := out.Read(make([]byte, 6)); err != nil {
			t.Fatal(err)
		}
		info, err := w.a.ContainerTrial(ctx, client.ContainerTrial{Profile: "pend", Container: client.Container{ID: "ctr-child", PID: init.Process.Pid}})
		if err != nil {
			t.Fatalf("an init with a child of its own: %v", err)
		}
		if _, err := w.a.Destroy(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
	})
}
