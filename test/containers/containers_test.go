//go:build linux

// Package containers runs real container runtimes (podman with crun, and
// runc with a bundle) against a Trial: a container that joins it is
// confined and counted as the Trial, reaches an allowed host through the
// proxy, and trialnet oci-hook refuses a container that claims the Trial
// but would be outside it or could leave it; each refusal is shown to be
// the hook's by the same container starting without it. The runtimes
// need the unified cgroup hierarchy alone, so these tests run in the
// kernel matrix's guests (make vmtest); on a hybrid host only runc runs.
package containers

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/ocihook"
	"github.com/trialnet/trialnet/test/ctr"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

const (
	subnet   = 242
	greeting = "hello from the test host"
	// proxyURL and noProxy are what trialnet's launcher gives a Trial's
	// commands (sandbox.proxyEnv); docs/containers.md gives containers
	// the same.
	proxyURL = "http://127.0.0.1:3128"
	noProxy  = "127.0.0.1,localhost,::1"
	// started is what a container prints first: a container the hook
	// refused never prints it.
	started = "container-started"
	// profile is the agent's profile that allows the test host's web
	// server, for containers that have a Trial made around them.
	profile = "ctr"
)

// world is a Trial, a test host with an allowed web server, the agent
// serving its socket, trialnet's binary, the hook installed in a hooks
// directory of the test's own, and a busybox root file system.
type world struct {
	t       testing.TB
	host    *testhost.Host
	agent   *agent.Agent
	sock    string
	dir     string // the agent's: its data directory is dir/data
	bin     string
	hooks   string // hooks.d with trialnet's entry
	noHooks string // an empty hooks.d: the same runtime without the hook
	seccomp string // the seccomp profile oci-hook install wrote
	rootfs  string
	info    client.TrialInfo
	cgroup  string // the Trial's cgroup, relative to the cgroup2 mount
}

// requireRuntimes skips where the runtimes cannot run: crun (and so
// podman here) needs cgroup v2 alone on /sys/fs/cgroup (unified), which
// hybrid hosts lack; runc runs on both. The VM's guests set
// TRIALNET_REQUIRE_CONTAINERS=1, which makes a skip a failure.
func requireRuntimes(t testing.TB, unified bool, tools ...string) {
	t.Helper()
	privtest.Require(t)
	var st unix.Statfs_t
	err := unix.Statfs("/sys/fs/cgroup", &st)
	if unified && (err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC) {
		msg := "crun needs cgroup v2 alone on /sys/fs/cgroup, which this host does not have (make vmtest runs this test)"
		if os.Getenv("TRIALNET_REQUIRE_CONTAINERS") == "1" {
			t.Fatalf("TRIALNET_REQUIRE_CONTAINERS=1: %s", msg)
		}
		t.Skip(msg)
	}
	for _, tool := range append(tools, "busybox") {
		privtest.RequireTool(t, tool)
	}
}

func newContainerTrial(t testing.TB, id string) *world {
	t.Helper()
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
	file, err := config.ParseFile([]byte("profiles:\n  " + profile + ":\n    allow: [\"allowed.test:80\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	w.agent, w.dir, w.sock = testenv.ServedAgent(t, "containers", agent.AgentConfig{File: file,
		Resolvers: []string{dnsAddr}, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}})
	if w.info, err = w.agent.Create(context.Background(), trial.Request{ID: id, Allow: []string{"allowed.test:80"}}); err != nil {
		t.Fatal(err)
	}
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Fatal(err)
	}
	w.cgroup = strings.TrimPrefix(w.info.Cgroup, mount)
	w.bin = os.Getenv("TRIALNET_TEST_BIN") // the kernel matrix builds it on the host
	if w.bin == "" {
		w.bin = filepath.Join(t.TempDir(), "trialnet")
		testkit.BuildTrialnet(t, "../..", w.bin)
		testkit.BuildTrialnetOCI(t, "../..", w.bin) // what oci-hook install and oci-runtime install write
	}
	dir := t.TempDir()
	w.hooks, w.noHooks, w.rootfs = filepath.Join(dir, "hooks.d"), filepath.Join(dir, "empty.d"), filepath.Join(dir, "rootfs")
	if err := os.Mkdir(w.noHooks, 0o755); err != nil {
		t.Fatal(err)
	}
	w.seccomp = filepath.Join(dir, "seccomp.json")
	if out, err := exec.Command(w.bin, append([]string{"oci-hook", "install", "--hooks-dir", w.hooks, "--seccomp-profile", w.seccomp, "--socket", w.sock}, w.places()...)...).CombinedOutput(); err != nil {
		t.Fatalf("trialnet oci-hook install: %v\n%s", err, out)
	}
	w.makeRootfs()
	return w
}

