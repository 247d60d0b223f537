//go:build linux

package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/bpf"
)

// reportLatency adds p50 and p99 of ds as custom metrics.
func reportLatency(b *testing.B, ds []time.Duration) {
	slices.Sort(ds)
	if len(ds) == 0 {
		return
	}
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkTrialCreateDestroy measures one Trial (cgroup, netns with lo up,
// policy entry) made and torn down, with 0 and 1000 other Trials live.
func BenchmarkTrialCreateDestroy(b *testing.B) {
	for _, live := range []int{0, 1000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			h := newHost(b)
			for i := range live {
				newTrial(b, h, trial.Spec{ID: fmt.Sprintf("live-%d", i), UnixOpen: true})
			}
			ds := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				start := time.Now()
				tr, err := h.Create(trial.Spec{ID: "bench-" + strconv.Itoa(i), UnixOpen: true}, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tr.Close(); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(start))
			}
			reportLatency(b, ds)
		})
	}
}

// BenchmarkIPNetnsAddDel is the reference: what an ad-hoc script does with
// iproute2 for a namespace with lo up (no cgroup, no eBPF).
func BenchmarkIPNetnsAddDel(b *testing.B) {
	newHost(b) // the same privilege check; the host itself is unused
	if _, err := exec.LookPath("ip"); err != nil {
		b.Fatal("iproute2's ip is needed for the reference benchmark")
	}
	ds := make([]time.Duration, 0, b.N)
	name := "trialnet-bench-" + randSuffix()
	b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	for b.Loop() {
		start := time.Now()
		for _, args := range [][]string{{"netns", "add", name}, {"-n", name, "link", "set", "lo", "up"}, {"netns", "del", name}} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				b.Fatalf("ip %v: %v %s", args, err, out)
			}
		}
		ds = append(ds, time.Since(start))
	}
	reportLatency(b, ds)
}

// BenchmarkConnectHook measures connect()+close() to a loopback listener
// from a process in a Trial (every hook runs) and from a process in the
// same namespace but an unhooked cgroup; it reports the difference.
func BenchmarkConnectHook(b *testing.B) {
	h := newHost(b)
	tr := newTrial(b, h, trial.Spec{UnixOpen: true})
	lo := listenIn(b, tr.Netns, "tcp4", "127.0.0.1:0")
	control := unhookedTrial(b, h, tr.Netns)

	const n = 5000
	perConnect := func(t *Trial) float64 {
		code, out := runProbe(b, t, "bench-connect", lo.String(), strconv.Itoa(n))
		if code != probeOK {
			b.Fatalf("bench-connect: %d %s", code, out)
		}
		ns, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
		if err != nil {
			b.Fatalf("bench-connect output %q", out)
		}
		return ns
	}
	// The kernel's own accounting of the programs' run time says exactly
	// what the hooks cost, which wall-clock differences on a noisy VM cannot.
	stats, err := bpf.EnableRunStats()
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	// runtime sums every program's run time, and the connect4 hook's alone.
	runtime := func() (all, connect time.Duration) {
		ps, err := h.BPF.RunStats()
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range ps {
			all += p.Runtime
			if p.Name == "trialnet_connect4" {
				connect = p.Runtime
			}
		}
		return all, connect
	}
	var hooked, plain []float64
	var hookTime, connectHookTime time.Duration
	connects := 0
	for b.Loop() {
		all0, c0 := runtime()
		hooked = append(hooked, perConnect(tr))
		all1, c1 := runtime()
		hookTime += all1 - all0
		connectHookTime += c1 - c0
		connects += n
		plain = append(plain, perConnect(control))
	}
	// All hooks: socket(), connect(), and egress for SYN, ACK and the RST.
	b.ReportMetric(float64(hookTime.Nanoseconds())/float64(connects), "ns/connect-all-hooks")
	b.ReportMetric(float64(connectHookTime.Nanoseconds())/float64(connects), "ns/connect4-hook")
	slices.Sort(hooked)
	slices.Sort(plain)
	mh, mp := hooked[len(hooked)/2], plain[len(plain)/2]
	b.ReportMetric(mh, "ns/connect-trial")
	b.ReportMetric(mp, "ns/connect-unhooked")
	b.ReportMetric(mh-mp, "ns/connect-added")
	b.ReportMetric(mh/mp, "ratio")
}

// BenchmarkAdoptFreshness is what an adoption checks of a container's
// namespace besides its links and sockets (netns's own): that it is no
// host's or Trial's, and that no task outside the container's cgroup is
// in it, a scan of every task on the host. The namespace is a process's
// own, unshared; this host's processes are the rest.
func BenchmarkAdoptFreshness(b *testing.B) {
	h := newHost(b)
	cmd := exec.Command("unshare", "--net", "sleep", "60")
	if err := cmd.Start(); err != nil {
		b.Skipf("unshare: %v", err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := strconv.Itoa(cmd.Process.Pid)
	mount, err := Cgroup2Mount()
	if err != nil {
		b.Fatal(err)
	}
	var id netnsID
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		// Any cgroup passes ("/"): until unshare is in a namespace of its
		// own, this process's is refused.
		if id, err = nsIDOf(cmd.Process.Pid); err == nil && h.notFresh(id, mount, "/") == "" {
			break
		}
		if time.Now().After(end) {
			b.Fatal("unshare did not enter a namespace of its own")
		}
	}
	cg, err := procCgroup(mount, pid)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if why := h.notFresh(id, mount, cg); why != "" {
			b.Fatal(why)
		}
	}
}

// BenchmarkTrialCloseLive measures the teardown of a Trial whose command
// still runs (sleep, as nobody, under the Trial's init), as a destroy
// finds one: the kill and the wait for the empty cgroup, the final
// counters and pool use, and the removals. Only Close is timed.
func BenchmarkTrialCloseLive(b *testing.B) {
	h := newHost(b)
	ds := make([]time.Duration, 0, b.N)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		tr, err := h.Create(trial.Spec{ID: "close-" + strconv.Itoa(i), UnixOpen: true}, nil)
		if err != nil {
			b.Fatal(err)
		}
		p, err := tr.Start(Command{Args: []string{"sleep", "100"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		if _, err := tr.Close(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
		b.StopTimer()
		_, _ = p.Wait()
		b.StartTimer()
	}
	reportLatency(b, ds)
}

// BenchmarkKillCgroup measures killCgroup on a cgroup whose process
// started just before, as in a short Trial: the kernel told the launch's
// populated 0 -> 1 on cgroup.events then, so it holds back the 1 -> 0
// of the kill for up to 10 ms. The process is the init of PID and mount
// namespaces of its own, with a child, as a Trial's is: its exit takes
// the namespaces down, which takes a while.
func BenchmarkKillCgroup(b *testing.B) {
	h := newHost(b)
	ds := make([]time.Duration, 0, b.N)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		dir := filepath.Join(h.Parent, "kill-"+strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		c := exec.Command("unshare", "--mount", "--pid", "--fork", "sleep", "100")
		c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		err = c.Start()
		waitForProcs(b, dir, 2)
		_ = unix.Close(fd)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		if err := killCgroup(dir, killWait); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
		b.StopTimer()
		_ = c.Wait()
		if err := unix.Rmdir(dir); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportLatency(b, ds)
}
