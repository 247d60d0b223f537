//go:build linux

package containers

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	testctr "github.com/trialnet/trialnet/test/ctr"

	"github.com/containerd/nri/pkg/api"
	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/nritest"
	"github.com/trialnet/trialnet/internal/ocicmd"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/nriplugin"
	"github.com/trialnet/trialnet/trial"
)

// A pod's container as runc runs it once trialnet nri has adjusted it:
// the bundle a runtime would write (its own network namespace, a cgroup
// of the pod's, the image's environment) with the plugin's adjustment
// applied field by field (cgroups path, network namespace, environment,
// resolv.conf, the hook and its annotation). It runs confined and
// counted as the pod's Trial, the hook having let it in; the Trial goes
// with the pod.
func TestPrivilegedContainerNRIPod(t *testing.T) {
	requireRuntimes(t, false, "runc")
	w := &world{t: t, host: testhost.NewT(t, subnet)}
	ln, err := w.host.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(w.host.Addr4, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, greeting) }),
		ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	dnsAddr, stop, err := testhost.ServeDNS(w.host.Addr4, "allowed.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	f, err := config.ParseFile([]byte("profiles:\n  web:\n    allow: [\"allowed.test:80\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	w.agent, _, w.sock = testenv.ServedAgent(t, "containers", agent.AgentConfig{File: f,
		Resolvers: []string{dnsAddr}, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}})
	w.bin = os.Getenv("TRIALNET_TEST_BIN")
	if w.bin == "" {
		w.bin = filepath.Join(t.TempDir(), "trialnet")
		testkit.BuildTrialnet(t, "../..", w.bin)
		testkit.BuildTrialnetOCI(t, "../..", w.bin)
	}
	w.rootfs = filepath.Join(t.TempDir(), "rootfs")
	w.makeRootfs()
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Fatal(err)
	}

	p := &nriplugin.Plugin{Agent: client.NewClient(w.sock), Socket: w.sock, CgroupMount: mount,
		HookPath: filepath.Join(filepath.Dir(w.bin), ocicmd.Name), ResolvConf: filepath.Join(t.TempDir(), "resolv.conf")}
	if err := os.WriteFile(p.ResolvConf, []byte(trial.ResolvConf), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := &api.PodSandbox{Id: "sb", Name: "task", Namespace: "evals", Uid: "u1",
		Annotations: map[string]string{nriplugin.AnnotationProfile: "web"}}
	podCgroup := strings.TrimPrefix(testenv.PlainCgroup(t, "nripod"), mount)
	ctr := &api.Container{Id: "nri-ctr", Name: "main", Env: []string{"PATH=/bin", "HTTPS_PROXY=http://corp:8080"},
		Mounts: []*api.Mount{{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"ro"}}},
		Linux: &api.LinuxContainer{CgroupsPath: podCgroup + "/nri-ctr", Namespaces: []*api.LinuxNamespace{
			{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "cgroup"}, {Type: "network", Path: "/var/run/netns/cni-x"}},
			// A pod that names no seccomp profile is Unconfined: the
			// runtime's bundle has none.
			SeccompProfile: &api.SecurityProfile{ProfileType: api.SecurityProfile_UNCONFINED}}}
	adj, _, err := p.CreateContainer(context.Background(), pod, ctr)
	if err != nil {
		t.Fatal(err)
	}
	w.info, err = w.agent.Get(context.Background(), nriplugin.TrialID(pod))
	if err != nil {
		t.Fatal(err)
	}
	w.cgroup = strings.TrimPrefix(w.info.Cgroup, mount)
	t.Cleanup(func() { testctr.RemoveV1Cgroups(w.cgroup) })

	state := t.TempDir()
	run := func(name, script string, ignore ...string) ([]byte, error) {
		bundle := w.bundleWith(name, bundleOpts{cgroupsPath: w.cgroup + "/" + name, script: script, noSeccomp: true,
			annotations: map[string]string{"trialnet.io/trial": w.info.ID}})
		applyAdjustment(t, bundle, ctr.Env, adj, ignore...)
		out, err := exec.Command("runc", "--root", state, "run", "--bundle", bundle, name).CombinedOutput()
		_ = exec.Command("runc", "--root", state, "delete", "--force", name).Run()
		return out, err
	}
	out, err := run("nri-ctr", "cat /etc/resolv.conf; echo HTTPS_PROXY=$HTTPS_PROXY; "+w.script())
	if err != nil {
		t.Fatalf("runc run with the plugin's adjustment: %v\n%s", err, out)
	}
	t.Logf("runc, adjusted by trialnet nri:\n%s", out)
	w.checkConfined(string(out), 1)
	if !strings.Contains(string(out), "nameserver 127.0.0.53") || !strings.Contains(string(out), "HTTPS_PROXY="+w.info.ProxyURL+"\n") {
		t.Errorf("the container's resolv.conf and proxy are not the Trial's:\n%s", out)
	}

	// A runtime older than NRI's namespace adjustment (containerd before
	// 2.2, CRI-O before 1.34) applies the rest: the hook refuses the
	// container, and without the hook it would have started.
	out, err = run("nri-old", "echo "+started, "namespaces")
	if err == nil || strings.Contains(string(out), started) || !strings.Contains(string(out), "network namespace is not the Trial's") {
		t.Errorf("a runtime that ignored the namespace adjustment: want refused by the hook (%v):\n%s", err, out)
	}
	if out, err := run("nri-old-nohook", "echo "+started, "namespaces", "hooks"); err != nil || !strings.Contains(string(out), started) {
		t.Errorf("without the hook it did not start either (%v):\n%s", err, out)
	}
	// One older than NRI's seccomp adjustment (or one whose validator
	// refuses it) runs the Unconfined container without a profile: the
	// hook refuses it, for the keyrings.
	out, err = run("nri-old-seccomp", "echo "+started, "seccomp")
	if err == nil || strings.Contains(string(out), started) || !strings.Contains(string(out), "lets it use the kernel's keyrings") {
		t.Errorf("a runtime that ignored the seccomp adjustment: want refused by the hook (%v):\n%s", err, out)
	}

	if err := p.StopPodSandbox(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if _, err := w.agent.Get(context.Background(), w.info.ID); err == nil {
		t.Error("the pod's Trial outlives the pod")
	}
}

