//go:build linux

package containers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/test/ctr"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// unpreparedRefused reports whether the BPF LSM layer is active, after
// showing that there a profile container that no one prepared is refused
// before it starts, leaving nothing: the runtime puts the container's
// init in its cgroup under the Trial parent before any hook runs, and
// the layer denies a task in a cgroup there without a policy entry
// everything (runc's sync socket), as it must for a Trial cgroup whose
// policy is gone. Where it is active, profile containers run through
// trialnet oci-runtime, which has the agent prepare their cgroup.
func (w *world) unpreparedRefused(t *testing.T) bool {
	t.Helper()
	st, err := w.agent.Stats(context.Background(), w.info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Layers.BPFLSM {
		return false
	}
	out, err := newRunc(w).run("prof-lsm", w.profileBundle("prof-lsm", "echo "+started, "createRuntime", "poststop"))
	if err == nil || strings.Contains(out, started) {
		t.Fatalf("under the BPF LSM layer a profile container no one prepared started (%v)\n%s", err, out)
	}
	t.Logf("BPF LSM layer active: a profile container no one prepared (the hook alone) is refused before it starts (%v), leaving nothing; through trialnet oci-runtime from here on:\n%s", err, out)
	w.onlyTrials(w.info.ID)
	return true
}

// runc runs bundles of a world with a state directory of the test's own;
// wrapped, through trialnet oci-runtime, which adds the hook at
// createRuntime itself.
type runc struct {
	w       *world
	state   string
	wrapped bool
}

func newRunc(w *world) *runc {
	w.t.Cleanup(func() { ctr.RemoveV1Cgroups(w.cgroup) })
	return &runc{w: w, state: w.t.TempDir()}
}

// profileRunc runs profile bundles: through trialnet oci-runtime where
// the BPF LSM layer is active (after showing the hook alone refused
// there), else runc with the bundle's hooks.
func (w *world) profileRunc(t *testing.T) *runc {
	r := newRunc(w)
	if w.agent == nil { // a daemon of its own: the kernel says
		r.wrapped = bpf.HaveLSM() == nil
		return r
	}
	r.wrapped = w.unpreparedRefused(t)
	return r
}

// command is runc with args, after --root.
func (r *runc) command(args ...string) *exec.Cmd {
	if !r.wrapped {
		return exec.Command("runc", append([]string{"--root", r.state}, args...)...)
	}
	path, err := exec.LookPath("runc")
	if err != nil {
		r.w.t.Fatal(err)
	}
	return exec.Command(r.w.bin, append([]string{"oci-runtime", "--runc", path, "--socket", r.w.sock, "--", "--root", r.state}, args...)...)
}

// bundle writes the bundle of o, less its createRuntime hook when
// wrapped: the wrapper adds it.
func (r *runc) bundle(name string, o bundleOpts) string {
	if r.wrapped {
		o.hooks = slices.DeleteFunc(slices.Clone(o.hooks), func(s string) bool { return s == "createRuntime" })
	}
	return r.w.bundleWith(name, o)
}

// run runs the bundle to its end, then deletes what runc keeps of it.
func (r *runc) run(name string, o bundleOpts) (string, error) {
	out, err := r.command("run", "--bundle", r.bundle(name, o), name).CombinedOutput()
	_ = exec.Command("runc", "--root", r.state, "delete", "--force", name).Run()
	return string(out), err
}

// profileBundle is a bundle annotated with the test's profile, in a new
// network namespace and a cgroup directly under the Trial parent, with
// the hook at the stages given.
func (w *world) profileBundle(name, script string, stages ...string) bundleOpts {
	return bundleOpts{cgroupsPath: filepath.Dir(w.cgroup) + "/" + name, script: script, hooks: stages,
		annotations: map[string]string{"trialnet.io/profile": profile}}
}

// finalStats are the stats the agent wrote when it destroyed Trial id.
// The destroy writes them last, after the Trial stops being live (which
// waitGone waits for), in place: wait, bounded, until they read whole.
func (w *world) finalStats(id string) (client.Stats, error) {
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var st client.Stats
		b, err := os.ReadFile(filepath.Join(w.dir, "data", id, "stats.json"))
		if err == nil {
			err = json.Unmarshal(b, &st)
		}
		if err == nil || time.Now().After(end) {
			return st, err
		}
	}
}