// places are the agent's paths as oci-hook and oci-runtime take them:
// the test's agent keeps its Trials apart from the host's.
func (w *world) places() []string {
	return []string{"--cgroup-parent", filepath.Dir(w.info.Cgroup), "--netns-dir", filepath.Dir(w.info.Netns)}
}

// makeRootfs is a root file system of the host's static busybox.
func (w *world) makeRootfs() {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		w.t.Fatal(err)
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, d := range []string{"bin", "proc", "sys", "dev", "etc", "tmp", "ctl"} {
		if err := os.MkdirAll(filepath.Join(w.rootfs, d), 0o755); err != nil {
			w.t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(w.rootfs, "bin", "busybox"), b, 0o755); err != nil {
		w.t.Fatal(err)
	}
	for _, app := range []string{"sh", "nc", "wget", "sleep", "cat", "echo", "touch"} {
		if err := os.Symlink("busybox", filepath.Join(w.rootfs, "bin", app)); err != nil {
			w.t.Fatal(err)
		}
	}
}

// script is what a container in the Trial runs: a direct connection to
// the test host, then a request through the proxy to the allowed host.
func (w *world) script() string {
	return fmt.Sprintf("echo %s; nc -w 3 %s %d </dev/null; echo nc-exit=$?; wget -q -O - http://allowed.test/; echo wget-exit=$?",
		started, w.host.Addr4, testhost.Port)
}

func proxyEnv() []string {
	return []string{"HTTPS_PROXY=" + proxyURL, "HTTP_PROXY=" + proxyURL, "https_proxy=" + proxyURL, "http_proxy=" + proxyURL,
		"NO_PROXY=" + noProxy, "no_proxy=" + noProxy}
}

// checkConfined checks what a container in the Trial printed and what
// the Trial counted: the direct connection refused by the kernel (and
// nothing arriving), the proxy's answer from the allowed host, the
// container in the Trial's layers.
func (w *world) checkConfined(out string, containers int) {
	w.t.Helper()
	for _, want := range []string{started, "nc-exit=1", greeting, "wget-exit=0"} {
		if !strings.Contains(out, want) {
			w.t.Errorf("the container's output lacks %q:\n%s", want, out)
		}
	}
	if n := w.host.Arrivals(); n != 0 {
		w.t.Errorf("%d connections reached the test host's canary directly", n)
	}
	st, err := w.agent.Stats(context.Background(), w.info.ID)
	if err != nil {
		w.t.Fatal(err)
	}
	if st.Kernel["connect4_denied"] == 0 || st.Proxy.Allowed == 0 || st.Egress != 0 || st.Foreign != 0 {
		w.t.Errorf("the Trial's counters: connect4_denied %d, tunnels allowed %d, egress %d, foreign-socket uses %d; want the direct connection refused and counted, the proxy used, nothing else",
			st.Kernel["connect4_denied"], st.Proxy.Allowed, st.Egress, st.Foreign)
	}
	if st.Layers.Containers != containers || !strings.Contains(st.Layers.String(), client.ContainerLayers) {
		w.t.Errorf("the Trial's layers: %d containers (want %d): %s", st.Layers.Containers, containers, st.Layers)
	}
}

// podman runs podman with storage, state and hooks of the test's own.
type podman struct {
	w    *world
	base []string
}

func newPodman(w *world) *podman {
	// podman refuses a run root longer than 50 bytes: t.TempDir's are.
	dir, err := os.MkdirTemp("", "pm-")
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = os.RemoveAll(dir) })
	p := &podman{w: w, base: []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"),
		"--tmpdir", filepath.Join(dir, "tmp"), "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs",
		"--events-backend", "none", "--runtime", "crun", "--network-config-dir", filepath.Join(dir, "networks")}}
	var tb bytes.Buffer
	if err := tarDir(&tb, w.rootfs); err != nil {
		w.t.Fatal(err)
	}
	tarball := filepath.Join(dir, "rootfs.tar")
	if err := os.WriteFile(tarball, tb.Bytes(), 0o644); err != nil {
		w.t.Fatal(err)
	}
	if out, err := p.cmd(w.hooks, "import", tarball, "localhost/trialnet-test:latest").CombinedOutput(); err != nil {
		w.t.Fatalf("podman import: %v\n%s", err, out)
	}
	w.t.Cleanup(func() { _ = p.cmd(w.hooks, "rm", "--all", "--force").Run() })
	return p
}

