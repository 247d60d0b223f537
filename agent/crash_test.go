//go:build linux

package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// The agent SIGKILLed at random points (seeded: TRIALNET_CRASH_SEED
// repeats a run) while a client creates, runs and destroys Trials:
// during its start (sweeps, re-adoption), a shell's or files' refill, a
// create between the take of a shell and the Trial's record, a destroy,
// and a hand-over to a successor started beside it. After each kill the
// next agent reports only whole Trials, and once the last has destroyed
// them and stopped nothing is left: no shell groups (v2 or v1), prepared
// files, namespaces, nsfs mounts, pins beyond the install's or
// processes; every receipt written verifies.
func TestPrivilegedAgentKilledAnywhereLeavesNothing(t *testing.T) {
	privtest.Require(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TRIALNET_CRASH_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("repeat with TRIALNET_CRASH_SEED=%d", seed)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 0))
	w := newWorld(t, 236)
	ac := newAgentCmd(t, w, "profiles:\n  ctr:\n    allow: [\"allowed.test:443\"]\n")
	bin, args, c, host := ac.bin, ac.args, ac.c, ac.host
	v1Before := v1PoolGroups(t)

	var (
		mu      sync.Mutex
		created = map[string]bool{} // every id a create was asked for
		// made and adopted count the creates and container adoptions
		// that succeeded: a run that made none tested nothing.
		made, adopted int
		cgroupIDs     []uint64 // of the Trials made
	)
	// churn creates Trials (some transparent, some running a process)
	// and destroys some, until stop; errors are expected (the agent dies).
	churn := func(stop <-chan struct{}, g, iter int, r *rand.Rand) {
		for j := 0; ; j++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("crash-%d-%d-%d", iter, g, j)
			mu.Lock()
			created[id] = true
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			info, err := c.Create(ctx, trialspec.Request{ID: id, NoTransparent: r.IntN(3) == 0})
			cancel()
			if err != nil {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			mu.Lock()
			made++
			cgroupIDs = append(cgroupIDs, info.CgroupID)
			mu.Unlock()
			if r.IntN(2) == 0 {
				startSleeper(info)
			}
			if r.IntN(3) > 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, _ = c.Destroy(ctx, id)
				cancel()
			}
			if r.IntN(4) == 0 {
				// A pause: the refill makes shells and files in it.
				time.Sleep(time.Duration(20+r.IntN(80)) * time.Millisecond)
			}
		}
	}

	mount, err := sandbox.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var (
		inits      []*exec.Cmd // the containers' inits: their runtime's
		containers []string    // their cgroups, the runtime's to remove
	)
	// containerChurn plays a runtime and its hooks: a cgroup prepared by
	// the agent, an init in it (in a namespace of its own), the Trial
	// made around it, and destroyed or left.
	containerChurn := func(stop <-chan struct{}, iter int, r *rand.Rand) {
		for j := 0; ; j++ {
			select {
			case <-stop:
				return
			default:
			}
			cid := fmt.Sprintf("ctr-%d-%d", iter, j)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			pc, err := c.PrepareContainer(ctx, client.ContainerPrepare{Container: cid, Profile: "ctr", CgroupsPath: strings.TrimPrefix(host.Parent, mount) + "/" + cid})
			cancel()
			if err != nil {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			mu.Lock()
			containers = append(containers, pc.Cgroup)
			mu.Unlock()
			cg, err := os.Open(pc.Cgroup)
			if err != nil {
				continue // dropped meanwhile (the agent died)
			}
			init := exec.Command(self)
			init.Env = append(os.Environ(), probeEnv+"=1")
			init.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, UseCgroupFD: true, CgroupFD: int(cg.Fd())}
			if _, err := init.StdinPipe(); err != nil { // it runs while this is open
				t.Error(err)
				return
			}
			err = init.Start()
			_ = cg.Close()
			if err != nil {
				continue
			}
			mu.Lock()
			inits = append(inits, init)
			mu.Unlock()
			ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
			info, err := c.ContainerTrial(ctx, client.ContainerTrial{Profile: "ctr", Container: client.Container{ID: cid, PID: init.Process.Pid}})
			cancel()
			if err == nil {
				mu.Lock()
				created[info.ID] = true
				adopted++
				cgroupIDs = append(cgroupIDs, info.CgroupID)
				mu.Unlock()
				if r.IntN(2) == 0 {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, _ = c.Destroy(ctx, info.ID)
					cancel()
				}
			}
		}
	}
	killInits := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range inits {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
		inits = nil
	}
	t.Cleanup(killInits)

	const iterations = 10
	start := time.Now()
	deadline, catchUp := start.Add(35*time.Second), start.Add(2*time.Minute)
	var (
		agents    []*agentProc
		agentPIDs []int // every agent's, for the shells' groups they name
	)
	// More iterations while none made a Trial or adopted a container (a
	// slow guest: a TCG guest beside two others adopted none in 7), to
	// a later deadline, each giving the agent 2 s more before its kill.
	short := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return made == 0 || adopted == 0
	}
	for i := 0; i < iterations && time.Now().Before(deadline) || short() && time.Now().Before(catchUp); i++ {
		cur := runAgent(t, bin, args...)
		agents = append(agents, cur)
		agentPIDs = append(agentPIDs, cur.cmd.Process.Pid)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 2 {
			r := rand.New(rand.NewPCG(seed, uint64(i*2+g+1)))
			wg.Add(1)
			go func() { defer wg.Done(); churn(stop, g, i, r) }()
		}
		wg.Add(1)
		go func() { defer wg.Done(); containerChurn(stop, i, rand.New(rand.NewPCG(seed, uint64(1000+i)))) }()
		victim := cur
		delay := time.Duration(rng.IntN(700)) * time.Millisecond
		if i >= iterations || time.Now().After(deadline) {
			delay += 2 * time.Second
		}
		// One kill in four falls in the agent's start-up; the others
		// count from its first answer, which a slow guest takes long
		// to give.
		startUp := rng.IntN(4) == 0
		if rng.IntN(3) == 0 {
			// A hand-over: a successor starts beside the running agent;
			// one of the two dies at a random point of it.
			waitReady(t, c, cur)
			time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
			next := runAgent(t, bin, args...)
			agents = append(agents, next)
			agentPIDs = append(agentPIDs, next.cmd.Process.Pid)
			if rng.IntN(2) == 0 {
				victim = next
			}
			t.Logf("iteration %d: hand-over, kill the %s after %v", i, map[bool]string{true: "successor", false: "predecessor"}[victim == next], delay)
		} else if startUp {
			t.Logf("iteration %d: kill in the start-up, after %v", i, delay)
		} else {
			waitReady(t, c, cur)
			t.Logf("iteration %d: kill %v after the first answer", i, delay)
		}
		time.Sleep(delay)
		_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		_ = victim.cmd.Wait()
		close(stop)
		wg.Wait()
		// Whatever survived is killed too: the next iteration's agent
		// starts alone.
		for _, p := range agents {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Signal(syscall.SIGKILL)
				_ = p.cmd.Wait()
			}
		}
		agents = agents[:0]
	}

	t.Logf("%d Trials made, %d containers adopted", made, adopted)
	if made == 0 || adopted == 0 {
		t.Error("the agents made no Trial or adopted no container between the kills")
	}
	last := runAgent(t, bin, args...)
	agentPIDs = append(agentPIDs, last.cmd.Process.Pid)
	waitReady(t, c, last)
	mu.Lock()
	ids := created
	mu.Unlock()
	list, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, info := range list {
		listed[info.ID] = true
		checkWhole(t, c, ac.state, ac.data, info)
	}
	for id := range ids {
		if !listed[id] {
			checkGone(t, ac.state, host, id)
		}
	}
	for _, info := range list {
		if _, err := c.Destroy(context.Background(), info.ID); err != nil {
			t.Errorf("destroy %s: %v\n%s", info.ID, err, last.stderr.String())
		}
	}
	_ = last.cmd.Process.Signal(syscall.SIGTERM)
	if err := last.cmd.Wait(); err != nil {
		t.Errorf("the last agent: %v\n%s", err, last.stderr.String())
	}
	if t.Failed() {
		t.Logf("the last agent's log:\n%s", last.stderr.String())
	}
	// The runtime's part: its inits end, and it removes the cgroups it
	// asked for (an adopted Trial's is left to it, emptied).
	killInits()
	for _, cg := range containers {
		if err := unix.Rmdir(cg); err != nil && !errors.Is(err, unix.ENOENT) {
			t.Errorf("a container's cgroup %s: %v", cg, err)
		}
	}

	for _, d := range []string{host.Parent, ac.state, ac.data} {
		if left := shellEntries(t, d); len(left) > 0 {
			t.Errorf("prepared shells or files left in %s: %v", d, left)
		}
	}
	if left := subdirs(t, host.Parent); len(left) > 0 {
		t.Errorf("cgroups left under %s: %v", host.Parent, left)
	}
	if procs := treeProcs(host.Parent); len(procs) > 0 {
		t.Errorf("processes left under %s: %v", host.Parent, procs)
	}
	// The v1 pools' parents are shared with every other test binary that
	// runs meanwhile (go test runs packages side by side): only this
	// test's groups count, its agents' shells and its Trials' groups.
	if left := ownV1Groups(t, v1Before, agentPIDs, cgroupIDs); len(left) > 0 {
		t.Errorf("cgroup v1 pool groups left: %v", left)
	}
	if ns, _ := os.ReadDir(host.NetnsDir); len(ns) > 0 {
		t.Errorf("namespaces left in %s: %d", host.NetnsDir, len(ns))
	}
	if n := nsfsMountsUnder(t, host.NetnsDir); n > 0 {
		t.Errorf("nsfs mounts left under %s: %d", host.NetnsDir, n)
	}
	if pins := trialPins(t, host.PinDir); len(pins) > 0 {
		t.Errorf("Trials' pins left in %s: %v", host.PinDir, pins)
	}
	if ents, _ := os.ReadDir(ac.state); len(ents) > 0 {
		var names []string
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") && !strings.HasSuffix(e.Name(), ".sock") {
				names = append(names, e.Name())
			}
		}
		if len(names) > 0 {
			t.Errorf("state left in %s: %v", ac.state, names)
		}
	}
	for _, id := range cgroupIDs {
		for _, name := range []string{"init-", "join-"} { // sandbox's launch locks
			p := filepath.Join(rootdir.Locks, name+strconv.FormatUint(id, 10))
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a Trial's launch lock %s is left (%v)", p, err)
			}
		}
	}
	checkReceipts(t, ac.data)
}

