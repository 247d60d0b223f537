//go:build linux

package nriplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/agentwire"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/nritest"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/ocihook"
	"github.com/trialnet/trialnet/trial"
)

// world is a real agent with a profile, the NRI library's runtime side,
// and the plugin between them over their sockets.
type world struct {
	t     testing.TB
	a     *agent.Agent
	sock  string
	mount string
	rt    *runtime
}

func newNRIWorld(t testing.TB) *world {
	privtest.Require(t)
	f, err := config.ParseFile([]byte("profiles:\n  claude:\n    allow: [\"api.example.test:443\"]\n  pypi:\n    allow: [\"pypi.org:443\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, _, sock := testenv.ServedAgent(t, "nri", agent.AgentConfig{File: f})
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, a: a, sock: sock, mount: mount, rt: newRuntime(t)}
}

func (w *world) plugin() *Plugin {
	return &Plugin{Agent: client.NewClient(w.sock), Socket: w.sock, CgroupMount: w.mount,
		HookPath: "/opt/trialnet/bin/trialnet-oci", ResolvConf: "/opt/trialnet/resolv.conf"}
}

func (w *world) trial(id string) (client.TrialInfo, bool) {
	info, err := w.a.Get(context.Background(), id)
	if isCode(err, client.CodeUnknownTrial) {
		return info, false
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return info, true
}

// A pod annotated with a profile is a Trial made from it; each of its
// containers is adjusted into the Trial (a child of its cgroup, its
// network namespace, the proxy's environment, the stub's resolv.conf, the
// hook and its annotation), and the hook, run on a process placed as the
// adjustment says, lets it in; a privileged container of the pod is
// refused; the Trial goes with the pod.
func TestPrivilegedPodIsATrial(t *testing.T) {
	w := newNRIWorld(t)
	w.rt.connect(w.plugin())
	pod := testPod("evals", "task-1", "claude")
	id := TrialID(pod)

	adj, err := w.rt.create(pod, testContainer("c1"))
	if err != nil {
		t.Fatal(err)
	}
	info, ok := w.trial(id)
	if !ok || !slices.Equal(info.Profiles, []string{"claude"}) {
		t.Fatalf("the pod's Trial %s: live %v, profiles %q", id, ok, info.Profiles)
	}
	checkAdjustment(t, adj, info, w.mount, "c1")
	hookLetsIn(t, w, adj, info)

	adj2, err := w.rt.create(pod, testContainer("c2"))
	if err != nil {
		t.Fatal(err)
	}
	checkAdjustment(t, adj2, info, w.mount, "c2")
	if trials, _ := w.a.List(context.Background()); len(trials) != 1 {
		t.Errorf("two containers of one pod: %d Trials", len(trials))
	}

	priv := withoutNS(testContainer("c3"), "cgroup")
	priv.Mounts[2].Options = []string{"rw"}
	if _, err := w.rt.create(pod, priv); err == nil || !strings.Contains(err.Error(), "writable cgroup file system") {
		t.Errorf("a privileged container of the pod: %v; want refused", err)
	}

	if err := w.rt.stopPod(pod); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.trial(id); ok {
		t.Fatalf("the Trial outlives its pod's stop")
	}
	if err := w.rt.nri.RemovePodSandbox(context.Background(), &api.RemovePodSandboxRequest{Pod: pod}); err != nil {
		t.Errorf("removing a stopped pod: %v", err)
	}
}

// A pod's profiles are the agent's to check: one it does not know
// refuses the container, saying so; two, in any order and spacing, make
// one Trial that serves each container.
func TestPrivilegedPodProfiles(t *testing.T) {
	w := newNRIWorld(t)
	w.rt.connect(w.plugin())
	_, err := w.rt.create(testPod("evals", "typo", "claud"), testContainer("c1"))
	if err == nil || !strings.Contains(err.Error(), "the agent could not make its Trial") || !strings.Contains(err.Error(), "claud") {
		t.Errorf("an unknown profile: %v; want refused, naming it", err)
	}
	pod := testPod("evals", "two", "pypi, claude")
	for _, c := range []string{"c2", "c3"} {
		if _, err := w.rt.create(pod, testContainer(c)); err != nil {
			t.Fatalf("container %s of a pod with two profiles: %v", c, err)
		}
	}
	if trials, _ := w.a.List(context.Background()); len(trials) != 1 {
		t.Errorf("%d Trials, want the one of the pod with two profiles", len(trials))
	}
}

func checkAdjustment(t *testing.T, adj *api.ContainerAdjustment, info client.TrialInfo, mount, ctr string) {
	t.Helper()
	cg := filepath.Join(mount, adj.GetLinux().GetCgroupsPath())
	if cg != filepath.Join(info.Cgroup, "ctr-"+ctr) {
		t.Errorf("cgroups path %q (%s), want a child of the Trial's %s", adj.GetLinux().GetCgroupsPath(), cg, info.Cgroup)
	}
	var netns []string
	for _, n := range adj.GetLinux().GetNamespaces() {
		netns = append(netns, n.GetType()+"="+n.GetPath())
	}
	if !slices.Equal(netns, []string{"network=" + info.Netns}) {
		t.Errorf("namespaces %q, want the Trial's network namespace %s", netns, info.Netns)
	}
	env := map[string]string{}
	for _, kv := range adj.GetEnv() {
		env[kv.GetKey()] = kv.GetValue()
	}
	for _, kv := range trial.ProxyEnv(info.ProxyURL) {
		k, v, _ := strings.Cut(kv, "=")
		if env[k] != v {
			t.Errorf("env %s=%q, want %q", k, env[k], v)
		}
	}
	if !info.Transparent || len(adj.GetMounts()) != 1 || adj.GetMounts()[0].GetDestination() != "/etc/resolv.conf" ||
		!slices.Contains(adj.GetMounts()[0].GetOptions(), "ro") {
		t.Errorf("transparent %v, mounts %v: want the stub's resolv.conf, read-only", info.Transparent, adj.GetMounts())
	}
	hooks := adj.GetHooks().GetCreateRuntime()
	if len(hooks) != 1 || hooks[0].GetPath() != "/opt/trialnet/bin/trialnet-oci" || !slices.Equal(hooks[0].GetArgs()[:2], []string{"trialnet-oci", "oci-hook"}) {
		t.Errorf("createRuntime hooks %v", hooks)
	}
	if adj.GetAnnotations()[ocihook.AnnotationTrial] != info.ID {
		t.Errorf("annotations %v, want %s=%s", adj.GetAnnotations(), ocihook.AnnotationTrial, info.ID)
	}
}

// hookLetsIn places a process as a runtime would with the adjustment
// (its cgroup, its network namespace, new PID, cgroup and mount
// namespaces), writes the bundle's config, and runs the hook on it.
func hookLetsIn(t *testing.T, w *world, adj *api.ContainerAdjustment, info client.TrialInfo) {
	t.Helper()
	cg := filepath.Join(w.mount, adj.GetLinux().GetCgroupsPath())
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	privtest.RequireTool(t, "nsenter")
	pid := testenv.StartIn(t, cg, adj.GetLinux().GetNamespaces()[0].GetPath(), syscall.CLONE_NEWPID|syscall.CLONE_NEWCGROUP|syscall.CLONE_NEWNS|syscall.CLONE_NEWIPC)
	bundle := t.TempDir()
	ctr := testContainer("c1")
	var ns []map[string]string
	for _, n := range ctr.Linux.Namespaces {
		if n.Type != "network" {
			ns = append(ns, map[string]string{"type": n.Type, "path": n.Path})
		}
	}
	ns = append(ns, map[string]string{"type": "network", "path": info.Netns})
	if err := os.Mkdir(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := json.Marshal(map[string]any{
		"ociVersion": "1.0.2",
		"root":       map[string]any{"path": "rootfs"},
		"process":    map[string]any{"capabilities": map[string]any{"bounding": []string{"CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"}}},
		"mounts":     ctr.Mounts,
		"linux": map[string]any{"namespaces": ns, "seccomp": nritest.OCISeccomp(adj.GetLinux().GetSeccompPolicy()),
			// containerd's defaults for a container that is not privileged
			"readonlyPaths": []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
			"maskedPaths":   []string{"/proc/kcore", "/proc/keys", "/sys/firmware"}},
		"annotations": adj.GetAnnotations(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	st, _ := json.Marshal(ocihook.State{OCIVersion: "1.0.2", ID: "c1", Status: "creating", Pid: pid, Bundle: bundle, Annotations: adj.GetAnnotations()})
	h := &ocihook.Hook{Agent: func() ocihook.Agent { return agentwire.NewDirect(w.sock) }, Socket: w.sock}
	if _, err := h.Run(context.Background(), strings.NewReader(string(st))); err != nil {
		t.Fatalf("the hook refuses a container placed as the plugin's adjustment says: %v", err)
	}
}

// A plugin that restarts finds the runtime's pods: the Trial of a pod that
// went while it was away is destroyed, those of live pods are kept and
// serve their next containers, and a Trial not of the plugin's making is
// left alone.
func TestPrivilegedRestartSynchronizes(t *testing.T) {
	w := newNRIWorld(t)
	stay, gone := testPod("evals", "stay", "claude"), testPod("evals", "gone", "claude,pypi")
	w.rt.pods = []*api.PodSandbox{stay, gone}
	stop := w.rt.connect(w.plugin())
	for _, pod := range w.rt.pods {
		if _, err := w.rt.create(pod, testContainer("c-"+pod.Name)); err != nil {
			t.Fatal(err)
		}
	}
	mine, err := w.a.Create(context.Background(), trial.Request{ID: "by-hand"})
	if err != nil {
		t.Fatal(err)
	}
	stayInfo, _ := w.trial(TrialID(stay))

	stop()
	w.rt.pods = []*api.PodSandbox{stay} // "gone" was removed meanwhile
	p := w.plugin()
	w.rt.connect(p)
	// The sweep runs in the background: wait for its end (bounded, so
	// that a sweep that never ends fails rather than hangs the test).
	for i := 0; ; i++ {
		p.mu.Lock()
		pending := p.pending
		p.mu.Unlock()
		if !pending {
			break
		}
		if i == 10000 {
			t.Fatal("the sweep did not finish")
		}
		time.Sleep(time.Millisecond)
	}

	if _, ok := w.trial(TrialID(gone)); ok {
		t.Errorf("the Trial of a pod removed while the plugin was away is still there")
	}
	if info, ok := w.trial(TrialID(stay)); !ok || info.CgroupID != stayInfo.CgroupID {
		t.Errorf("the Trial of a live pod: live %v, cgroup id %d, was %d", ok, info.CgroupID, stayInfo.CgroupID)
	}
	if _, ok := w.trial(mine.ID); !ok {
		t.Errorf("a Trial made by hand was destroyed")
	}
	adj, err := w.rt.create(stay, testContainer("c-stay-2"))
	if err != nil || adj.GetAnnotations()[ocihook.AnnotationTrial] != TrialID(stay) {
		t.Errorf("the live pod's next container: %v, annotations %v", err, adj.GetAnnotations())
	}
}

// The plugin's part of a pod's container creation, through the NRI
// runtime side to a real agent: the first container of a pod makes its
// Trial; the next one finds it. The runtime bounds a plugin's call (2 s
// by default in containerd and CRI-O).
func BenchmarkPrivilegedCreateContainer(b *testing.B) {
	w := newNRIWorld(b)
	w.rt.connect(w.plugin())
	b.Run("first-makes-trial", func(b *testing.B) {
		for i := range b.N {
			pod := testPod("evals", fmt.Sprintf("bench-%d", i), "claude")
			if _, err := w.rt.create(pod, testContainer("c1")); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := w.rt.stopPod(pod); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("next-finds-trial", func(b *testing.B) {
		pod := testPod("evals", "bench-next", "claude")
		if _, err := w.rt.create(pod, testContainer("c0")); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = w.rt.stopPod(pod) })
		for i := range b.N {
			if _, err := w.rt.create(pod, testContainer(fmt.Sprintf("c%d", i+1))); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A rolling update's overlap: while two plugins are registered, an
// annotated pod's container is refused (both set its annotation and
// cgroups path, a conflict the runtime refuses), never created unplaced;
// once the old one is gone, the same container is placed in the Trial.
func TestPrivilegedTwoPluginsRefuseUntilOneGoes(t *testing.T) {
	w := newNRIWorld(t)
	stopOld := w.rt.connect(w.plugin())
	w.rt.connect(w.plugin())
	pod := testPod("evals", "rollout", "claude")
	_, err := w.rt.create(pod, testContainer("c1"))
	if err == nil || !strings.Contains(err.Error(), `plugins "50-trialnet" and "50-trialnet" both tried to set`) {
		t.Fatalf("with two plugins registered: %v; want refused as a conflict", err)
	}
	t.Logf("refused during the overlap: %v", err)
	stopOld()
	// The runtime may learn of the old one's departure from this request:
	// fail closed, it refuses it (the kubelet retries), and drops it.
	adj, err := w.rt.create(pod, testContainer("c1"))
	if err != nil {
		t.Logf("refused as the old plugin went: %v", err)
		adj, err = w.rt.create(pod, testContainer("c1"))
	}
	if err != nil || adj.GetAnnotations()[ocihook.AnnotationTrial] != TrialID(pod) {
		t.Fatalf("with one plugin left: %v, annotations %v", err, adj.GetAnnotations())
	}
}

// A pod made while the plugin was away has containers running unplaced,
// on the pod network, sharing the pod's IPC namespace and volumes with
// any later container of it. As the plugin reconnects, no later
// container of that pod (a restart, an ephemeral one) is put in a Trial
// beside them: each is refused, saying to recreate the pod. A pod whose
// containers the plugin placed goes on as before.
func TestPrivilegedSynchronizeRefusesPodRunningUnplaced(t *testing.T) {
	w := newNRIWorld(t)
	placed, unplaced := testPod("evals", "placed", "claude"), testPod("evals", "while-away", "claude")
	w.rt.pods = []*api.PodSandbox{placed}
	stop := w.rt.connect(w.plugin())
	adj, err := w.rt.create(placed, testContainer("c-placed"))
	if err != nil {
		t.Fatal(err)
	}
	stop()
	t.Cleanup(func() { _ = w.rt.stopPod(placed) })

	// As the runtime shows them at the next Synchronize: the placed one
	// with the adjustment applied, the other as the runtime made it.
	c1 := testContainer("c-placed")
	c1.PodSandboxId, c1.State = placed.Id, api.ContainerState_CONTAINER_RUNNING
	for _, n := range c1.Linux.Namespaces {
		if n.Type == "network" {
			n.Path = adj.GetLinux().GetNamespaces()[0].GetPath()
		}
	}
	c1.Linux.CgroupsPath = adj.GetLinux().GetCgroupsPath()
	c2 := testContainer("c-away")
	c2.PodSandboxId, c2.State = unplaced.Id, api.ContainerState_CONTAINER_RUNNING
	w.rt.pods, w.rt.ctrs = []*api.PodSandbox{placed, unplaced}, []*api.Container{c1, c2}
	w.rt.connect(w.plugin())

	if _, err := w.rt.create(placed, testContainer("c-placed-2")); err != nil {
		t.Fatalf("a placed pod's next container: %v", err)
	}
	for _, id := range []string{"c-away-restart", "c-debug"} {
		_, err := w.rt.create(unplaced, testContainer(id))
		if err == nil || !strings.Contains(err.Error(), "recreate the pod") {
			t.Fatalf("container %s of a pod running unplaced: %v; want refused", id, err)
		}
		t.Logf("refused: %v", err)
	}
	if _, ok := w.trial(TrialID(unplaced)); ok {
		t.Errorf("a Trial was made for the pod running unplaced")
	}
}