// waitGone waits, bounded, until the agent no longer has Trial id live.
func (w *world) waitGone(id string) error {
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := w.agent.Get(context.Background(), id)
		var e *client.Error
		if errors.As(err, &e) && e.Code == client.CodeUnknownTrial {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("Trial %s is still live (%v)", id, err)
		}
	}
}

// onlyTrials fails unless the agent's live Trials, and the namespaces
// in its directory, are ids: a refused container left nothing.
func (w *world) onlyTrials(ids ...string) {
	w.t.Helper()
	list, err := w.agent.List(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	var live []string
	for _, info := range list {
		live = append(live, info.ID)
	}
	mounted, _ := netns.List(filepath.Dir(w.info.Netns))
	if strings.Join(live, ",") != strings.Join(ids, ",") || strings.Join(mounted, ",") != strings.Join(ids, ",") {
		w.t.Errorf("live Trials %v, namespaces %v; want %v", live, mounted, ids)
	}
}

// A runc container annotated with a profile becomes a Trial of its own:
// its direct connection is refused and counted, the proxy takes it to
// the allowed host and refuses another, and the Trial, its id the
// container's, is destroyed when the container ends, with its final
// stats and receipt.
func TestPrivilegedContainerProfileRunc(t *testing.T) {
	requireRuntimes(t, false, "runc")
	w := newContainerTrial(t, "ctr-base")
	r := w.profileRunc(t)
	script := w.script() + "; wget -q -O - http://other.test/; echo other-exit=$?"
	out, err := r.run("prof-in", w.profileBundle("prof-in", script, "createRuntime", "poststop"))
	t.Logf("runc with a profile:\n%s", out)
	if err != nil {
		t.Fatalf("runc run with a profile: %v", err)
	}
	for _, want := range []string{started, "nc-exit=1", greeting, "wget-exit=0", "other-exit=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("the container's output lacks %q", want)
		}
	}
	if n := w.host.Arrivals(); n != 0 {
		t.Errorf("%d connections reached the test host's canary directly", n)
	}
	if err := w.waitGone("prof-in"); err != nil {
		t.Fatalf("the container ended and its Trial did not: %v", err)
	}
	st, err := w.finalStats("prof-in")
	if err != nil {
		t.Fatalf("the Trial's final stats: %v", err)
	}
	t.Logf("final stats: connect4_denied %d, tunnels allowed %d denied %d, egress %d, %s", st.Kernel["connect4_denied"], st.Proxy.Allowed, st.Proxy.Denied, st.Egress, st.Layers)
	if st.Kernel["connect4_denied"] == 0 || st.Proxy.Allowed == 0 || st.Proxy.Denied == 0 || st.Egress != 0 || st.Receipt == nil || st.Layers.Containers != 1 {
		t.Errorf("the Trial's final stats: want the direct connection refused and counted, one tunnel allowed and one refused, no egress, a receipt and 1 container")
	}
	w.onlyTrials(w.info.ID)
}

// A Trial made around a container ends when the agent sees the
// container's init exit, with no poststop hook (a runtime that skips it
// leaks no Trial); a Trial made with create lives on after containers
// that joined it end, which it lists among its ended containers, told
// at poststop or seen by the agent.
func TestPrivilegedContainerEndsItsTrial(t *testing.T) {
	requireRuntimes(t, false, "runc")
	w := newContainerTrial(t, "ctr-keep")
	r := w.profileRunc(t)
	if out, err := r.run("prof-nopost", w.profileBundle("prof-nopost", "echo "+started, "createRuntime")); err != nil || !strings.Contains(out, started) {
		t.Fatalf("runc run with a profile: %v\n%s", err, out)
	}
	if err := w.waitGone("prof-nopost"); err != nil {
		t.Errorf("with no poststop: %v", err)
	}
	if _, err := w.finalStats("prof-nopost"); err != nil {
		t.Errorf("the Trial's final stats: %v", err)
	}

	o := bundleOpts{netns: w.info.Netns, cgroupsPath: w.cgroup + "/joined", script: "echo " + started, hooks: []string{"createRuntime", "poststop"},
		annotations: map[string]string{"trialnet.io/trial": w.info.ID}}
	if out, err := r.run("joined", o); err != nil || !strings.Contains(out, started) {
		t.Fatalf("runc run in the created Trial: %v\n%s", err, out)
	}
	// With no poststop, the agent sees the container's init exit.
	o.cgroupsPath, o.hooks = w.cgroup+"/joined-nopost", []string{"createRuntime"}
	if out, err := r.run("joined-nopost", o); err != nil || !strings.Contains(out, started) {
		t.Fatalf("runc run in the created Trial: %v\n%s", err, out)
	}
	data := filepath.Join(w.dir, "data", w.info.ID)
	var live, ended []byte
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		live, _ = os.ReadFile(filepath.Join(data, "containers.jsonl"))
		ended, _ = os.ReadFile(filepath.Join(data, "containers-ended.jsonl"))
		if strings.Count(string(ended), "\n") == 2 || time.Now().After(end) {
			break
		}
	}
	for _, id := range []string{`"joined"`, `"joined-nopost"`} {
		if strings.Contains(string(live), id) || !strings.Contains(string(ended), id) {
			t.Errorf("ended container %s is still listed live (%q), or not among the ended (%q)", id, live, ended)
		}
	}
	st, err := w.agent.Stats(context.Background(), w.info.ID)
	if err != nil {
		t.Fatalf("the created Trial after its containers ended: %v", err)
	}
	if st.Layers.Containers != 2 {
		t.Errorf("the created Trial counts %d containers, want 2 (ended ones too)", st.Layers.Containers)
	}
	w.onlyTrials(w.info.ID)
}

