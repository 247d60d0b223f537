//go:build linux

package containers

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/ociruntime"
	"github.com/trialnet/trialnet/test/ctr"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

const dockerImage = "localhost/trialnet-test:latest"

// dockerd is a Docker daemon of the test's own (data, state, socket and
// containerd under one directory; no iptables, no bridge), whose
// daemon.json has the trialnet runtime merged in by trialnet
// oci-runtime install.
type dockerd struct {
	w      *world
	dir    string
	parent string // the cgroup of containers outside a Trial
}

func startDockerd(w *world) *dockerd {
	t := w.t
	// Short: the daemon's and containerd's unix sockets live under it.
	dir, err := os.MkdirTemp("", "dk-")
	if err != nil {
		t.Fatal(err)
	}
	d := &dockerd{w: w, dir: dir}
	t.Cleanup(func() { removeMounted(t, dir) })
	// An existing daemon.json, as a host has one: install keeps its keys.
	// They keep this daemon off the host's paths: its trust key (else
	// /etc/docker/key.json, read-only in the kernel matrix's guests) and
	// the cgroup parent of containers outside a Trial (else /docker).
	// Not spelt "trialnet-...": the wrapper refuses such a parent as a
	// near-miss of a Trial's claim (ociruntime's nearSlice).
	d.parent = "tn-docker-test-" + filepath.Base(dir)
	t.Cleanup(func() { removeTopCgroup(t, d.parent) })
	conf := filepath.Join(dir, "daemon.json")
	pre, _ := json.Marshal(map[string]string{"storage-driver": "vfs", "log-level": "warn",
		"deprecated-key-path": filepath.Join(dir, "key.json"), "cgroup-parent": "/" + d.parent})
	if err := os.WriteFile(conf, pre, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(w.bin, append([]string{"oci-runtime", "install", "--daemon-json", conf, "--socket", w.sock}, w.places()...)...).CombinedOutput(); err != nil {
		t.Fatalf("trialnet oci-runtime install: %v\n%s", err, out)
	}
	logf, err := os.Create(filepath.Join(dir, "dockerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("dockerd", "--config-file", conf, "--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "x"),
		"--pidfile", filepath.Join(dir, "pid"), "-H", "unix://"+filepath.Join(dir, "sock"), "--iptables=false", "--bridge=none",
		"--exec-opt", "native.cgroupdriver=cgroupfs", "--containerd-namespace", "trialnet-test", "--containerd-plugins-namespace", "trialnet-test-p")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.stop(cmd) })
	for i := 0; ; i++ { // bounded: 60 s of 100 ms waits
		if err := d.cmd("version").Run(); err == nil {
			break
		}
		if i == 600 {
			t.Fatalf("dockerd did not answer in 60 s:\n%s", d.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	var tb bytes.Buffer
	if err := tarDir(&tb, w.rootfs); err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(dir, "rootfs.tar")
	if err := os.WriteFile(tarball, tb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := d.cmd("import", tarball, dockerImage).CombinedOutput(); err != nil {
		t.Fatalf("docker import: %v\n%s", err, out)
	}
	return d
}

func (d *dockerd) log() string {
	b, _ := os.ReadFile(filepath.Join(d.dir, "dockerd.log"))
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// stop removes the containers and stops the daemon by its PID, which
// stops the containerd it started.
func (d *dockerd) stop(cmd *exec.Cmd) {
	if out, err := d.cmd("ps", "-aq").Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
		_ = d.cmd(append([]string{"rm", "-f"}, strings.Fields(string(out))...)...).Run()
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	if d.w.t.Failed() {
		d.w.t.Logf("dockerd's log:\n%s", d.log())
	}
}

// removeMounted unmounts what is left mounted under dir, deepest first,
// and removes it.
func removeMounted(t testing.TB, dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err == nil {
		var mounts []string
		for line := range strings.Lines(string(b)) {
			if f := strings.Fields(line); len(f) > 4 {
				if p := cgroup2.UnescapeMountPath(f[4]); strings.HasPrefix(p, dir+"/") {
					mounts = append(mounts, p)
				}
			}
		}
		slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
		for _, m := range mounts {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Error(err)
	}
}

func (d *dockerd) cmd(args ...string) *exec.Cmd {
	c := exec.Command("docker", args...)
	c.Env = append(os.Environ(), "DOCKER_HOST=unix://"+filepath.Join(d.dir, "sock"))
	return c
}

// run is docker run --rm FLAGS IMAGE ARGS; its standard output and
// error together.
func (d *dockerd) run(flags []string, args ...string) (string, error) {
	out, err := d.cmd(append(append(append([]string{"run", "--rm"}, flags...), dockerImage), args...)...).CombinedOutput()
	return string(out), err
}

// trialFlags are docs/containers.md's flags for a Docker container in
// Trial id. A hybrid host's Docker (cgroup v1) shares the host's cgroup
// namespace unless told, which the hook refuses.
func trialFlags(id string) []string {
	f := []string{"--runtime", ociruntime.DefaultName, "--cgroup-parent", ociruntime.SlicePrefix + id + ociruntime.SliceSuffix, "--network", "none"}
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		f = append(f, "--cgroupns", "private")
	}
	return f
}

// removeTopCgroup removes a cgroup runc made at the top of each
// hierarchy: a daemon's cgroup parent, or a Trial's slice name given to
// plain runc, which takes it as a path of its own.
func removeTopCgroup(t testing.TB, name string) {
	ctr.RemoveV1Cgroups(name)
	if mount, err := cgroup2.Mount(); err == nil {
		_ = unix.Rmdir(filepath.Join(mount, name))
	}
}

func requireDocker(t *testing.T) {
	t.Helper()
	requireRuntimes(t, false, "dockerd", "docker", "containerd", "containerd-shim-runc-v2", "runc")
}

// A Docker container run with --runtime trialnet and the Trial's
// cgroup parent is the Trial: the wrapper gives it the Trial's network
// namespace, a cgroup under the Trial's and the proxy's variables, its
// direct connection is refused and counted, the proxy takes it to the
// allowed host. A privileged container, one on the host's network and
// one in another container's network claiming the Trial are refused by
// the hook the wrapper put in their bundles, with the reason, and the
// same containers start under plain runc.
func TestPrivilegedContainerDocker(t *testing.T) {
	requireDocker(t)
	w := newContainerTrial(t, "ctr-docker")
	t.Cleanup(func() {
		ctr.RemoveV1Cgroups(w.cgroup)
		removeTopCgroup(t, ociruntime.SlicePrefix+w.info.ID+ociruntime.SliceSuffix)
	})
	d := startDockerd(w)
	flags := trialFlags(w.info.ID)
	out, err := d.run(flags, "sh", "-c", w.script())
	if err != nil {
		t.Fatalf("docker run in the Trial: %v\n%s", err, out)
	}
	t.Logf("docker run in the Trial:\n%s", out)
	w.checkConfined(out, 1)

	// A container outside any Trial whose network another one joins.
	if out, err := d.cmd("run", "-d", "--name", "outside", "--network", "none", dockerImage, "sleep", "600").CombinedOutput(); err != nil {
		t.Fatalf("docker run outside: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name, reason string
		flags        []string
	}{
		{"privileged", "capabilities that let it leave its Trial", append(slices.Clone(flags), "--privileged")},
		{"host network", "its network namespace is not the Trial's: it is the host's (host networking)", replaceNetwork(flags, "host")},
		{"outside its Trial", "its network namespace is not the Trial's", replaceNetwork(flags, "container:outside")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := w.ptraceDenied()
			out, err := d.run(tc.flags, "echo", started)
			switch {
			case err == nil || strings.Contains(out, started):
				t.Errorf("with the wrapper: want refused saying %q (%v):\n%s", tc.reason, err, out)
			case strings.Contains(out, tc.reason):
			case tc.name == "outside its Trial" && w.ptraceDenied() > before:
				// Where the BPF LSM layer is active, runc's init, already
				// in the Trial's cgroup, may not open the other
				// container's namespace (a ptrace access): refused and
				// counted before the hook runs.
				t.Logf("refused by the BPF LSM layer before the hook (ptrace_denied +%d):\n%s", w.ptraceDenied()-before, out)
			default:
				t.Errorf("with the wrapper: refused, but not saying %q:\n%s", tc.reason, out)
			}
			if tc.name == "privileged" && !fullBoundingSet(t) {
				t.Log("this root lacks capabilities (its bounding set is not full): no privileged container starts here, with or without the wrapper")
				return
			}
			plain := slices.Clone(tc.flags)
			plain[slices.Index(plain, "--runtime")+1] = "runc"
			if out, err := d.run(plain, "echo", started); err != nil || !strings.Contains(out, started) {
				t.Errorf("under plain runc the container did not start either (%v):\n%s", err, out)
			}
		})
	}
	if st, err := w.agent.Stats(context.Background(), w.info.ID); err != nil || st.Layers.Containers != 1 {
		t.Errorf("refused containers were recorded: %d containers, %v", st.Layers.Containers, err)
	}
	t.Run("unclaimed, in a Trial container's PID namespace", func(t *testing.T) {
		if out, err := d.cmd(append(append([]string{"run", "-d", "--name", "trial-sleeper"}, flags...), dockerImage, "sleep", "600")...).CombinedOutput(); err != nil {
			t.Fatalf("docker run -d in the Trial: %v\n%s", err, out)
		}
		unclaimed := []string{"--runtime", ociruntime.DefaultName, "--pid", "container:trial-sleeper", "--network", "none"}
		out, err := d.run(unclaimed, "echo", started)
		if err == nil || strings.Contains(out, started) || !strings.Contains(out, "it claims no Trial but joins the pid namespace of process") {
			t.Errorf("with the wrapper: want refused, saying why (%v):\n%s", err, out)
		}
		unclaimed[1] = "runc"
		if out, err := d.run(unclaimed, "echo", started); err != nil || !strings.Contains(out, started) {
			t.Logf("under plain runc: not started either (the BPF LSM layer, where active) (%v):\n%s", err, out)
		}
	})
	t.Run("a Docker network", func(t *testing.T) { dockerNetworkStaysOut(t, d, flags) })
	// The wrapper's own refusal reaches docker run through runc's log.
	if out, err := d.run(trialFlags("no-such-trial"), "echo", started); err == nil || strings.Contains(out, started) ||
		!strings.Contains(out, `trialnet oci-runtime: container `) || !strings.Contains(out, `cannot look Trial "no-such-trial" up`) {
		t.Errorf("a container naming no live Trial: want refused by the wrapper, saying why (%v):\n%s", err, out)
	}
}

// A cgroup parent that reads as a Trial's but is not exactly one (a
// directory below the Trial's slice, a slice in another case) is
// refused by the wrapper, saying why: passed on as unclaimed, the
// container ran on its Docker network, with an address of its own,
// outside every Trial, while its author believed it confined.
func TestPrivilegedContainerDockerNearClaim(t *testing.T) {
	requireDocker(t)
	w := newContainerTrial(t, "ctr-near")
	d := startDockerd(w)
	if out, err := d.cmd("network", "create", "--subnet", "10.231.3.0/24", "tnnear").CombinedOutput(); err != nil {
		t.Fatalf("docker network create: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = d.cmd("network", "rm", "tnnear").Run() })
	slice := ociruntime.SlicePrefix + w.info.ID + ociruntime.SliceSuffix
	for _, parent := range []string{slice + "/agents", "Trialnet-" + w.info.ID + ociruntime.SliceSuffix} {
		t.Run(parent, func(t *testing.T) {
			t.Cleanup(func() {
				removeTopCgroup(t, parent)
				removeTopCgroup(t, strings.Split(parent, "/")[0])
			})
			flags := replaceNetwork(trialFlags(w.info.ID), "tnnear")
			flags[slices.Index(flags, "--cgroup-parent")+1] = parent
			out, err := d.run(flags, "cat", "/proc/net/dev")
			if err == nil || strings.Contains(out, "eth0") || !strings.Contains(out, "looks like a Trial's cgroup parent but is not one") {
				t.Errorf("want refused by the wrapper, saying why (%v):\n%s", err, out)
			}
		})
	}
}

// A container in a Trial run on a Docker network, and connected to a
// second one while it runs, has only the Trial namespace's loopback
// (and a process docker exec starts in it, the Trial's proxy):
// the wrapper took Docker's network setup hook out, so Docker's network
// controller never reaches the Trial's namespace (its records say
// otherwise; --network none keeps them true).
func dockerNetworkStaysOut(t *testing.T, d *dockerd, flags []string) {
	for i, subnet := range []string{"10.231.1.0/24", "10.231.2.0/24"} {
		name := "tn" + strconv.Itoa(i)
		if out, err := d.cmd("network", "create", "--subnet", subnet, name).CombinedOutput(); err != nil {
			t.Fatalf("docker network create: %v\n%s", err, out)
		}
		t.Cleanup(func() { _ = d.cmd("network", "rm", name).Run() })
	}
	// An operator's proxy, which the wrapper replaces with the Trial's.
	out, err := d.cmd(append(append([]string{"run", "-d", "--name", "on-a-network", "-e", "HTTPS_PROXY=http://ops:secret@proxy.corp.test:3128"},
		replaceNetwork(flags, "tn0")...), dockerImage, "sleep", "600")...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker run on a network: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = d.cmd("rm", "-f", "on-a-network").Run() })
	if out, err := d.cmd("network", "connect", "tn1", "on-a-network").CombinedOutput(); err != nil {
		t.Logf("docker network connect refused (%v): %s", err, out)
	}
	out, err = d.cmd("exec", "on-a-network", "cat", "/proc/net/dev").CombinedOutput()
	var ifaces []string
	for line := range strings.Lines(string(out)) {
		if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(name, "|") {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	if err != nil || !slices.Equal(ifaces, []string{"lo"}) {
		t.Errorf("the container's interfaces: %q (%v), want only lo:\n%s", ifaces, err, out)
	}
	// Docker gives an exec the environment it keeps for the container:
	// the wrapper gives it the Trial's proxy, as it gave the container.
	out, err = d.cmd("exec", "on-a-network", "sh", "-c", "echo proxy=$HTTPS_PROXY").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "proxy="+proxyURL {
		t.Errorf("docker exec's HTTPS_PROXY (%v): %s, want the Trial's, %s", err, out, proxyURL)
	}
	// runc runs no hook for an exec: the wrapper refuses one that would
	// give a process in the Trial what the hook refused at its start.
	out, err = d.cmd("exec", "--privileged", "on-a-network", "true").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "capabilities that let it leave its Trial") {
		t.Errorf("docker exec --privileged into a Trial's container: want refused by the wrapper, saying why (%v):\n%s", err, out)
	}
}

// fullBoundingSet: this process may hold every capability, as a
// privileged container asks.
func fullBoundingSet(t *testing.T) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	last, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(last)))
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			set, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return set == 1<<(n+1)-1
		}
	}
	return false
}

// ptraceDenied is the Trial's count of ptrace accesses the BPF LSM
// layer refused.
func (w *world) ptraceDenied() uint64 {
	st, err := w.agent.Stats(context.Background(), w.info.ID)
	if err != nil {
		w.t.Fatal(err)
	}
	return st.Kernel["ptrace_denied"]
}

func replaceNetwork(flags []string, network string) []string {
	f := slices.Clone(flags)
	f[slices.Index(f, "--network")+1] = network
	return f
}

// escapeResult is one line of escapee's output.
type escapeResult struct{ Name, Result, Reason string }

// The network escape suite (test/escape's escapee, as nobody) inside a
// Docker container in a strict Trial, beside the same suite in a
// process Trial of the same agent: nothing gets out of either, at the
// sender or at the test host's canaries; each attempt ends the same way
// in both; each Trial's kernel counted every attempt that reached its
// hooks, and its proxy refused the denied name.
func TestPrivilegedContainerDockerEscape(t *testing.T) {
	requireDocker(t)
	w := newContainerTrial(t, "ctr-docker-esc-world")
	t.Cleanup(func() { ctr.RemoveV1Cgroups(w.cgroup) })
	esc := escapeeBin(t)
	b, err := os.ReadFile(esc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.rootfs, "bin", "escapee"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	canaries := w.host.ListenCanaries(t)
	d := startDockerd(w)
	run := func(id string, inContainer bool) (map[string]escapeResult, client.Stats) {
		info, err := w.agent.Create(context.Background(), trial.Request{ID: id, Strict: true, Allow: []string{"allowed.example.test:443"}})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := agent.Attach(info)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := tr.Netns.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var loopHits atomic.Int64
		go testhost.CountAccepts(ln, &loopHits)
		port := testkit.FreePort(t)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var inbound int
		wg.Go(func() { inbound = knock(w.host, netip.AddrPortFrom(w.host.Local4, port), stop) })
		args := []string{"-v4", w.host.Addr4.String(), "-v6", w.host.Addr6.String(), "-port", strconv.Itoa(testhost.Port),
			"-dns-port", strconv.Itoa(testhost.DNSPort), "-inbound-port", strconv.Itoa(int(port)),
			"-loopback-port", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), "-proxy", agent.ProxyEndpoints[0].String()}
		var cmd *exec.Cmd
		if inContainer {
			cmd = d.cmd(append(append(append([]string{"run", "--rm", "--user", "65534:65534"}, trialFlags(id)...), dockerImage, "/bin/escapee"), args...)...)
		} else {
			cmd = exec.Command(w.bin, append([]string{"exec", "--socket", w.sock, "--trial", id, "--uid", "65534", "--gid", "65534", "--", esc}, args...)...)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("escapee in %s: %v\n%s", id, err, stderr.String())
		}
		res := parseEscapee(t, &stdout)
		if loopHits.Load() != 0 || inbound != 0 {
			t.Errorf("%s: the Trial's other loopback port was reached %d times, its listener from the test host %d", id, loopHits.Load(), inbound)
		}
		st, err := w.agent.Stats(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return res, st
	}
	inDocker, dst := run("ctr-docker-esc", true)
	inProc, pst := run("ctr-docker-esc-proc", false)
	time.Sleep(200 * time.Millisecond) // let stray packets land before counting
	if n := canaries.Arrivals(); n != 0 {
		t.Errorf("the canaries saw %d arrivals (tcp/udp %d, dns %d, icmp %d)", n, w.host.Arrivals(), canaries.DNS.Load(), canaries.ICMP.Load())
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range inProc {
			if !yield(n) {
				return
			}
		}
	})
	if len(names) < 25 || len(inDocker) != len(inProc) {
		t.Fatalf("escapee reported %d attempts in the container, %d in the process Trial; want the same 25 or more", len(inDocker), len(inProc))
	}
	blocked := 0
	for _, n := range names {
		c, p := inDocker[n], inProc[n]
		t.Logf("%-30s docker %-8s process %-8s | %s | %s", n, c.Result, p.Result, c.Reason, p.Reason)
		switch {
		case c.Result == "escaped" || p.Result == "escaped":
			t.Errorf("ESCAPE: %s: docker %+v, process %+v", n, c, p)
		case c.Result != p.Result && !slices.Contains(mayDiffer, n):
			t.Errorf("%s: %s in the container, %s in the process Trial", n, c.Result, p.Result)
		}
		if c.Result == "blocked" && networkAttempt[n] && !strings.HasPrefix(c.Reason, "socket: ") {
			blocked++
		}
	}
	// The same refusals counted by the same hooks: the connect and
	// sendmsg counters agree, but for io_uring's connect and a datagram
	// with an IPv6 routing header, which only the container could try
	// (the process Trial's seccomp filter refuses io_uring and the header's
	// setsockopt; Docker's profile leaves both to the hooks). sock_create
	// differs as well: the process Trial's filter refuses raw and packet
	// sockets before the hook, Docker's profile leaves them to it.
	for _, k := range []string{"connect4_denied", "connect6_denied", "sendmsg4_denied", "sendmsg6_denied", "egress_other_packets"} {
		want := pst.Kernel[k]
		if k == "connect4_denied" && inDocker["io_uring-connect"].Result == "blocked" && inProc["io_uring-connect"].Result == "skipped" {
			want++
		}
		if c, p := inDocker["udp6-routing-header"], inProc["udp6-routing-header"]; k == "sendmsg6_denied" && c.Result == "blocked" &&
			!strings.HasPrefix(c.Reason, "setsockopt: ") && strings.HasPrefix(p.Reason, "setsockopt: ") {
			want++
		}
		if dst.Kernel[k] != want {
			t.Errorf("%s: %d in the container's Trial, want %d (the process Trial's %d)", k, dst.Kernel[k], want, pst.Kernel[k])
		}
	}
	var denied uint64 // what the network hooks refused, as test/escape sums it
	for _, k := range []string{"connect4_denied", "connect6_denied", "sendmsg4_denied", "sendmsg6_denied", "sock_create_denied", "bind_denied", "egress_other_packets"} {
		denied += dst.Kernel[k]
	}
	if denied < uint64(blocked) || dst.Egress != 0 {
		t.Errorf("the container's Trial counted %d refusals for %d blocked network attempts (egress %d): %v", denied, blocked, dst.Egress, dst.Kernel)
	}
	for who, st := range map[string]client.Stats{"the container's Trial": dst, "the process Trial": pst} {
		if st.Proxy.ByReason["policy_denied"] != 1 || st.Egress != 0 {
			t.Errorf("%s: proxy decisions %v, egress %d; want the denied name refused once, no egress", who, st.Proxy.ByReason, st.Egress)
		}
	}
	t.Logf("kernel counters, docker: %v", dst.Kernel)
	t.Logf("kernel counters, process: %v", pst.Kernel)
}

// A Docker container in a Trial run with seccomp=unconfined has no
// profile of Docker's, and the wrapper gives it one that refuses the
// kernel's key calls: the hook admits it, and the key calls fail with
// ENOSYS as a launched command's do, through the i386 entry too. The
// same container outside any Trial (no wrapper's rewrite) reaches the
// key service.
func TestPrivilegedContainerDockerKeyCalls(t *testing.T) {
	requireDocker(t)
	w := newContainerTrial(t, "ctr-docker-keys")
	t.Cleanup(func() {
		ctr.RemoveV1Cgroups(w.cgroup)
		removeTopCgroup(t, ociruntime.SlicePrefix+w.info.ID+ociruntime.SliceSuffix)
	})
	b, err := os.ReadFile(escapeeBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.rootfs, "bin", "escapee"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDockerd(w)
	keys := func(flags []string) map[string]escapeResult {
		args := append([]string{"--user", "65534:65534", "--security-opt", "seccomp=unconfined"}, flags...)
		out, err := d.run(args, "/bin/escapee", "-mode", "keys")
		if err != nil {
			t.Fatalf("docker run %q: %v\n%s", args, err, out)
		}
		t.Logf("docker run %q:\n%s", args, out)
		return parseEscapee(t, strings.NewReader(out))
	}
	in := keys(trialFlags(w.info.ID))
	// Where int $0x80 faults (no i386 entry: the escapee says "skipped")
	// there is no such call to refuse, inside or out.
	noI386 := func(r escapeResult) bool { return r.Name == "keyctl-i386" && r.Result == "skipped" }
	for _, name := range []string{"keyring-read", "keyctl-i386", "request-key-upcall"} {
		if r := in[name]; noI386(r) {
			t.Logf("%s: %s", name, r.Reason)
		} else if r.Result != "blocked" || !strings.Contains(r.Reason, "function not implemented") {
			t.Errorf("%s in the Trial: %+v, want refused by the seccomp profile (ENOSYS)", name, r)
		}
	}
	if st, err := w.agent.Stats(context.Background(), w.info.ID); err != nil || st.Layers.Containers != 1 {
		t.Errorf("the container was not recorded: %d containers, %v", st.Layers.Containers, err)
	}
	out := keys([]string{"--network", "none"})
	if r := out["keyring-read"]; strings.Contains(r.Reason, "function not implemented") || out["request-key-upcall"].Result != "escaped" ||
		out["keyctl-i386"].Result != "escaped" && !noI386(out["keyctl-i386"]) {
		t.Errorf("outside a Trial the key calls were refused too (the test shows nothing): %+v", out)
	}
}

// mayDiffer are the attempts whose outcome the process boundary decides
// and so may differ between trialnet's launcher and a runtime's: io_uring
// (Docker 20.10's seccomp profile allows it, trialnet's and the wrapper's
// rewrite refuse it; either way nothing gets out).
var mayDiffer = []string{"io_uring-connect"}

// networkAttempt are escapee's attempts through the network, each of
// which the Trial's kernel hooks count when they refuse it.
var networkAttempt = map[string]bool{
	"tcp4": true, "tcp6": true, "tcp-ipv4-mapped": true, "udp4-connected": true, "udp6-connected": true,
	"udp4-sendto": true, "udp6-sendto": true, "udp-ipv4-mapped-sendto": true, "udp4-sendmsg": true,
	"tcp4-fastopen": true, "tcp6-fastopen": true, "raw4-icmp": true, "raw6-icmp": true, "ping4": true, "ping6": true,
	"dns-udp": true, "dns-tcp": true, "loopback-other-port": true, "io_uring-connect": true,
}

func parseEscapee(t *testing.T, r io.Reader) map[string]escapeResult {
	t.Helper()
	res := map[string]escapeResult{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var e escapeResult
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("escapee output %q: %v", sc.Text(), err)
		}
		res[e.Name] = e
	}
	return res
}

// escapeeBin is test/escape's escapee: the kernel matrix's build, or
// one built here into a directory nobody can read and run from.
func escapeeBin(t *testing.T) string {
	if bin := os.Getenv("TRIALNET_TEST_ESCAPEE"); bin != "" {
		return bin
	}
	dir, err := privtest.MakeSharedDir("escapee-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "escapee")
	cmd := exec.Command("go", "build", "-o", bin, "../escape/escapee")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build escapee: %v\n%s", err, out)
	}
	return bin
}

// knock connects from the test host to at until stop closes, and
// returns how many connections it made.
func knock(h *testhost.Host, at netip.AddrPort, stop <-chan struct{}) int {
	n := 0
	for {
		select {
		case <-stop:
			return n
		default:
		}
		_ = h.NS.Do(func() error {
			if c, err := net.DialTimeout("tcp", at.String(), 100*time.Millisecond); err == nil {
				n++
				_ = c.Close()
			}
			return nil
		})
		time.Sleep(50 * time.Millisecond)
	}
}
