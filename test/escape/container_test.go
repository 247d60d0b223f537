//go:build linux

package escape

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/sandbox"
	"github.com/trialnet/trialnet/test/ctr"
	"github.com/trialnet/trialnet/trial"
)

// inContainer runs commands in a container of r in the Trial info, which
// sees the directories in ro (escapee's, the test's sockets) read-only.
// A standard stream that is a file (a socket, a terminal) reaches the
// process as it is.
func inContainer(r ctr.Runner, info client.TrialInfo, ro ...string) runner {
	return func(ctx context.Context, c sandbox.Command) (int, error) {
		cc := ctr.Cmd{Trial: info, Args: c.Args, Env: c.Env, UID: int(c.UID), GID: int(c.GID), Dir: c.Dir,
			ReadOnly: ro, Stdout: c.Stdout, ErrOut: c.Stderr}
		if c.ProxyURL != "" {
			cc.Env = append(slices.Clone(c.Env), ctr.ProxyEnv(info)...)
		}
		if f, ok := c.Stdin.(*os.File); ok {
			cc.Stdin = f
		}
		if f, ok := c.Stderr.(*os.File); ok {
			cc.Stderr, cc.ErrOut = f, io.Discard
		}
		return r.Run(ctx, cc)
	}
}

// A container whose root is a host directory that holds trialnet's own
// state (podman --rootfs DIR, a bundle's root.path: here a root that
// holds the agent's control socket, as "/" holds /run/trialnet) sees it
// as surely as one that binds it, and as uid 0 may talk to the agent: the
// hook refuses it.
func TestPrivilegedEscapeContainerRootHoldsTheAgent(t *testing.T) {
	privtest.Require(t)
	a, _, _ := testenv.ServedAgent(t, "escroot", agent.AgentConfig{})
	root := filepath.Join(t.TempDir(), "root")
	if err := ctr.DebianRoot(root); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(root, "run", "agent.sock")
	ln, err := agent.ListenSocket(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := a.Server()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	refusedByEachRuntime(t, a, sock, "root", "", func(c *ctr.Cmd) {
		c.Root = root
		c.Args = []string{"/bin/sh", "-c", "echo " + started + "; curl -sS --max-time 5 --unix-socket /run/agent.sock http://agent/v1/trials"}
	})
}

// A container given a host block device (podman --device, a bundle's
// linux.devices) reads the host's disk whatever its mounts, trialnet's
// receipt key and the agent's state with it: the hook refuses it. The disk
// here is a loop device over a file holding a secret.
func TestPrivilegedEscapeContainerHostDisk(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "losetup")
	secret := fmt.Sprintf("host-disk-secret-%d", time.Now().UnixNano())
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, append([]byte(secret), make([]byte, 1<<20)...), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", "--read-only", img).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	a, _, sock := testenv.ServedAgent(t, "escdisk", agent.AgentConfig{})
	refusedByEachRuntime(t, a, sock, "disk", secret, func(c *ctr.Cmd) {
		c.Devices = []string{dev}
		c.Args = []string{"/bin/sh", "-c", "echo " + started + "; head -c 64 " + dev}
	})
}

