//go:build linux

package nriplugin

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/trial"
)

// deadAgent is a control socket that answers no call: each connection is
// counted and closed at once (an agent that is not trialnet's, or gone).
func deadAgent(t *testing.T) (sock string, calls *atomic.Int64) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	calls = &atomic.Int64{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			calls.Add(1)
			c.Close()
		}
	}()
	return sock, calls
}

// With no agent answering, an annotated pod's containers are refused,
// saying why; unannotated pods and exempt namespaces' unannotated pods
// pass untouched, an exempt namespace's annotated one is refused, each
// without a connection to the agent (the agent's own pod never waits on
// it: cilium/tetragon#2402).
func TestAgentUnreachableFailsClosed(t *testing.T) {
	sock, calls := deadAgent(t)
	r := newRuntime(t)
	p := &Plugin{Agent: client.NewClient(sock), Socket: sock, HookPath: "/opt/trialnet/bin/trialnet-oci"}
	r.connect(p)
	// The sweep after synchronizing asks the agent (in the background);
	// it fails, and waits for an annotated pod's container to try again.
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	p.mu.Lock() // the sweep holds it to its end
	pending, after := p.pending, calls.Load()
	p.mu.Unlock()
	if !pending {
		t.Fatalf("the sweep passed with no agent answering")
	}

	for _, pod := range []struct{ ns, name, profile string }{
		{"default", "web", ""},
		{"trialnet", "trialnet-agent-x1", ""},
	} {
		adj, err := r.create(testPod(pod.ns, pod.name, pod.profile), testContainer("c-"+pod.name))
		if err != nil || adj.GetLinux().GetCgroupsPath() != "" || len(adj.GetEnv()) > 0 || len(adj.GetHooks().GetCreateRuntime()) > 0 {
			t.Errorf("pod %s/%s (profile %q): adjusted %v, error %v; want untouched", pod.ns, pod.name, pod.profile, adj, err)
		}
	}
	// An exempt namespace's pod that asks for a Trial is refused, not run
	// unconfined, and without a word to the agent either.
	_, err := r.create(testPod("kube-system", "annotated", "claude"), testContainer("c-annotated"))
	if err == nil || !strings.Contains(err.Error(), "exempt") {
		t.Errorf("an annotated pod in exempt namespace kube-system: %v; want refused", err)
	}
	if err := r.stopPod(testPod("default", "web", "")); err != nil {
		t.Errorf("stopping an unannotated pod: %v", err)
	}
	if calls.Load() != after {
		t.Fatalf("unannotated or exempt pods made %d calls to the agent", calls.Load()-after)
	}

	_, err = r.create(testPod("evals", "task-1", "claude"), testContainer("c1"))
	if err == nil || !strings.Contains(err.Error(), "trialnet refused container main-c1 of pod evals/task-1") ||
		!strings.Contains(err.Error(), "cannot ask trialnet's agent for its Trial") {
		t.Fatalf("an annotated pod's container with no agent answering: %v; want refused, saying why", err)
	}
	t.Logf("refused: %v", err)
}

// A pod that names trialnet as a required plugin is refused by the
// runtime's default validator while the plugin is not connected (its
// container would otherwise run unplaced, on the pod network), and
// created once it is.
func TestRequiredPluginAbsentRefuses(t *testing.T) {
	r := newRuntime(t, withValidator())
	pod := testPod("default", "web", "")
	pod.Annotations["required-plugins.noderesource.dev"] = `["` + Name + `"]`
	_, err := r.create(pod, testContainer("c1"))
	if err == nil || !strings.Contains(err.Error(), `required plugin "trialnet" not present`) {
		t.Fatalf("with the plugin absent: %v; want refused by the validator", err)
	}
	sock, _ := deadAgent(t)
	r.connect(&Plugin{Agent: client.NewClient(sock), HookPath: "/opt/trialnet/bin/trialnet-oci"})
	if _, err := r.create(pod, testContainer("c2")); err != nil {
		t.Fatalf("with the plugin connected: %v", err)
	}
}