// applyAdjustment gives a bundle's config.json the container's own
// environment env and applies an NRI adjustment to it as a runtime does:
// the cgroups path and the network namespace replaced,
// the environment's keys replaced or added, the mounts added (replacing
// one at the same destination), the hooks appended, the annotations set
// or removed, the seccomp policy replaced; except the parts named in
// ignore ("namespaces", "hooks", "seccomp"),
// as a runtime that does not know them.
func applyAdjustment(t *testing.T, bundle string, env []string, adj *api.ContainerAdjustment, ignore ...string) {
	t.Helper()
	path := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Process     map[string]any    `json:"process"`
		Mounts      []map[string]any  `json:"mounts"`
		Linux       map[string]any    `json:"linux"`
		Hooks       map[string][]any  `json:"hooks,omitempty"`
		Annotations map[string]string `json:"annotations"`
	}
	var all map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil || json.Unmarshal(b, &all) != nil {
		t.Fatal(err)
	}
	cfg.Linux["cgroupsPath"] = adj.GetLinux().GetCgroupsPath()
	if pol := adj.GetLinux().GetSeccompPolicy(); pol != nil && !slices.Contains(ignore, "seccomp") {
		cfg.Linux["seccomp"] = nritest.OCISeccomp(pol)
	}
	for _, n := range adj.GetLinux().GetNamespaces() {
		if slices.Contains(ignore, "namespaces") {
			break
		}
		nss := cfg.Linux["namespaces"].([]any)
		for i, x := range nss {
			if x.(map[string]any)["type"] == n.GetType() {
				nss[i] = map[string]any{"type": n.GetType(), "path": n.GetPath()}
			}
		}
	}
	for _, kv := range adj.GetEnv() {
		replaced := false
		for i, e := range env {
			if strings.HasPrefix(e, kv.GetKey()+"=") {
				env[i], replaced = kv.GetKey()+"="+kv.GetValue(), true
			}
		}
		if !replaced {
			env = append(env, kv.GetKey()+"="+kv.GetValue())
		}
	}
	cfg.Process["env"] = env
	for _, m := range adj.GetMounts() {
		cfg.Mounts = append(cfg.Mounts, map[string]any{"destination": m.GetDestination(), "type": m.GetType(), "source": m.GetSource(), "options": m.GetOptions()})
	}
	if cfg.Hooks == nil {
		cfg.Hooks = map[string][]any{}
	}
	for _, h := range adj.GetHooks().GetCreateRuntime() {
		if slices.Contains(ignore, "hooks") {
			break
		}
		cfg.Hooks["createRuntime"] = append(cfg.Hooks["createRuntime"], map[string]any{"path": h.GetPath(), "args": h.GetArgs(), "timeout": h.GetTimeout().GetValue()})
	}
	cfg.Annotations = map[string]string{}
	for k, v := range adj.GetAnnotations() {
		if !strings.HasPrefix(k, "-") {
			cfg.Annotations[k] = v
		}
	}
	all["process"], all["mounts"], all["linux"], all["hooks"], all["annotations"] = cfg.Process, cfg.Mounts, cfg.Linux, cfg.Hooks, cfg.Annotations
	if b, err = json.Marshal(all); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