// A container that binds a harmless host directory recursively (every
// runtime's -v, a bundle's rbind) gets the mounts beneath it too: one of
// the agent's own directory there is named by no config, and shows the
// container its data and control socket (the Trial's unix socket hooks
// then the one layer left). The hook sees it in the kernel's mount
// table, as it sees a bind source swapped after the runtime resolved it.
func TestPrivilegedEscapeContainerSubmount(t *testing.T) {
	privtest.Require(t)
	a, dir, sock := testenv.ServedAgent(t, "escsub", agent.AgentConfig{})
	outer := t.TempDir()
	inner := filepath.Join(outer, "inner")
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "--bind", dir, inner).CombinedOutput(); err != nil {
		t.Fatalf("mount --bind %s %s: %v: %s", dir, inner, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", inner).Run() })
	reached := filepath.Join(inner, filepath.Base(sock))
	refusedByEachRuntime(t, a, sock, "sub", "", func(c *ctr.Cmd) {
		c.Binds = []string{outer}
		c.Args = []string{"/bin/sh", "-c", "echo " + started + "; curl -sS --max-time 5 --unix-socket " + reached + " http://agent/v1/trials"}
	})
}

// started is what a container prints first: one the hook refused never
// prints it.
const started = "container-started"

// refusedByEachRuntime starts a container that set makes of a plain one,
// in a Trial of a's (served on sock) through each runtime, and fails
// unless the hook refused it: it must not start, print leak (if set) or
// be recorded by the agent.
func refusedByEachRuntime(t *testing.T, a *agent.Agent, sock, name, leak string, set func(*ctr.Cmd)) {
	t.Helper()
	for _, r := range ctr.New(t, sock).Runners(t) {
		t.Run(r.Name(), func(t *testing.T) {
			info := networkTrial(t, a, name+"-"+r.Name())
			var out strings.Builder
			c := ctr.Cmd{Trial: info, Stdout: &out, ErrOut: &out}
			set(&c)
			code, err := r.Run(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("exit %d:\n%s", code, out.String())
			if code == 0 || strings.Contains(out.String(), started) || (leak != "" && strings.Contains(out.String(), leak)) {
				t.Errorf("the container started in its Trial")
			}
			if st, err := a.Stats(context.Background(), info.ID); err != nil || st.Layers.Containers != 0 {
				t.Errorf("the agent recorded it: %d containers, %v", st.Layers.Containers, err)
			}
		})
	}
}

// containerAgent is an agent serving its control socket (the hook asks
// it) and the container runtimes this host runs, with the hook installed.
func containerAgent(t *testing.T) (*agent.Agent, []ctr.Runner) {
	t.Helper()
	a, _, sock := testenv.ServedAgent(t, "escctr", agent.AgentConfig{})
	return a, ctr.New(t, sock).Runners(t)
}

// The network suite from inside a container in a Trial, for each runtime
// this host runs: every attempt ends as it does from a process of a Trial
// (escapeNetworkTrial's checks, and the same result for each attempt as
// the process's, run first in the same agent), and the kernel counts the
// same refusals.
func TestPrivilegedEscapeContainer(t *testing.T) {
	privtest.Require(t)
	c := newCanaries(t, 175)
	a, runners := containerAgent(t)
	info := networkTrial(t, a, "esc-process")
	tr, err := agent.Attach(info)
	if err != nil {
		t.Fatal(err)
	}
	ref, refKernel := escapeNetworkTrial(t, a, c, info, launched(tr, nil))
	for _, r := range runners {
		t.Run(r.Name(), func(t *testing.T) {
			info := networkTrial(t, a, "esc-"+r.Name())
			res, kernel := escapeNetworkTrial(t, a, c, info, inContainer(r, info, filepath.Dir(escapee(t))))
			sameResults(t, ref, res, containerNetwork)
			sameCounters(t, ref, res, refKernel, kernel)
		})
	}
}

// containerNetwork are the network attempts whose outcome in a container
// may differ from a process Trial's, with why.
var containerNetwork = map[string]string{
	"io_uring-connect":    "trialnet's seccomp filter refuses io_uring to the commands it launches; a runtime's profile may allow it, and then the connect4 hook refuses and counts its connect",
	"tcp6-routing-header": "trialnet's seccomp filter refuses IPv6 routing headers to the commands it launches; a runtime's profile may allow them, and then the Trial's namespace has no route to the header's first segment",
	"udp6-routing-header": "trialnet's seccomp filter refuses IPv6 routing headers to the commands it launches; a runtime's profile may allow them, and then the sendmsg6 hook refuses and counts the datagram",
}

// sameCounters fails unless the kernel counted in the container what it
// counted for the process Trial, each counter but loopback traffic's, and
// one refusal more for
// every network attempt that reached a hook in the container only (one
// in containerNetwork).
func sameCounters(t *testing.T, process, container map[string]Result, pk, ck map[string]uint64) {
	t.Helper()
	extra := uint64(0)
	for name := range containerNetwork {
		if hookRefused(container[name]) && !hookRefused(process[name]) {
			extra++
		}
	}
	for k, v := range pk {
		// Loopback traffic (the proxy's own connection, ACKs) is
		// counted, not refused: its packets vary with TCP's timing.
		if strings.HasPrefix(k, "egress_loopback_") {
			continue
		}
		if ck[k] < v {
			t.Errorf("%s: %d in the container, %d for the process Trial", k, ck[k], v)
		}
	}
	if p, c := deniedTotal(pk), deniedTotal(ck); c != p+extra {
		t.Errorf("the kernel counted %d refusals in the container, %d for the process Trial (+%d the container's runtime let reach a hook):\n process:   %v\n container: %v",
			c, p, extra, pk, ck)
	}
}

// sameResults fails for every attempt whose result differs from the
// process Trial's, but those in differ, whose difference is the
// container runtime's (docs/containers.md, "Whose layer is whose").
func sameResults(t *testing.T, process, container map[string]Result, differ map[string]string) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(process)) {
		p, c := process[name], container[name]
		switch {
		case p.Result == c.Result:
		case differ[name] != "":
			t.Logf("%s: %s in a container, %s in a process Trial: %s", name, c.Result, p.Result, differ[name])
		default:
			t.Errorf("%s: %s in a container (%s), %s in a process Trial (%s)", name, c.Result, c.Reason, p.Result, p.Reason)
		}
	}
	for name := range container {
		if _, ok := process[name]; !ok {
			t.Errorf("%s: reported in a container only", name)
		}
	}
}