// A container annotated with a profile is refused, and nothing is left
// of a Trial for it, unless its network namespace is fresh and its
// cgroup is where a Trial's is; each bundle starts without the hook.
func TestPrivilegedContainerProfileRefused(t *testing.T) {
	requireRuntimes(t, false, "runc")
	w := newContainerTrial(t, "ctr-ref")
	r := w.profileRunc(t)
	nsDir := t.TempDir()
	plain := testenv.PlainCgroup(t, "ctr-ref")
	mount := strings.TrimSuffix(w.info.Cgroup, w.cgroup)
	t.Cleanup(func() { ctr.RemoveV1Cgroups(strings.TrimPrefix(plain, mount)) })
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, o *bundleOpts)
		want  string
	}{
		{"an interface besides lo", func(t *testing.T, o *bundleOpts) {
			ns := testNetns(t, nsDir, "nb-dummy")
			h, err := netlink.NewHandleAt(vnetns.NsHandle(nsFd(t, ns.Path)))
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth1"}); err != nil {
				t.Fatal(err)
			}
			o.netns = ns.Path
		}, "interfaces besides lo: eth0 (veth), eth1 (veth): run it with --network none"},
		{"a host process in its namespace", func(t *testing.T, o *bundleOpts) {
			ns := testNetns(t, nsDir, "nb-proc")
			cmd := exec.Command("sleep", "60")
			if err := ns.Do(cmd.Start); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			o.netns = ns.Path
		}, "(sleep) outside the container is in its network namespace"},
		{"a thread of a host process in its namespace", func(t *testing.T, o *bundleOpts) {
			ns := testNetns(t, nsDir, "nb-thread")
			threadIn(t, ns.Path)
			o.netns = ns.Path
		}, fmt.Sprintf("process %d (", os.Getpid())},
		{"a socket in its namespace", func(t *testing.T, o *bundleOpts) {
			ns := testNetns(t, nsDir, "nb-sock")
			ln, err := ns.Listen(context.Background(), "tcp", "127.0.0.1:9999")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ln.Close() })
			o.netns = ns.Path
		}, "it already has sockets (1 tcp)"},
		{"another Trial's namespace", func(t *testing.T, o *bundleOpts) {
			o.netns = w.info.Netns
		}, "it is Trial ctr-ref's network namespace"},
		{"a cgroup outside the Trial parent", func(t *testing.T, o *bundleOpts) {
			o.cgroupsPath = strings.TrimPrefix(plain, mount) + "/prof-ref"
		}, "directly under trialnet's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "prof-" + strings.ReplaceAll(tc.name, " ", "")[:8]
			o := w.profileBundle(name, "echo "+started, "createRuntime", "poststop")
			tc.setup(t, &o)
			out, err := r.run(name, o)
			t.Logf("with the hook: %v\n%s", err, out)
			if err == nil || strings.Contains(out, started) || !strings.Contains(out, tc.want) {
				t.Errorf("want refused, saying %q", tc.want)
			}
			w.onlyTrials(w.info.ID)
			if r.wrapped {
				return // the wrapper adds the hook; under the BPF LSM layer nothing unprepared starts at all
			}
			o.hooks = nil
			if out, err := r.run(name+"-nohook", o); err != nil || !strings.Contains(out, started) {
				t.Errorf("without the hook the bundle did not start either (%v):\n%s", err, out)
			}
		})
	}
}