func (p *podman) cmd(hooks string, args ...string) *exec.Cmd {
	return exec.Command("podman", append(append(append([]string{}, p.base...), "--hooks-dir", hooks), args...)...)
}

// trialFlags are docs/containers.md's flags that put a podman container
// in the Trial.
func (p *podman) trialFlags() []string {
	f := []string{"--annotation", "trialnet.io/trial=" + p.w.info.ID, "--cgroups", "no-conmon", "--security-opt", "seccomp=" + p.w.seccomp,
		"--cgroup-parent", p.w.cgroup, "--network", "ns:" + p.w.info.Netns}
	for _, e := range proxyEnv() {
		f = append(f, "--env", e)
	}
	return f
}

func (p *podman) run(hooks string, flags []string, script string) (string, error) {
	args := append(append([]string{"run", "--rm"}, flags...), "localhost/trialnet-test:latest", "sh", "-c", script)
	out, err := p.cmd(hooks, args...).CombinedOutput()
	return string(out), err
}

// tarDir writes dir as a tar archive, links as links.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || path == dir {
			return err
		}
		link := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, _ = filepath.Rel(dir, path)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// A podman container (crun) started with the documented flags is the
// Trial: its direct connection is refused and counted, the proxy takes
// it to the allowed host, and the Trial's layers say it has a container
// whose process boundary is the runtime's. Containers that claim the
// Trial but are outside it, privileged, or on the host's network are
// refused by the hook, and start without it.
func TestPrivilegedContainerPodman(t *testing.T) {
	requireRuntimes(t, true, "podman", "crun", "conmon")
	w := newContainerTrial(t, "ctr-podman")
	p := newPodman(w)
	out, err := p.run(w.hooks, p.trialFlags(), w.script())
	if err != nil {
		t.Fatalf("podman run in the Trial: %v\n%s", err, out)
	}
	w.checkConfined(out, 1)

	claim := []string{"--annotation", "trialnet.io/trial=" + w.info.ID, "--security-opt", "seccomp=" + w.seccomp}
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"outside its Trial", append(claim, "--network", "none")},
		{"privileged", append(p.trialFlags(), "--privileged")},
		{"host network", append(claim, "--cgroups", "no-conmon", "--cgroup-parent", w.cgroup, "--network", "host")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := p.run(w.hooks, tc.flags, "echo "+started)
			if err == nil || strings.Contains(out, started) {
				t.Errorf("with the hook: started (%v):\n%s", err, out)
			}
			// crun does not pass a hook's standard error on to podman;
			// the hook logs its reasons to syslog as well (not checked
			// here: the guest runs no syslog). The bundle test checks a
			// reason as runc shows it.
			if !strings.Contains(out, "error executing hook") {
				t.Errorf("the refusal is not the hook's:\n%s", out)
			}
			// The same container without the hook starts: the refusal
			// above is the hook's.
			if out, err := p.run(w.noHooks, tc.flags, "echo "+started); err != nil || !strings.Contains(out, started) {
				t.Errorf("without the hook the container did not start either (%v):\n%s", err, out)
			}
		})
	}
	if st, err := w.agent.Stats(context.Background(), w.info.ID); err != nil || st.Layers.Containers != 1 {
		t.Errorf("refused containers were recorded: %d containers, %v", st.Layers.Containers, err)
	}
	// A container that claims no Trial but joins a Trial container's PID
	// namespace: no check of the hook's would run on it, and the Trial's
	// processes could trace it.
	if out, err := p.cmd(w.hooks, append(append([]string{"run", "-d", "--name", "trial-sleeper"}, p.trialFlags()...), "localhost/trialnet-test:latest", "sleep", "600")...).CombinedOutput(); err != nil {
		t.Fatalf("podman run -d in the Trial: %v\n%s", err, out)
	}
	out, err = p.run(w.hooks, []string{"--pid", "container:trial-sleeper"}, "echo "+started)
	if err == nil || strings.Contains(out, started) || !strings.Contains(out, "error executing hook") {
		t.Errorf("unclaimed, in a Trial container's PID namespace: want refused by the hook (%v):\n%s", err, out)
	}
	if out, err := p.run(w.noHooks, []string{"--pid", "container:trial-sleeper"}, "echo "+started); err != nil || !strings.Contains(out, started) {
		// Where the BPF LSM layer is active, a task outside the Trial may
		// not open a Trial task's namespace (a ptrace access).
		t.Logf("unclaimed, without the hook: not started either (%v):\n%s", err, out)
	}
}