// startSleeper runs a process in the Trial that outlives the test unless
// a destroy (or the sweep of a half-made Trial) ends it. It is started
// before the caller goes on to destroy the Trial: a launch racing a
// destroy is not what this test is about.
func startSleeper(info client.TrialInfo) {
	tr, err := Attach(info)
	if err != nil {
		return
	}
	p, err := tr.Start(sandbox.Command{Args: []string{"sleep", "120"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534})
	if err == nil {
		go func() { _, _ = p.Wait() }()
	}
}

// checkWhole fails unless every part of a Trial the agent reports is
// there: its record, cgroup, namespace, policy entry and files.
func checkWhole(t *testing.T, c *client.Client, state, data string, info client.TrialInfo) {
	t.Helper()
	for _, p := range []string{filepath.Join(state, info.ID+".json"), info.Cgroup, info.Netns, filepath.Join(data, info.ID, decisionsFile)} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("Trial %s is reported but not whole: %v", info.ID, err)
		}
	}
	if st, err := c.Stats(context.Background(), info.ID); err != nil || st.Kernel == nil {
		t.Errorf("Trial %s is reported but has no policy counters: %v", info.ID, err)
	}
	if info.Container != "" {
		return // commands run in it through its runtime
	}
	// A command runs in it: a destroy cut short did not leave it closed
	// to launches.
	tr, err := Attach(info)
	if err != nil {
		t.Errorf("Trial %s is reported but cannot be attached: %v", info.ID, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if code, err := tr.Exec(ctx, sandbox.Command{Args: []string{"true"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534}, nil); code != 0 || err != nil {
		t.Errorf("Trial %s is reported but runs no command: exit %d, %v", info.ID, code, err)
	}
}

// checkGone fails if anything of Trial id that is not reported is left
// but its data (kept for a destroyed Trial).
func checkGone(t *testing.T, state string, host Config, id string) {
	t.Helper()
	left := []string{filepath.Join(state, id+".json"), filepath.Join(state, id+".ledgers"), filepath.Join(state, id+namesSuffix),
		filepath.Join(state, id+dnsCountsSuffix), filepath.Join(host.NetnsDir, id)}
	if !strings.HasPrefix(id, "ctr-") { // a container's cgroup is its runtime's
		left = append(left, filepath.Join(host.Parent, id))
	}
	for _, p := range left {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Trial %s is not reported but %s is there (%v)", id, p, err)
		}
	}
}

// v1PoolGroups are the groups in the cgroup v1 pools' parents.
func v1PoolGroups(t *testing.T) []string {
	var out []string
	for _, h := range []string{"pids", "memory"} {
		d := filepath.Join("/sys/fs/cgroup", h, sandbox.ParentName)
		for _, e := range subdirs(t, d) {
			out = append(out, filepath.Join(d, e))
		}
	}
	return out
}

func subdirs(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// treeProcs are the processes in cgroup dir and those under it.
func treeProcs(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			out = append(out, strings.Fields(string(b))...)
		}
		return nil
	})
	return out
}