// threadIn puts one thread of this process in the network namespace at
// path until the test ends, the process and its other threads staying
// in the host's: a process that only a thread of shares a namespace.
// Not the leader thread, whose namespace /proc/PID/ns shows as the
// process's: a goroutine that lands on it keeps it locked, so that the
// next cannot.
func threadIn(t *testing.T, path string) {
	t.Helper()
	leave := make(chan struct{})
	t.Cleanup(func() { close(leave) })
	for {
		entered := make(chan error)
		go func() {
			runtime.LockOSThread()
			if unix.Gettid() == unix.Getpid() {
				entered <- errLeader
				<-leave
				runtime.UnlockOSThread()
				return
			}
			orig, err := vnetns.Get()
			if err != nil {
				entered <- err
				return // the thread ends with the goroutine
			}
			defer orig.Close()
			ns, err := vnetns.GetFromPath(path)
			if err == nil {
				err = vnetns.Set(ns)
				_ = ns.Close()
			}
			entered <- err
			if err == nil {
				<-leave
			}
			if vnetns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
		}()
		err := <-entered
		if err == nil {
			return
		}
		if err != errLeader {
			t.Fatal(err)
		}
	}
}

var errLeader = errors.New("on the leader thread")

// testNetns is a network namespace of the test's own, mounted in dir.
func testNetns(t *testing.T, dir, name string) *netns.Namespace {
	t.Helper()
	ns, err := netns.Create(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	return ns
}

func nsFd(t *testing.T, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	return fd
}

// A podman container (crun) run with docs/containers.md's profile flags
// becomes a Trial of its own and ends with it; with a network other
// than none it is refused, and starts without the hook.
func TestPrivilegedContainerPodmanProfile(t *testing.T) {
	requireRuntimes(t, true, "podman", "crun", "conmon")
	w := newContainerTrial(t, "ctr-pmprof")
	p := newPodman(w) // the default hooks.d entry prepares it at podman's precreate stage
	base := []string{"--annotation", "trialnet.io/profile=" + profile, "--cgroups", "no-conmon", "--security-opt", "seccomp=" + w.seccomp,
		"--cgroup-parent", filepath.Dir(w.cgroup)}
	for _, e := range proxyEnv() {
		base = append(base, "--env", e)
	}
	out, err := p.run(w.hooks, append(slices.Clone(base), "--network", "none"), w.script())
	t.Logf("podman with a profile:\n%s", out)
	if err != nil {
		t.Fatalf("podman run with a profile: %v", err)
	}
	for _, want := range []string{started, "nc-exit=1", greeting, "wget-exit=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("the container's output lacks %q", want)
		}
	}
	list, err := w.agent.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range list {
		if info.Container != "" {
			if err := w.waitGone(info.ID); err != nil {
				t.Errorf("the container ended and its Trial did not: %v", err)
			}
		}
	}
	w.onlyTrials(w.info.ID)
	// A namespace with a way out: a veth pair, as a runtime's bridge
	// network would give it.
	ns := testNetns(t, t.TempDir(), "pm-veth")
	h, err := netlink.NewHandleAt(vnetns.NsHandle(nsFd(t, ns.Path)))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth1"}); err != nil {
		t.Fatal(err)
	}
	bridged := append(slices.Clone(base), "--network", "ns:"+ns.Path)
	if out, err := p.run(w.hooks, bridged, "echo "+started); err == nil || strings.Contains(out, started) {
		t.Errorf("a profile container with a network: started (%v):\n%s", err, out)
	}
	w.onlyTrials(w.info.ID)
	if st, err := w.agent.Stats(context.Background(), w.info.ID); err != nil || st.Layers.BPFLSM {
		t.Logf("no control without the hook: under the BPF LSM layer a profile container no one prepared does not start at all (%v)", err)
		return
	}
	if out, err := p.run(w.noHooks, bridged, "echo "+started); err != nil || !strings.Contains(out, started) {
		t.Errorf("without the hook it did not start either (%v):\n%s", err, out)
	}
}