// A runc bundle that names the Trial's network namespace, a cgroup
// under the Trial's and trialnet oci-hook as its createRuntime hook is
// the Trial; the same bundle with another network namespace is refused,
// and starts without the hook.
func TestPrivilegedContainerRuncBundle(t *testing.T) {
	requireRuntimes(t, false, "runc")
	w := newContainerTrial(t, "ctr-runc")
	state := t.TempDir()
	run := func(name string, netns string, hook bool, script string) (string, error) {
		bundle := w.bundle(name, netns, hook, script)
		cmd := exec.Command("runc", "--root", state, "run", "--bundle", bundle, name)
		out, err := cmd.CombinedOutput()
		_ = exec.Command("runc", "--root", state, "delete", "--force", name).Run()
		return string(out), err
	}
	t.Cleanup(func() { ctr.RemoveV1Cgroups(w.cgroup) })
	out, err := run("runc-in", w.info.Netns, true, w.script())
	if err != nil {
		t.Fatalf("runc run in the Trial: %v\n%s", err, out)
	}
	t.Logf("runc in the Trial:\n%s", out)
	w.checkConfined(out, 1)
	out, err = run("runc-out", "", true, "echo "+started)
	if err == nil || strings.Contains(out, started) || !strings.Contains(out, "network namespace is not the Trial's") {
		t.Errorf("a bundle outside its Trial's network namespace: want refused, saying why (%v):\n%s", err, out)
	}
	if out, err := run("runc-out-nohook", "", false, "echo "+started); err != nil || !strings.Contains(out, started) {
		t.Errorf("without the hook the bundle did not start either (%v):\n%s", err, out)
	}
}