// nsfsMountsUnder counts the nsfs mounts at or below dir (other tests'
// namespaces are mounted elsewhere meanwhile).
func nsfsMountsUnder(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for s := bufio.NewScanner(f); s.Scan(); {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && strings.Contains(s.Text(), " - nsfs ") &&
			(fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			n++
		}
	}
	return n
}

// ownV1Groups are the v1 pool groups, not there before, that this
// test's agents (pids) made: their shells' groups, and the Trials'
// (named by cgroup id). A Trial whose create answer the kill cut off is
// not in ids: a Trial's group whose v2 cgroup no longer exists anywhere
// counts too, if it stays (another test's destroy may be between its
// two removals).
func ownV1Groups(t *testing.T, before []string, pids []int, ids []uint64) []string {
	t.Helper()
	suspect := func() []string {
		live := liveCgroupIDs(t)
		var out []string
		for _, g := range v1PoolGroups(t) {
			name := filepath.Base(g)
			switch {
			case slices.Contains(before, g):
			case strings.HasPrefix(name, "_shell-"):
				pid, _, _ := strings.Cut(strings.TrimPrefix(name, "_shell-"), "-")
				if n, err := strconv.Atoi(pid); err == nil && slices.Contains(pids, n) {
					out = append(out, g)
				}
			case strings.HasPrefix(name, "trialnet-"):
				id, err := strconv.ParseUint(strings.TrimPrefix(name, "trialnet-"), 10, 64)
				if err == nil && (slices.Contains(ids, id) || !live[id]) {
					out = append(out, g)
				}
			}
		}
		return out
	}
	left := suspect()
	for end := time.Now().Add(2 * time.Second); len(left) > 0 && time.Now().Before(end); left = suspect() {
		time.Sleep(100 * time.Millisecond)
	}
	return left
}

