//go:build linux

package systembench

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
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/keeper"
	"golang.org/x/sys/unix"
)

// servedAgent is a `trialnet agent` process on an isolated host,
// configured through a file and reached over its control socket, as a
// deployed one is: its descriptors, memory and its keeper's are its own,
// apart from the benchmark's clients.
type servedAgent struct {
	*client.Client
	cmd    *exec.Cmd
	keeper int // the keeper process the agent started
	log    string
}

func startServedAgent(b *testing.B, e *env) *servedAgent {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "trialnet")
	testkit.BuildTrialnet(b, filepath.Join("..", ".."), bin)
	return startServedAgentBin(b, e, bin)
}

// startServedAgentBin is startServedAgent with the trialnet build bin
// (another commit's, to compare with this tree's in one run) and more
// arguments to its agent command.
func startServedAgentBin(b testing.TB, e *env, bin string, args ...string) *servedAgent {
	b.Helper()
	dir := b.TempDir()
	host := testenv.IsolatedHost(b, "scale")
	// The state directory on a tmpfs, as a deployed agent's (/run) is:
	// /tmp is ext4 here, whose inode allocation for each Trial's files
	// scans the inodes freed in the last seconds, which a loop of Trials
	// made and destroyed supplies.
	if err := unix.Mount("tmpfs", host.StateDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		testenv.Sweep(host) // first: it reads the Trials' records there
		_ = unix.Unmount(host.StateDir, unix.MNT_DETACH)
	})
	sock, conf := filepath.Join(dir, "agent.sock"), filepath.Join(dir, "trialnet.yaml")
	yaml := fmt.Sprintf("resolvers: [%q]\nallow_cidrs: [%q]\nlimits:\n  connects_per_second: %g\n  connect_burst: %d\n"+
		"paths:\n  socket: %s\n  state_dir: %s\n  data_dir: %s\n  pin_dir: %s\n  netns_dir: %s\n  cgroup_parent: %s\n",
		e.dns, benchCIDR, benchLimits.ConnectRate, benchLimits.ConnectBurst,
		sock, host.StateDir, filepath.Join(dir, "data"), host.PinDir, host.NetnsDir, host.Parent)
	if err := os.WriteFile(conf, []byte(yaml), 0o600); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := keeper.Stop(keeper.DefaultSocket(sock)); err != nil {
			b.Errorf("stop the keeper: %v", err)
		}
	})
	a := &servedAgent{Client: client.NewClient(sock), log: filepath.Join(dir, "agent.log")}
	log, err := os.Create(a.log)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	// A descriptor this process inherited (flock's hold on the lock of
	// privileged runs) would reach the agent and the keeper it starts,
	// which outlives a killed benchmark.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		b.Fatal(err)
	}
	a.cmd = exec.Command(bin, append([]string{"agent", "--config", conf}, args...)...)
	a.cmd.Stdout, a.cmd.Stderr = log, log
	if err := a.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		a.stop()
		if b.Failed() {
			b.Logf("the agent's log:\n%s", a.logged())
		}
	})
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if h, err := a.Health(context.Background()); err == nil && h.OK {
			break
		}
		if time.Now().After(end) {
			b.Fatalf("the agent did not become ready in 30 s:\n%s", a.logged())
		}
	}
	if a.keeper = pidWithArgs("keeper", "--socket", keeper.DefaultSocket(sock), ""); a.keeper == 0 {
		b.Fatalf("the agent started no keeper on %s:\n%s", keeper.DefaultSocket(sock), a.logged())
	}
	return a
}

// stop ends the agent as its service manager would (SIGTERM), and kills
// it if it is still there after 30 s.
func (a *servedAgent) stop() {
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-done
	}
}

func (a *servedAgent) logged() string {
	b, _ := os.ReadFile(a.log)
	return string(b)
}

// pidWithArgs is the process whose arguments (after its program) begin
// with args, or 0.
func pidWithArgs(args ...string) int {
	want := strings.Join(args, "\x00")
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if _, rest, ok := strings.Cut(string(b), "\x00"); ok && strings.HasPrefix(rest, want) {
			return pid
		}
	}
	return 0
}
