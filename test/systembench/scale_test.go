//go:build linux

package systembench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/sandbox"
	"github.com/trialnet/trialnet/trial"
)

// Bounds of BenchmarkScale: its largest step holds the lock for a few
// minutes on this 2-core VM, most of it making the 1,000 Trials.
const (
	scaleBusy      = 100                   // Trials whose tunnel carries traffic
	scaleBusyEvery = 20 * time.Millisecond // one echoed byte per busy tunnel
	scaleConnects  = 200                   // new tunnels timed per step
	scaleCycles    = 30                    // create → command → first byte → destroy per step
	scaleWait      = 30 * time.Second      // for any one echo, from a CONNECT or a busy tunnel
)

// BenchmarkScale: 1, 100 and 1,000 live Trials, each whole: a process in
// it (sleep, as uid 65534, so its init and the process boundary count),
// its proxy and DNS stub listeners (transparent mode, the default), and
// one tunnel through its proxy held open to the test host's echo server;
// up to 100 of them busy, each echoing a byte every 20 ms. The agent is a
// `trialnet agent` process of its own, as deployed (with the keeper it
// starts), so that its descriptors and memory are counted apart from the
// benchmark's clients and launcher, and no one process needs the
// descriptors of both. At each size: a new CONNECT's handshake to its
// first echoed byte (from live Trials in turn), create → a command in the
// Trial → first byte → destroy of one more Trial, memory per live Trial
// (the agent's RSS growth, the proportional set size of every process in
// the Trials) and descriptors per live Trial in each process. The issue
// asks all of them to stay flat from 1 to 1,000. Run with -benchtime 1x:
// each step measures a fixed count, whatever b.N. TRIALNET_SCALE_STEPS
// (e.g. "1,300,1000") and TRIALNET_SCALE_CYCLES change the steps and the
// cycles timed at each, for a profile that needs longer windows.
func BenchmarkScale(b *testing.B) {
	outer := b
	e := setupHost(b)
	a := startServedAgent(b, e)
	procs := []*scaleProc{
		{name: "agent", pid: a.cmd.Process.Pid},
		{name: "keeper", pid: a.keeper},
		{name: "bench", pid: os.Getpid()}, // clients, launcher, test host
	}
	for _, p := range procs {
		p.baseFDs, p.baseRSS = openFDs(p.pid), testkit.RSSBytes(p.pid)
	}
	var live []*scaleTrial
	stop := make(chan struct{})
	var busy sync.WaitGroup
	b.Cleanup(func() {
		close(stop)
		busy.Wait()
		for _, t := range live {
			t.close(a)
		}
	})
	steps := []int{1, 100, 1000}
	if v := os.Getenv("TRIALNET_SCALE_STEPS"); v != "" {
		steps = nil
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				b.Fatalf("TRIALNET_SCALE_STEPS=%q: want live Trial counts, each at least 1, separated by commas", v)
			}
			steps = append(steps, n)
		}
	}
	nCycles := scaleCycles
	if v, _ := strconv.Atoi(os.Getenv("TRIALNET_SCALE_CYCLES")); v > 0 {
		nCycles = v
	}
	for _, n := range steps {
		b.Run("live="+strconv.Itoa(n), func(b *testing.B) {
			for _, p := range procs {
				if need, limit := n*p.perTrial, nofile(b, p.pid); need > limit {
					b.Skipf("%d live Trials need about %d descriptors in the %s process (%d a Trial), over its RLIMIT_NOFILE of %d", n, need, p.name, p.perTrial, limit)
				}
			}
			made, t0 := len(live), time.Now()
			for len(live) < n {
				t, err := newScaleTrial(a, "scale-"+strconv.Itoa(len(live)))
				if err != nil {
					b.Fatalf("live Trial %d: %v", len(live), err)
				}
				live = append(live, t)
				if len(live) <= scaleBusy {
					busy.Go(func() { t.keepBusy(outer, stop) })
				}
			}
			b.Logf("%d more live Trials made in %v", len(live)-made, time.Since(t0).Round(time.Millisecond))
			var connects, cycles []time.Duration
			for i := range scaleConnects {
				t0 := time.Now()
				if err := live[i*len(live)/scaleConnects].connect(); err != nil {
					b.Fatal(err)
				}
				connects = append(connects, time.Since(t0))
			}
			phases := make([][]time.Duration, len(cyclePhases))
			for i := range nCycles {
				t0 := time.Now()
				var took [4]time.Duration
				if err := cycle(a, fmt.Sprintf("scale-cycle-%d-%d", n, i), &took); err != nil {
					b.Fatal(err)
				}
				cycles = append(cycles, time.Since(t0))
				for p, d := range took {
					phases[p] = append(phases[p], d)
				}
			}
			var pss int64
			for _, t := range live {
				pss += t.pss()
			}
			q := func(d []time.Duration, q float64) float64 {
				slices.Sort(d)
				return float64(d[int(q*float64(len(d)-1))].Microseconds()) / 1000
			}
			b.ReportMetric(q(connects, 0.5), "connect-p50-ms")
			b.ReportMetric(q(connects, 0.99), "connect-p99-ms")
			var parts []string
			for p, d := range phases {
				parts = append(parts, fmt.Sprintf("%s %.1f / %.1f ms", cyclePhases[p], q(d, 0.5), q(d, 0.99)))
			}
			b.Logf("cycle by phase, p50 / p99: %s", strings.Join(parts, ", "))
			b.ReportMetric(q(cycles, 0.5), "cycle-p50-ms")
			b.ReportMetric(q(cycles, 0.99), "cycle-p99-ms")
			b.ReportMetric(float64(pss)/(1<<10)/float64(len(live)), "procs-KiB/Trial")
			for _, p := range procs {
				p.report(b, len(live))
			}
		})
	}
}