// The process-boundary suite from inside a container in a Trial, for each
// runtime this host runs, against the same victim, terminal and sockets
// outside: what arrives outside is what arrives from a process of a Trial
// (run first, in the same agent), but for the attempts the container's
// own layers (the runtime's) answer for, which are those of
// containerBoundary.
func TestPrivilegedEscapeBoundaryContainer(t *testing.T) {
	privtest.Require(t)
	a, runners := containerAgent(t)
	// Each run has a world of its own: what one run got out of the victim
	// (a socket it connected) is not there for the next.
	boundary := func(t *testing.T, id string) (*boundaryWorld, client.TrialInfo) {
		w := newBoundaryWorld(t)
		info, err := a.Create(context.Background(), trial.Request{ID: id, UnixAllow: []string{w.allowed}})
		if err != nil {
			t.Fatal(err)
		}
		return w, info
	}
	w, info := boundary(t, "bnd-process")
	tr, err := agent.Attach(info)
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.Stats(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	lsm := st.Layers.BPFLSM
	ref := runBoundary(t, w, launched(tr, nil))
	var skip map[string]bool
	if !lsm {
		skip = needLSM
	}
	requireNoneArrived(t, w, ref, skip)
	differ := containerBoundary(lsm)
	for _, r := range runners {
		t.Run(r.Name(), func(t *testing.T) {
			w, info := boundary(t, "bnd-"+r.Name())
			res := runBoundary(t, w, inContainer(r, info, filepath.Dir(escapee(t)), filepath.Dir(w.allowed)))
			sameResults(t, ref, res, differ)
			requireNoneArrived(t, w, res, mergeSkips(skip, differ))
			if r := res["allowed-unix-connect"]; r.Result != "escaped" {
				t.Errorf("the allowed unix socket was not reachable from the container: %+v", r)
			}
			st, err := a.Stats(context.Background(), info.ID)
			if err != nil {
				t.Fatal(err)
			}
			if lsm && st.Kernel["foreign_socket_denied"] == 0 {
				t.Errorf("the handed socket was refused, but foreign_socket_denied did not count it: %v", st.Kernel)
			}
		})
	}
}

// containerBoundary are the process-boundary attempts whose outcome in a
// container is the runtime's to decide, with why: trialnet's seccomp
// filter and Landlock domain are a launched command's only, and a
// container has the runtime's profile (podman's allows unshare and
// io_uring; the hook requires that it refuse the key calls, and without
// the BPF LSM layer AF_VSOCK and io_uring), the
// runtime's capabilities and session. With the BPF LSM layer, the
// task-keyed hooks still refuse every attempt they claim; without it,
// those are the runtime's too. The keyring attempts and socket-vsock are
// not among them: the hook admits no container whose profile lets the
// key calls run, nor, without the layer, AF_VSOCK.
func containerBoundary(lsm bool) map[string]string {
	// A container's /run/lock is its own root's (none in the test's), not
	// the Trial's init's empty one: the write may fail there; the host's
	// is out of reach either way.
	d := map[string]string{"shared-dir-file": "the container's /run/lock is its own root's, not the Trial's cover of the host's"}
	if !lsm {
		for name, why := range map[string]string{
			"steal-via-stdio-peer":        "no Landlock domain nor trialnet seccomp in a container: pidfd_getfd of a same-uid peer is for the BPF LSM layer, absent here",
			"steal-via-allowed-unix-peer": "as steal-via-stdio-peer",
			"userns-bind-mount-unix":      "unshare and mount are the runtime's seccomp profile's to refuse; the unix identity check is the BPF LSM layer's",
		} {
			d[name] = why
		}
		// Not vsock, which no network namespace holds: without the layer
		// the hook admits only a profile that refuses it.
		for _, f := range []string{"tipc", "rds", "can", "bluetooth", "xdp", "qipcrtr", "mctp"} {
			d["socket-"+f] = "socket families are the runtime's seccomp profile's to refuse without the BPF LSM layer"
		}
	}
	return d
}

// A container in a Trial running as the uid of a host process whose user
// keyring holds a secret (the boundary world's victim, uid 65534). With
// the runtime's own seccomp profile (podman's default lets the key calls
// run; a bundle has none) the hook refuses it before its first
// instruction: nothing runs, the secret stays in, the agent records no
// container. With the profile trialnet oci-hook install writes (a
// bundle's: the least one that refuses the key calls) it runs, and its
// key calls fail as a launched command's do.
func TestPrivilegedEscapeContainerKeyring(t *testing.T) {
	privtest.Require(t)
	a, runners := containerAgent(t)
	for _, r := range runners {
		t.Run(r.Name(), func(t *testing.T) {
			w := newBoundaryWorld(t)
			info, err := a.Create(context.Background(), trial.Request{ID: "key-" + r.Name(), UnixAllow: []string{w.allowed}})
			if err != nil {
				t.Fatal(err)
			}
			ro := []string{filepath.Dir(escapee(t)), filepath.Dir(w.allowed)}
			var out strings.Builder
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			code, err := r.Run(ctx, ctr.Cmd{Trial: info, Args: append([]string{"/bin/sh", "-c", "echo " + started + `; exec "$@"`, "sh"}, w.args(t)...),
				Env: []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534, ReadOnly: ro, RuntimeSeccomp: true, Stdout: &out, ErrOut: &out})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("with the runtime's own profile: exit %d:\n%s", code, out.String())
			if code == 0 || strings.Contains(out.String(), started) || strings.Contains(out.String(), w.keySecret) {
				t.Errorf("the container started with a profile that lets it use the kernel's keyrings")
			}
			// crun under podman reports only that the hook failed; runc
			// shows what the hook said.
			if r.Name() == "runc-bundle" && !strings.Contains(out.String(), "lets it use the kernel's keyrings") {
				t.Errorf("runc did not show why the hook refused it")
			}
			if st, err := a.Stats(context.Background(), info.ID); err != nil || st.Layers.Containers != 0 {
				t.Errorf("the agent recorded it: %d containers, %v", st.Layers.Containers, err)
			}

			res := runBoundary(t, w, inContainer(r, info, ro...))
			for _, name := range []string{"keyring-read", "keyctl-i386", "request-key-upcall"} {
				if got := res[name]; noI386Entry(got) {
					t.Logf("%s: %s", name, got.Reason)
				} else if got.Result != "blocked" || strings.Contains(got.Reason, w.keySecret) {
					t.Errorf("%s with the profile: %+v, want blocked", name, got)
				}
			}
		})
	}
}

func mergeSkips(skip map[string]bool, differ map[string]string) map[string]bool {
	m := maps.Clone(skip)
	if m == nil {
		m = map[string]bool{}
	}
	for name := range differ {
		m[name] = true
	}
	return m
}

// runBoundary runs the boundary escapee by run as uid 65534, with the
// operator's terminal as its standard error and the victim's socket as
// its standard input.
func runBoundary(t *testing.T, w *boundaryWorld, run runner) map[string]Result {
	t.Helper()
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, err := run(ctx, sandbox.Command{Args: w.args(t), Env: []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534,
		Stdin: w.peer, Stdout: &out, Stderr: w.opSlave})
	if err != nil || code != 0 {
		t.Fatalf("escapee: exit %d, %v\n%s", code, err, out.String())
	}
	return parseResults(t, []byte(out.String()))
}