// The adjustment leaves the hook one claim to read: the Trial's id,
// whatever trialnet.io/ annotations a pass-through copied to the
// container from the pod.
func TestAdjustmentLeavesOneClaim(t *testing.T) {
	p := &Plugin{HookPath: "/opt/trialnet/bin/trialnet-oci", CgroupMount: "/sys/fs/cgroup"}
	ctr := testContainer("c1")
	ctr.Annotations[AnnotationProfile] = "claude"
	ctr.Annotations["trialnet.io/trial"] = "someone-elses"
	info := client.TrialInfo{Netns: "/run/trialnet/netns/k8s-x", Cgroup: "/sys/fs/cgroup/trialnet/k8s-x", ProxyURL: "http://127.0.0.1:3128"}
	info.ID = "k8s-x"
	adj, err := p.adjust(ctr, info)
	if err != nil {
		t.Fatal(err)
	}
	removed, set := []string{}, adj.GetAnnotations()
	for k := range set {
		if after, ok := strings.CutPrefix(k, "-"); ok { // NRI's mark for a removal
			removed = append(removed, after)
		}
	}
	if set["trialnet.io/trial"] != "k8s-x" || len(removed) != 1 || removed[0] != AnnotationProfile {
		t.Errorf("annotations %v: want trialnet.io/trial=k8s-x and %s removed", set, AnnotationProfile)
	}
	if got := adj.GetLinux().GetCgroupsPath(); got != "/trialnet/k8s-x/ctr-c1" {
		t.Errorf("cgroups path %q", got)
	}
}

// Install puts this binary where the runtime runs the hook and the
// stub's resolv.conf where it binds it, replacing whatever was there.
func TestInstall(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "trialnet")
	if err := os.WriteFile(bin, []byte("\x7fELF the trialnet binary"), 0o700); err != nil {
		t.Fatal(err)
	}
	p := &Plugin{HookPath: filepath.Join(dir, "bin", "trialnet"), HookBinary: bin, ResolvConf: filepath.Join(dir, "resolv.conf")}
	if err := os.WriteFile(p.ResolvConf, []byte("nameserver 10.0.0.10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.Install(); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	hook, err := os.ReadFile(p.HookPath)
	if fi, _ := os.Stat(p.HookPath); err != nil || !bytes.Equal(hook, want) || fi.Mode().Perm() != 0o755 {
		t.Errorf("the hook at %s is not %s, executable: %v", p.HookPath, bin, err)
	}
	if b, err := os.ReadFile(p.ResolvConf); err != nil || string(b) != trial.ResolvConf {
		t.Errorf("resolv.conf %q, %v", b, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*", ".*")); len(left) > 0 {
		t.Errorf("temporary files left: %q", left)
	}
}

// The hook installed is the trialnet binary, never the plugin's own (the
// runtime would run it as trialnet oci-hook and refuse every placed
// container) nor nothing: each refused with what to give instead, and
// the hook path left as it was.
func TestInstallRefusesNoHookBinary(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, c := range []struct{ name, bin, want string }{
		{"none given", "", "no trialnet-oci binary given"},
		{"missing", filepath.Join(dir, "trialnet"), "installed beside trialnet-nri, or named by --hook-binary"},
		{"a directory", dir, "not a regular file"},
		{"the plugin itself", self, "is the plugin itself, not the hook"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &Plugin{HookPath: filepath.Join(dir, "bin", "trialnet"), HookBinary: c.bin}
			err := p.Install()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
			if _, err := os.Stat(p.HookPath); !os.IsNotExist(err) {
				t.Errorf("hook path written: %v", err)
			}
		})
	}
}

// A node whose runtime has no NRI socket: the plugin says so and what
// to check.
func TestRunWithoutNRI(t *testing.T) {
	p := &Plugin{HookPath: "/opt/trialnet/bin/trialnet-oci"}
	err := p.Run(context.Background(), filepath.Join(t.TempDir(), "nri.sock"), DefaultIndex)
	if err == nil || !strings.Contains(err.Error(), "is NRI enabled in containerd or CRI-O?") {
		t.Fatalf("got %v", err)
	}
}

// slowAgent is a control socket that accepts and never answers (an agent
// stuck or overloaded): each call waits out its deadline.
func slowAgent(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return sock
}

// An agent slower than the runtime's request timeout: the runtime gives
// up on the plugin, and an annotated pod's container must be refused,
// not created as if the plugin were not there (unplaced, on the pod
// network); nor is the plugin dropped, which would pass every later one.
func TestSlowAgentFailsClosed(t *testing.T) {
	nri.SetPluginRequestTimeout(300 * time.Millisecond)
	t.Cleanup(func() { nri.SetPluginRequestTimeout(api.DefaultPluginRequestTimeout) })
	sock := slowAgent(t)
	r := newRuntime(t)
	r.connect(&Plugin{Agent: client.NewClient(sock), Socket: sock, HookPath: "/opt/trialnet/bin/trialnet-oci"})
	for i, name := range []string{"task-1", "task-2"} {
		adj, err := r.create(testPod("evals", name, "claude"), testContainer(fmt.Sprintf("c%d", i)))
		if err == nil {
			t.Fatalf("pod evals/%s's container with the agent not answering in time: created, adjusted %v; want refused", name, adj)
		}
		t.Logf("refused: %v", err)
	}
}