// scaleProc is one process BenchmarkScale counts descriptors and memory
// of, from before the first Trial.
type scaleProc struct {
	name     string
	pid      int
	baseFDs  map[string]int
	baseRSS  int64
	perTrial int // descriptors a live Trial took at the last step
}

// report gives p's RSS growth and descriptors per live Trial as metrics,
// and its descriptors by kind in the log.
func (p *scaleProc) report(b *testing.B, live int) {
	b.ReportMetric(float64(testkit.RSSBytes(p.pid)-p.baseRSS)/(1<<10)/float64(live), p.name+"-KiB/Trial")
	var grown int
	var kinds []string
	for kind, c := range openFDs(p.pid) {
		if d := c - p.baseFDs[kind]; d > 0 {
			grown += d
			kinds = append(kinds, fmt.Sprintf("%s %.1f", kind, float64(d)/float64(live)))
		}
	}
	slices.Sort(kinds)
	b.ReportMetric(float64(grown)/float64(live), p.name+"-fds/Trial")
	p.perTrial = grown/live + 1
	b.Logf("%s: descriptors per live Trial, by kind: %s", p.name, strings.Join(kinds, ", "))
}

// nofile is process pid's soft descriptor limit (Go raises it to the
// hard one at start).
func nofile(b *testing.B, pid int) int {
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(s)) {
		if v, ok := strings.CutPrefix(line, "Max open files"); ok {
			if n, err := strconv.Atoi(strings.Fields(v)[0]); err == nil {
				return n
			}
		}
	}
	b.Fatalf("no descriptor limit in /proc/%d/limits", pid)
	return 0
}

// openFDs counts the descriptors process pid has open, by what they are:
// "socket", "anon_inode:bpf-map", "pipe", a file (a Trial's own files
// counted under "file").
func openFDs(pid int) map[string]int {
	n := map[string]int{}
	dir := fmt.Sprintf("/proc/%d/fd/", pid)
	e, _ := os.ReadDir(dir)
	for _, f := range e {
		to, err := os.Readlink(dir + f.Name())
		if err != nil {
			continue
		}
		kind, _, _ := strings.Cut(to, ":[")
		if strings.HasPrefix(to, "/") {
			kind = "file"
		}
		n[kind]++
	}
	return n
}

// scaleTrial is one live Trial of BenchmarkScale: its process and tunnel.
type scaleTrial struct {
	info   client.TrialInfo
	ns     *netns.Namespace
	proc   *sandbox.Process
	tunnel net.Conn
	br     *bufio.Reader
}

func newScaleTrial(a client.Trials, id string) (*scaleTrial, error) {
	ctx, cancel := context.WithTimeout(context.Background(), scaleWait)
	defer cancel()
	info, err := a.Create(ctx, trial.Request{ID: id, Allow: []string{target}})
	if err != nil {
		return nil, err
	}
	t := &scaleTrial{info: info}
	if err := t.start(); err != nil {
		t.close(a)
		return nil, err
	}
	return t, nil
}