// bundle writes a runc bundle for the Trial: the busybox root, the
// proxy's environment, the annotation, a cgroup under the Trial's, the
// network namespace at netns ("": a new one) and, with hook, trialnet
// oci-hook at createRuntime.
func (w *world) bundle(name, netns string, hook bool, script string) string {
	o := bundleOpts{netns: netns, cgroupsPath: w.cgroup + "/" + name, script: script,
		annotations: map[string]string{"trialnet.io/trial": w.info.ID}}
	if hook {
		o.hooks = []string{"createRuntime"}
	}
	return w.bundleWith(name, o)
}

// bundleOpts say what a test bundle is: its network namespace ("": a
// new one), cgroup, annotations, the stages it runs trialnet oci-hook
// at, the script it runs, and host directories bound in (destination:
// source).
type bundleOpts struct {
	netns, cgroupsPath, script string
	annotations                map[string]string
	hooks                      []string
	binds                      map[string]string
	// noSeccomp leaves linux.seccomp out (runc's default), which the
	// hook refuses; otherwise it is seccomp, or the least profile that
	// keeps the key calls and AF_VSOCK from the container.
	noSeccomp bool
	seccomp   map[string]any
	// hookBin is the hook's binary: trialnet-oci beside trialnet, as
	// oci-hook install writes it, unless set (trialnet, as entries
	// written before it run).
	hookBin string
	// caps are added to its capabilities; devRules are its device
	// cgroup rules (linux.resources.devices); nsPaths are namespaces it
	// joins by path, by type.
	caps     []string
	devRules []map[string]any
	nsPaths  map[string]string
	// hookArgs are added to the hook's arguments.
	hookArgs []string
}

func (w *world) bundleWith(name string, o bundleOpts) string {
	dir := filepath.Join(w.t.TempDir(), name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		w.t.Fatal(err)
	}
	ns := []map[string]string{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"}, {"type": "network", "path": o.netns}}
	for _, n := range ns {
		if p, ok := o.nsPaths[n["type"]]; ok {
			n["path"] = p
		}
	}
	caps := append([]string{"CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_AUDIT_WRITE"}, o.caps...)
	cfg := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]int{"uid": 0, "gid": 0}, "cwd": "/", "args": []string{"sh", "-c", o.script},
			"env":             append([]string{"PATH=/bin"}, proxyEnv()...),
			"capabilities":    map[string][]string{"bounding": caps, "effective": caps, "permitted": caps},
			"noNewPrivileges": true,
		},
		"root":     map[string]any{"path": w.rootfs, "readonly": true},
		"hostname": name,
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
			{"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev"}},
		},
		"linux": map[string]any{
			"namespaces":    ns,
			"cgroupsPath":   o.cgroupsPath,
			"readonlyPaths": []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
			"maskedPaths":   []string{"/proc/kcore", "/proc/keys", "/sys/firmware"},
		},
		"annotations": o.annotations,
	}
	if o.netns == "" {
		ns[len(ns)-1] = map[string]string{"type": "network"}
	}
	if o.devRules != nil {
		cfg["linux"].(map[string]any)["resources"] = map[string]any{"devices": o.devRules}
	}
	switch {
	case o.seccomp != nil:
		cfg["linux"].(map[string]any)["seccomp"] = o.seccomp
	case !o.noSeccomp:
		cfg["linux"].(map[string]any)["seccomp"] = ocihook.ContainerProfile(runtime.GOARCH)
	}
	for dst, src := range o.binds {
		cfg["mounts"] = append(cfg["mounts"].([]map[string]any), map[string]any{"destination": dst, "type": "bind", "source": src, "options": []string{"rbind", "rw"}})
	}
	hooks := map[string]any{}
	if o.hookBin == "" {
		o.hookBin = filepath.Join(filepath.Dir(w.bin), "trialnet-oci")
	}
	for _, stage := range o.hooks {
		hooks[stage] = []map[string]any{{"path": o.hookBin, "args": append([]string{"trialnet", "oci-hook", "--socket", w.sock}, o.hookArgs...), "timeout": 30}}
	}
	cfg["hooks"] = hooks
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		w.t.Fatal(err)
	}
	return dir
}