// liveCgroupIDs are the ids (inode numbers) of every cgroup v2 group.
func liveCgroupIDs(t *testing.T) map[uint64]bool {
	t.Helper()
	mount, err := sandbox.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[uint64]bool{}
	_ = filepath.WalkDir(mount, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			var st unix.Stat_t
			if unix.Stat(p, &st) == nil {
				ids[st.Ino] = true
			}
		}
		return nil
	})
	return ids
}

// trialPins are the pins in dir a Trial's policy or steering has.
func trialPins(t *testing.T, dir string) []string {
	t.Helper()
	return namesWithPrefix(t, dir, "steer_")
}

// checkReceipts verifies every receipt kept in data against the host's
// key.
func checkReceipts(t *testing.T, data string) {
	t.Helper()
	found, _ := filepath.Glob(filepath.Join(data, "*", "receipt.json"))
	if len(found) == 0 {
		return
	}
	pub, err := ReadPublicKey(ReceiptPublicKey(DefaultReceiptKey))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range found {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var s client.SignedReceipt
		if err := json.Unmarshal(b, &s); err != nil {
			t.Errorf("receipt %s: %v", p, err)
			continue
		}
		if _, err := s.Verify(pub); err != nil {
			t.Errorf("receipt %s: %v", p, err)
		}
	}
}