func (t *scaleTrial) start() error {
	tr, err := agent.Attach(t.info)
	if err != nil {
		return err
	}
	if t.proc, err = tr.Start(sandbox.Command{Args: []string{"/bin/sleep", "3600"}, UID: 65534, GID: 65534}); err != nil {
		return err
	}
	if t.ns, err = netns.Open(filepath.Dir(t.info.Netns), filepath.Base(t.info.Netns)); err != nil {
		return err
	}
	t.tunnel, t.br, err = openTunnel(t.ns)
	return err
}

func (t *scaleTrial) close(a client.Trials) {
	if t.tunnel != nil {
		_ = t.tunnel.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), scaleWait)
	defer cancel()
	_, _ = a.Destroy(ctx, t.info.ID) // kills the sleep
	if t.proc != nil {
		_, _ = t.proc.Wait()
	}
}

// keepBusy echoes a byte over the Trial's tunnel every scaleBusyEvery
// until stop closes.
func (t *scaleTrial) keepBusy(b *testing.B, stop <-chan struct{}) {
	tick := time.NewTicker(scaleBusyEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		_ = t.tunnel.SetDeadline(time.Now().Add(scaleWait))
		if _, err := t.tunnel.Write([]byte{'b'}); err != nil {
			b.Errorf("busy tunnel of %s: %v", t.info.ID, err)
			return
		}
		if _, err := t.br.ReadByte(); err != nil {
			b.Errorf("busy tunnel of %s: %v", t.info.ID, err)
			return
		}
	}
}

// connect opens one more tunnel from the Trial and closes it after its
// first echoed byte.
func (t *scaleTrial) connect() error {
	c, _, err := openTunnel(t.ns)
	if err == nil {
		err = c.Close()
	}
	return err
}

// pss is the proportional set size of every process in the Trial (its
// init and its sleep), in bytes.
func (t *scaleTrial) pss() int64 {
	procs, err := os.ReadFile(filepath.Join(t.info.Cgroup, "cgroup.procs"))
	if err != nil {
		return 0
	}
	var total int64
	for _, pid := range strings.Fields(string(procs)) {
		b, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
		if err != nil {
			continue
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			if v, ok := bytes.CutPrefix(line, []byte("Pss:")); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(v)), " kB"), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

// openTunnel makes a CONNECT to target through the proxy of the Trial
// whose namespace is ns and waits for the first echoed byte.
func openTunnel(ns *netns.Namespace) (net.Conn, *bufio.Reader, error) {
	var c net.Conn
	if err := ns.Do(func() (err error) { c, err = net.Dial("tcp", agent.ProxyEndpoints[0].String()); return }); err != nil {
		return nil, nil, err
	}
	// Bounded: with no agent serving, the keeper's copy of the listener
	// leaves the connection waiting in the accept queue.
	_ = c.SetDeadline(time.Now().Add(scaleWait))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("CONNECT: %s", resp.Status)
	}
	if err == nil {
		_, err = c.Write([]byte{'x'})
	}
	if err == nil {
		_, err = br.ReadByte()
	}
	if err == nil {
		err = c.SetDeadline(time.Time{})
	}
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return c, br, nil
}

// cyclePhases are the parts of a cycle, in order.
var cyclePhases = []string{"create", "command", "byte", "destroy"}

// cycle is one more Trial's whole life: created, a command run in it
// (true, as uid 65534: its init started, the process boundary crossed),
// a byte through its proxy, destroyed. took gets each phase's time.
func cycle(a client.Trials, id string, took *[4]time.Duration) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), scaleWait)
	defer cancel()
	t0, phase := time.Now(), 0
	lap := func() {
		now := time.Now()
		took[phase], t0, phase = now.Sub(t0), now, phase+1
	}
	info, err := a.Create(ctx, trial.Request{ID: id, Allow: []string{target}})
	if err != nil {
		return err
	}
	lap()
	destroyed := false
	defer func() {
		if !destroyed {
			_, _ = a.Destroy(ctx, id)
		}
	}()
	tr, err := agent.Attach(info)
	if err != nil {
		return err
	}
	if code, err := tr.Exec(ctx, sandbox.Command{Args: []string{"/bin/true"}, UID: 65534, GID: 65534}, nil); err != nil || code != 0 {
		return fmt.Errorf("true in %s: %d %v", id, code, err)
	}
	lap()
	if err := firstByte(info); err != nil {
		return err
	}
	lap()
	destroyed = true
	_, err = a.Destroy(ctx, id)
	lap()
	return err
}
