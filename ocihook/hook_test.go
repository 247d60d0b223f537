//go:build linux

package ocihook

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/agentwire"
	"golang.org/x/sys/unix"
)

func TestParseState(t *testing.T) {
	for _, tc := range []struct {
		name, in, err string
	}{
		{"ok", `{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":42,"bundle":"/b","annotations":{"trialnet.io/trial":"t"}}`, ""},
		{"unknown keys pass", `{"ociVersion":"1.1.0","id":"c1","pid":42,"bundle":"/b","extra":1}`, ""},
		{"no version", `{"id":"c1","pid":42,"bundle":"/b"}`, "no ociVersion"},
		{"no id", `{"ociVersion":"1","pid":42,"bundle":"/b"}`, "no container id"},
		{"relative bundle", `{"ociVersion":"1","id":"c","pid":42,"bundle":"b"}`, "not an absolute path"},
		{"duplicate key", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b","annotations":{"trialnet.io/trial":"a","trialnet.io/trial":"b"}}`, "appears twice"},
		{"duplicate key by case", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b","Pid":7}`, "appears twice"},
		{"duplicate key by Go's folding", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b","annotations":{"a":"1"},"annotationſ":{}}`, "appears twice"},
		{"duplicate key by an escape", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b","\u0070id":7}`, "appears twice"},
		{"duplicate key after a quote in a value", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b","annotations":{"a":"x\"}, \"a\": ","a":"y"}}`, "appears twice"},
		{"duplicate key in an array's object", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b","x":[1,{"k":[]},{"k":1,"K":2}]}`, "appears twice"},
		{"nested objects, keys again", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b","annotations":{"id":"x"},"x":[{"id":1},{"id":2}]}`, ""},
		// crun's yajl cuts a string at U+0000, reads a byte that is not
		// UTF-8 as written and a lone surrogate as '?': Go reads each
		// otherwise.
		{"U+0000 in a key", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b","annotations":{"a\u0000b":"1"}}`, "U+0000"},
		{"U+0000 in a value", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b\u0000x"}`, "U+0000"},
		{"a lone high surrogate", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b\ud800"}`, "not in a pair"},
		{"a high surrogate, then no low", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b\ud800\u0041"}`, "not in a pair"},
		{"a lone low surrogate", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b\udc00x"}`, "not in a pair"},
		{"an overlong NUL", "{\"ociVersion\":\"1\",\"id\":\"c\",\"pid\":42,\"bundle\":\"/b\xc0\x80\"}", "not UTF-8"},
		{"a surrogate pair passes", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b\ud83d\ude00"}`, ""},
		{"an escaped backslash before u0000 passes", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b\\u0000"}`, ""},
		{"UTF-8 passes", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b/é"}`, ""},
		{"two values", `{"ociVersion":"1","id":"c","pid":42,"bundle":"/b"} {}`, "more than one"},
		{"not JSON", `ociVersion=1`, "invalid character"},
		{"too large", `{"ociVersion":"1","id":"` + strings.Repeat("x", maxState) + `"}`, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseState(strings.NewReader(tc.in))
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("ParseState: %v, want %q", err, tc.err)
			}
		})
	}
}

// world is a container's surroundings made of real files: a cgroup2
// "mount" with a Trial's cgroup in it, a "/proc" whose namespace links
// point at files standing for namespaces, and a bundle.
type world struct {
	t                    *testing.T
	dir, proc, mount     string
	bundle               string
	info                 client.TrialInfo
	agent                *fakeAgent
	hostNet, hostPID     string
	hostCgroupNS, trialN string
	hostMnt, hostIPC     string
}

type fakeAgent struct {
	trials map[string]client.TrialInfo
	err    error // every call fails with it
	addErr error // AddContainer fails with it
	added  []client.Container
	calls  int
	// made, ended and destroyed are the calls for containers made Trials.
	made      []client.ContainerTrial
	ended     []string
	destroyed []string
}

func (f *fakeAgent) Get(_ context.Context, id string) (client.TrialInfo, error) {
	f.calls++
	if f.err != nil {
		return client.TrialInfo{}, f.err
	}
	info, ok := f.trials[id]
	if !ok {
		return client.TrialInfo{}, &client.Error{Code: client.CodeUnknownTrial, Message: "no live Trial " + id}
	}
	return info, nil
}

func (f *fakeAgent) AddContainer(_ context.Context, id string, c client.Container) (client.TrialInfo, error) {
	f.calls++
	if f.err != nil {
		return client.TrialInfo{}, f.err
	}
	if f.addErr != nil {
		return client.TrialInfo{}, f.addErr
	}
	f.added = append(f.added, c)
	return f.trials[id], nil
}

func (f *fakeAgent) ContainerTrial(_ context.Context, req client.ContainerTrial) (client.TrialInfo, error) {
	f.calls++
	if f.err != nil {
		return client.TrialInfo{}, f.err
	}
	f.made = append(f.made, req)
	return f.trials["eval-1"], nil
}

func (f *fakeAgent) EndContainer(_ context.Context, id string) (agentwire.ContainerEnd, error) {
	f.calls++
	if f.err != nil {
		return agentwire.ContainerEnd{}, f.err
	}
	f.ended = append(f.ended, id)
	return agentwire.ContainerEnd{Trial: "eval-1", Destroyed: true}, nil
}

func (f *fakeAgent) Destroy(_ context.Context, id string) error {
	f.calls++
	f.destroyed = append(f.destroyed, id)
	return f.err
}

const testPID = 4242

func newContainerWorld(t *testing.T) *world {
	t.Helper()
	dir := t.TempDir()
	w := &world{t: t, dir: dir, proc: filepath.Join(dir, "proc"), mount: filepath.Join(dir, "cgroup"), bundle: filepath.Join(dir, "bundle")}
	for _, d := range []string{w.proc, w.mount, w.bundle, filepath.Join(w.mount, "trialnet", "eval-1", "libpod-c1"), filepath.Join(w.mount, "other")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	w.hostNet, w.hostPID, w.hostCgroupNS, w.trialN = w.file("ns-host-net"), w.file("ns-host-pid"), w.file("ns-host-cgroup"), w.file("pins/ns-trial-net")
	w.hostMnt, w.hostIPC = w.file("ns-host-mnt"), w.file("ns-host-ipc")
	cg := filepath.Join(w.mount, "trialnet", "eval-1")
	var st unix.Stat_t
	if err := unix.Stat(cg, &st); err != nil {
		t.Fatal(err)
	}
	w.info = client.TrialInfo{Netns: w.trialN, Cgroup: cg, CgroupID: st.Ino}
	w.info.ID = "eval-1"
	w.agent = &fakeAgent{trials: map[string]client.TrialInfo{"eval-1": w.info}}
	w.procNS("self", w.hostNet, w.hostPID, w.hostCgroupNS, "/")
	// The container as a runtime makes it: new PID and cgroup
	// namespaces, the Trial's network, a cgroup under the Trial's.
	w.procNS("4242", w.trialN, w.file("ns-ctr-pid"), w.file("ns-ctr-cgroup"), "/trialnet/eval-1/libpod-c1")
	w.writeConfig(goodConfig())
	return w
}

func (w *world) file(name string) string {
	p := filepath.Join(w.dir, name)
	// The Trial's pin in a directory of its own, as the agent's are: the
	// hook protects it, and the world's bundle is not in it.
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		w.t.Fatal(err)
	}
	return p
}

// procNS makes proc/PID with ns links to the given files and a cgroup
// file naming cg; its mount namespace is the host's for self, its own
// for any other.
func (w *world) procNS(pid, net, pidNS, cgNS, cg string) {
	d := filepath.Join(w.proc, pid)
	_ = os.RemoveAll(d)
	if err := os.MkdirAll(filepath.Join(d, "ns"), 0o755); err != nil {
		w.t.Fatal(err)
	}
	mnt, ipc := w.hostMnt, w.hostIPC
	if pid != "self" {
		mnt, ipc = w.file("ns-mnt-"+pid), w.file("ns-ipc-"+pid)
	}
	for name, target := range map[string]string{"net": net, "pid": pidNS, "cgroup": cgNS, "mnt": mnt, "ipc": ipc} {
		if err := os.Symlink(target, filepath.Join(d, "ns", name)); err != nil {
			w.t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(d, "cgroup"), []byte("0::"+cg+"\n"), 0o644); err != nil {
		w.t.Fatal(err)
	}
	// Its mounts, as runc has them at createRuntime: the host's copy, its
	// root not yet pivoted, nothing under the bundle's rootfs (the
	// kernel's view is tested on real processes, in priv_test.go).
	if err := os.WriteFile(filepath.Join(d, "mountinfo"), []byte("1 0 253:99 / / rw - ext4 /dev/vda1 rw\n"), 0o644); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(d, "root")); err != nil {
		w.t.Fatal(err)
	}
}

func goodConfig() map[string]any {
	return map[string]any{
		"ociVersion": "1.0.2",
		"root":       map[string]any{"path": "rootfs"},
		"process": map[string]any{"capabilities": map[string]any{
			"bounding":  []string{"CAP_CHOWN", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_KILL"},
			"effective": []string{"CAP_CHOWN", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_KILL"},
		}},
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": []string{"nosuid", "ro"}},
			{"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts", "options": []string{"rbind", "ro"}},
		},
		"linux": map[string]any{
			"namespaces": []map[string]any{{"type": "pid"}, {"type": "network", "path": "/run/trialnet/netns/eval-1"},
				{"type": "mount"}, {"type": "cgroup"}, {"type": "ipc"}, {"type": "uts"}},
			"seccomp": map[string]any{"defaultAction": "SCMP_ACT_ERRNO"},
			// Docker's and runc spec's: the kernel's knobs in /proc read-only.
			"readonlyPaths": []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
			"maskedPaths":   []string{"/proc/kcore", "/proc/keys", "/sys/firmware"},
			// Docker's default rules as trialnet's runtime wrapper leaves
			// them: every node may be made, only the usual character
			// devices opened (ptys, /dev/tty and tun among them, which
			// pass; not the console, 5:1, which the wrapper drops).
			"resources": map[string]any{"devices": []map[string]any{{"allow": false, "access": "rwm"},
				{"allow": true, "type": "c", "access": "m"}, {"allow": true, "type": "b", "access": "m"},
				{"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
				{"allow": true, "type": "c", "major": 5, "minor": 0, "access": "rwm"},
				{"allow": true, "type": "c", "major": 5, "minor": 2, "access": "rwm"},
				{"allow": true, "type": "c", "major": 136, "access": "rwm"},
				{"allow": true, "type": "c", "major": 10, "minor": 200, "access": "rwm"}}},
		},
		"annotations": map[string]string{AnnotationTrial: "eval-1"},
	}
}

func (w *world) writeConfig(c map[string]any) {
	b, err := json.Marshal(c)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.bundle, "config.json"), b, 0o644); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) hook() *Hook {
	return &Hook{Agent: func() Agent { return w.agent }, Proc: w.proc, CgroupMount: w.mount,
		Protected: DefaultProtected("/run/trialnet/agent.sock", w.mount)}
}

func (w *world) state(ann map[string]string) string {
	b, _ := json.Marshal(State{OCIVersion: "1.0.2", ID: "c1", Status: "creating", Pid: testPID, Bundle: w.bundle, Annotations: ann})
	return string(b)
}

func (w *world) run(state string) (Result, error) {
	return w.hook().Run(context.Background(), strings.NewReader(state))
}

func TestHookLetsInAContainerInItsTrial(t *testing.T) {
	w := newContainerWorld(t)
	res, err := w.run(w.state(map[string]string{AnnotationTrial: "eval-1"}))
	if err != nil || res.Trial != "eval-1" {
		t.Fatalf("a container in its Trial: %v, %+v", err, res)
	}
	if len(w.agent.added) != 1 {
		t.Fatalf("the agent recorded %d containers, want 1", len(w.agent.added))
	}
	c := w.agent.added[0]
	if c.ID != "c1" || c.PID != testPID || !c.Seccomp || c.UserNamespace || len(c.Capabilities) != 4 {
		t.Errorf("recorded %+v", c)
	}
	// The cgroup may be the Trial's own.
	w.procNS("4242", w.trialN, w.file("p2"), w.file("c2"), "/trialnet/eval-1")
	if _, err := w.run(w.state(map[string]string{AnnotationTrial: "eval-1"})); err != nil {
		t.Errorf("a container in the Trial's own cgroup: %v", err)
	}
	// crun's annotation that only makes it refuse a profile naming a
	// call it does not know changes no filter.
	cfg := goodConfig()
	cfg["annotations"] = map[string]string{AnnotationTrial: "eval-1", "run.oci.seccomp_fail_unknown_syscall": "1"}
	w.writeConfig(cfg)
	if _, err := w.run(w.state(map[string]string{AnnotationTrial: "eval-1"})); err != nil {
		t.Errorf("with run.oci.seccomp_fail_unknown_syscall: %v", err)
	}
	// Nor do the clocks of its own time namespace, no subgroup below
	// its systemd scope, or annotations no runtime acts on (podman's, an
	// image's).
	cfg["annotations"] = map[string]string{AnnotationTrial: "eval-1", "run.oci.timens_offset": "monotonic 86400 0",
		"io.podman.annotations.autoremove": "TRUE", "org.opencontainers.image.stopSignal": "15", "run.oci.systemd.subgroup": ""}
	w.writeConfig(cfg)
	if _, err := w.run(w.state(map[string]string{AnnotationTrial: "eval-1"})); err != nil {
		t.Errorf("with run.oci.timens_offset, an empty run.oci.systemd.subgroup and podman's annotations: %v", err)
	}
}

// A container without the annotation never reaches the agent: the
// agent's own container is started through the same hook. Outside every
// Trial, privileged, it passes.
func TestHookPassesUnannotatedWithoutTheAgent(t *testing.T) {
	w := newContainerWorld(t)
	w.procNS("4242", w.file("ns-own-net"), w.file("ns-ctr-pid"), w.file("ns-ctr-cgroup"), "/other/ctr")
	cfg := goodConfig()
	delete(cfg, "annotations")
	cfg["process"] = map[string]any{"capabilities": map[string]any{"bounding": []string{"CAP_SYS_ADMIN"}}}
	// A namespace of a process outside every Trial, joined by path.
	w.procNS("77", w.file("ns-77-net"), w.file("ns-77-pid"), w.file("ns-77-cgroup"), "/other/x")
	cfg["linux"].(map[string]any)["namespaces"] = []map[string]any{{"type": "pid", "path": filepath.Join(w.proc, "77", "ns", "pid")},
		{"type": "network", "path": filepath.Join(w.proc, "77", "ns", "net")}, {"type": "ipc"}}
	w.writeConfig(cfg)
	w.agent.err = errors.New("the agent is not reachable")
	for _, ann := range []map[string]string{nil, {"io.podman.annotations.autoremove": "TRUE"}} {
		if _, err := w.run(w.state(ann)); err != nil {
			t.Errorf("unannotated container (%v): %v", ann, err)
		}
	}
	if w.agent.calls != 0 {
		t.Errorf("the hook called the agent %d times for containers that claim no Trial", w.agent.calls)
	}
}

// A container without the annotation that shares a Trial's namespace or
// cgroup is refused, without a word to the agent: a process of the
// Trial's would trace or signal it, attach its shared memory or reach
// it on a loopback, outside the Trial's layers.
func TestHookRefusesUnannotatedInATrial(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(w *world, cfg map[string]any)
		want string
	}{
		{"a Trial container's PID namespace joined (--pid container:X)", func(w *world, cfg map[string]any) {
			w.setNS(cfg, "pid", filepath.Join(w.proc, "500", "ns", "pid"))
		}, "joins the pid namespace of process 500"},
		{"its IPC namespace, by a thread's file", func(w *world, cfg map[string]any) {
			w.setNS(cfg, "ipc", filepath.Join(w.proc, "500", "task", "501", "ns", "ipc"))
		}, "joins the ipc namespace of process 500"},
		{"its network namespace file", func(w *world, cfg map[string]any) {
			w.setNS(cfg, "network", w.trialN)
		}, "joins Trial ns-trial-net's network namespace"},
		// runc opens the path as written: through pid 1's root, or a
		// link, it is the Trial process's namespace all the same.
		{"its IPC namespace through /proc/1/root", func(w *world, cfg map[string]any) {
			w.procNS("1", w.hostNet, w.hostPID, w.hostCgroupNS, "/init.scope")
			w.setNS(cfg, "ipc", filepath.Join(w.proc, "1", "root", w.proc, "500", "ns", "ipc"))
		}, "joins the ipc namespace of thread 500"},
		{"its IPC namespace, held by a process outside it", func(w *world, cfg map[string]any) {
			w.procNS("77", w.file("ns-77-net"), w.file("ns-77-pid"), w.file("ns-77-cgroup"), "/other/infra")
			ipc := filepath.Join(w.proc, "77", "ns", "ipc")
			if err := os.Remove(ipc); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(w.file("ns-ipc-500"), ipc); err != nil {
				t.Fatal(err)
			}
			w.setNS(cfg, "ipc", ipc)
		}, "joins the ipc namespace of thread 500"},
		{"its PID namespace through a link", func(w *world, cfg map[string]any) {
			link := filepath.Join(w.dir, "pidlink")
			if err := os.Symlink(filepath.Join(w.proc, "500", "ns", "pid"), link); err != nil {
				t.Fatal(err)
			}
			w.setNS(cfg, "pid", link)
		}, "joins the pid namespace of thread 500"},
		{"a cgroupsPath in the Trial's", func(w *world, cfg map[string]any) {
			cfg["linux"].(map[string]any)["cgroupsPath"] = "/trialnet/eval-1/sidecar"
		}, "its cgroupsPath /trialnet/eval-1/sidecar is in Trial eval-1's cgroup"},
		{"its process in the Trial's cgroup", func(w *world, cfg map[string]any) {
			w.procNS("4242", w.file("ns-own-net"), w.file("ns-ctr-pid"), w.file("ns-ctr-cgroup"), "/trialnet/eval-1/sidecar")
		}, "its process is in Trial eval-1's cgroup (/trialnet/eval-1/sidecar)"},
		{"its process in the Trial's network namespace", func(w *world, cfg map[string]any) {
			w.procNS("4242", w.trialN, w.file("ns-ctr-pid"), w.file("ns-ctr-cgroup"), "/other/ctr")
		}, "its process is in Trial ns-trial-net's network namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newContainerWorld(t)
			// A Trial container's init, and the container outside.
			w.procNS("500", w.trialN, w.file("ns-500-pid"), w.file("ns-500-cgroup"), "/trialnet/eval-1/libpod-c0")
			w.threads("/trialnet/eval-1/libpod-c0", "500", "501")
			w.procNS("4242", w.file("ns-own-net"), w.file("ns-ctr-pid"), w.file("ns-ctr-cgroup"), "/other/ctr")
			cfg := goodConfig()
			delete(cfg, "annotations")
			w.setNS(cfg, "network", "")
			tc.edit(w, cfg)
			w.writeConfig(cfg)
			h := w.hook()
			h.NetnsDir = filepath.Dir(w.trialN)
			_, err := h.Run(context.Background(), strings.NewReader(w.state(nil)))
			var r *Refusal
			if !errors.As(err, &r) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "annotate it trialnet.io/trial=ID") {
				t.Errorf("got %v, want refused: %q", err, tc.want)
			}
			if w.agent.calls != 0 {
				t.Errorf("the hook called the agent %d times for a container that claims no Trial", w.agent.calls)
			}
		})
	}
}

// The agent's Trials under a parent moved in its config (the hook's
// --cgroup-parent): a container in one is found there, and one under
// the default parent's name is in no Trial.
func TestHookFindsTrialsUnderAMovedParent(t *testing.T) {
	w := newContainerWorld(t)
	cfg := goodConfig()
	delete(cfg, "annotations")
	w.setNS(cfg, "network", "")
	w.writeConfig(cfg)
	h := w.hook()
	h.TrialParent = filepath.Join(w.mount, "evals")
	for cg, want := range map[string]string{"/evals/eval-2/sidecar": "in Trial eval-2's cgroup", "/trialnet/eval-1/libpod-c1": ""} {
		w.procNS("4242", w.file("ns-own-net"), w.file("ns-ctr-pid"), w.file("ns-ctr-cgroup"), cg)
		_, err := h.Run(context.Background(), strings.NewReader(w.state(nil)))
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("a container in %s: %v, want %q", cg, err, want)
		}
	}
	h.TrialParent = "/elsewhere/evals"
	if _, err := h.Run(context.Background(), strings.NewReader(w.state(nil))); err == nil || !strings.Contains(err.Error(), "is not under the cgroup2 mount") {
		t.Errorf("a parent outside the cgroup2 mount: %v", err)
	}
}

// threads writes cgroup cg's cgroup.threads.
func (w *world) threads(cg string, tids ...string) {
	d := filepath.Join(w.mount, cg)
	if err := os.MkdirAll(d, 0o755); err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "cgroup.threads"), []byte(strings.Join(tids, "\n")+"\n"), 0o644); err != nil {
		w.t.Fatal(err)
	}
}

// setNS sets the path of cfg's namespace typ.
func (w *world) setNS(cfg map[string]any, typ, path string) {
	for _, ns := range cfg["linux"].(map[string]any)["namespaces"].([]map[string]any) {
		if ns["type"] == typ {
			ns["path"] = path
		}
	}
}

func TestHookRefuses(t *testing.T) {
	trial := map[string]string{AnnotationTrial: "eval-1"}
	for _, tc := range []struct {
		name  string
		setup func(w *world) string // returns the state
		want  string
	}{
		{"agent unreachable", func(w *world) string {
			w.agent.err = client.ErrNoAgent
			return w.state(trial)
		}, "cannot look Trial"},
		{"unknown Trial", func(w *world) string {
			delete(w.agent.trials, "eval-1")
			return w.state(trial)
		}, "no live Trial eval-1"},
		{"profile and Trial both", func(w *world) string {
			return w.state(map[string]string{AnnotationProfile: "claude", AnnotationTrial: "eval-1"})
		}, "annotate one"},
		{"unknown trialnet annotation", func(w *world) string {
			return w.state(map[string]string{AnnotationTrial: "eval-1", "trialnet.io/mode": "lax"})
		}, "not ones this trialnet knows"},
		// An unset variable in a template (--annotation
		// trialnet.io/profile=$PROFILE) asks for a Trial all the same.
		{"an empty profile", func(w *world) string {
			cfg := goodConfig()
			cfg["annotations"] = map[string]string{AnnotationProfile: ""}
			w.writeConfig(cfg)
			return w.state(map[string]string{AnnotationProfile: ""})
		}, "is empty"},
		{"an empty Trial", func(w *world) string {
			cfg := goodConfig()
			cfg["annotations"] = map[string]string{AnnotationTrial: ""}
			w.writeConfig(cfg)
			return w.state(nil)
		}, "is empty"},
		{"state and config disagree", func(w *world) string {
			return w.state(map[string]string{AnnotationTrial: "other"})
		}, "in the state and"},
		{"annotated only in config.json", func(w *world) string {
			w.procNS("4242", w.hostNet, w.file("p"), w.file("c"), "/trialnet/eval-1/libpod-c1")
			return w.state(nil)
		}, "network namespace is not the Trial's"},
		{"no pid", func(w *world) string {
			b, _ := json.Marshal(State{OCIVersion: "1", ID: "c1", Bundle: w.bundle, Annotations: trial})
			return string(b)
		}, "no container process"},
		{"no config.json", func(w *world) string {
			_ = os.Remove(filepath.Join(w.bundle, "config.json"))
			return w.state(trial)
		}, "read the bundle's config"},
		{"config with a key twice", func(w *world) string {
			_ = os.WriteFile(filepath.Join(w.bundle, "config.json"), []byte(`{"process":{"capabilities":{"bounding":["CAP_SYS_ADMIN"]},"Capabilities":{"bounding":[]}},"annotations":{"trialnet.io/trial":"eval-1"}}`), 0o644)
			return w.state(trial)
		}, "appears twice"},
		{"host network", func(w *world) string {
			w.setNamespaces("pid", "mount", "cgroup")
			w.procNS("4242", w.hostNet, w.file("p"), w.file("c"), "/trialnet/eval-1/libpod-c1")
			return w.state(trial)
		}, "no network namespace of its own"},
		{"host IPC (--ipc host)", func(w *world) string {
			w.setNamespaces("network", "pid", "mount", "cgroup")
			return w.state(trial)
		}, "no ipc namespace of its own"},
		{"the runtime's IPC namespace joined by path", func(w *world) string {
			w.procNS("4242", w.trialN, w.file("p"), w.file("c"), "/trialnet/eval-1/libpod-c1")
			_ = os.Remove(filepath.Join(w.proc, "4242", "ns", "ipc"))
			if err := os.Symlink(w.hostIPC, filepath.Join(w.proc, "4242", "ns", "ipc")); err != nil {
				w.t.Fatal(err)
			}
			return w.state(trial)
		}, "shares the runtime's (the host's) ipc namespace"},
		{"another network namespace", func(w *world) string {
			w.procNS("4242", w.file("ns-other"), w.file("p"), w.file("c"), "/trialnet/eval-1/libpod-c1")
			return w.state(trial)
		}, "network namespace is not the Trial's"},
		{"host PID namespace in the config", func(w *world) string {
			w.setNamespaces("network", "mount", "cgroup")
			return w.state(trial)
		}, "no pid namespace of its own"},
		{"host PID namespace joined by path", func(w *world) string {
			w.procNS("4242", w.trialN, w.hostPID, w.file("c"), "/trialnet/eval-1/libpod-c1")
			return w.state(trial)
		}, "shares the runtime's (the host's) pid namespace"},
		{"host cgroup namespace", func(w *world) string {
			w.setNamespaces("network", "mount", "pid")
			return w.state(trial)
		}, "no cgroup namespace of its own"},
		{"cgroup outside the Trial", func(w *world) string {
			w.procNS("4242", w.trialN, w.file("p"), w.file("c"), "/other")
			return w.state(trial)
		}, "is not the Trial's"},
		{"cgroup beside the Trial's, same prefix", func(w *world) string {
			_ = os.MkdirAll(filepath.Join(w.mount, "trialnet", "eval-10"), 0o755)
			w.procNS("4242", w.trialN, w.file("p"), w.file("c"), "/trialnet/eval-10")
			return w.state(trial)
		}, "is not the Trial's"},
		{"cgroup dot-dot", func(w *world) string {
			w.procNS("4242", w.trialN, w.file("p"), w.file("c"), "/trialnet/eval-1/../../other")
			return w.state(trial)
		}, "is not the Trial's"},
		{"Trial cgroup replaced", func(w *world) string {
			w.agent.trials["eval-1"] = client.TrialInfo{Netns: w.trialN, Cgroup: w.info.Cgroup, CgroupID: w.info.CgroupID + 1}
			return w.state(trial)
		}, "not the one the agent created"},
		{"privileged", func(w *world) string {
			w.setCaps("bounding", "CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_PTRACE", "CAP_BPF")
			return w.state(trial)
		}, "CAP_NET_ADMIN: "},
		{"capability lower case, no prefix", func(w *world) string {
			w.setCaps("permitted", "sys_admin")
			return w.state(trial)
		}, "CAP_SYS_ADMIN"},
		{"capability only ambient", func(w *world) string {
			w.setCaps("ambient", "CAP_DAC_READ_SEARCH")
			return w.state(trial)
		}, "CAP_DAC_READ_SEARCH"},
		{"the host's clock", func(w *world) string {
			w.setCaps("effective", "sys_time")
			return w.state(trial)
		}, "CAP_SYS_TIME"},
		{"the host's kernel log", func(w *world) string {
			w.setCaps("inheritable", "CAP_SYSLOG")
			return w.state(trial)
		}, "CAP_SYSLOG"},
		// runc 1.1.5 here, with /dev/tty1: KDSKBSENT (F1's string) took
		// with this capability, EPERM without.
		{"the host console's keymap", func(w *world) string {
			w.setCaps("bounding", "CAP_SYS_TTY_CONFIG")
			return w.state(trial)
		}, "CAP_SYS_TTY_CONFIG"},
		{"a name in Unicode that upper-cases to one refused", func(w *world) string {
			// runc looks names up as written and ignores this one; the hook
			// refuses what it folds to, the safer reading.
			w.setCaps("bounding", "cap_\u017fys_admin")
			return w.state(trial)
		}, "CAP_SYS_ADMIN"},
		{"not a capability", func(w *world) string {
			w.setCaps("bounding", "CAP_SYS_ADMIN\x01")
			return w.state(trial)
		}, "not a capability name"},
		// crun matches keys with strcmp, which stops at U+0000: this is
		// a "mounts" to it (the first, written first), unknown to Go.
		{"a key crun reads as mounts, cut at U+0000", func(w *world) string {
			c := goodConfig()
			c["mounts\x00"] = []map[string]any{{"destination": "/x", "type": "bind", "source": "/run/trialnet", "options": []string{"rbind"}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "U+0000"},
		{"a bind source crun reads cut at U+0000", func(w *world) string {
			w.setMount(map[string]any{"destination": "/x", "type": "bind", "source": "/run/trialnet\x00/x", "options": []string{"rbind"}})
			return w.state(trial)
		}, "U+0000"},
		{"writable cgroup mount", func(w *world) string {
			w.setMount(map[string]any{"destination": "/sys/fs/cgroup", "type": "cgroup2", "source": "cgroup2", "options": []string{"rw"}})
			return w.state(trial)
		}, "writable cgroup"},
		{"control socket bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/agent", "type": "bind", "source": "/run/trialnet", "options": []string{"rbind"}})
			return w.state(trial)
		}, "/run/trialnet"},
		{"host root bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/host", "source": "/", "options": []string{"bind", "ro"}})
			return w.state(trial)
		}, "binds / on /host"},
		{"receipt key through a link", func(w *world) string {
			link := filepath.Join(w.dir, "innocent")
			_ = os.Symlink("/var/lib/trialnet", link)
			w.setMount(map[string]any{"destination": "/x", "type": "bind", "source": link, "options": []string{"rbind"}})
			return w.state(trial)
		}, "/var/lib/trialnet"},
		{"host root as its root", func(w *world) string {
			c := goodConfig()
			c["root"] = map[string]any{"path": "/", "readonly": true}
			w.writeConfig(c)
			return w.state(trial)
		}, "its root file system / holds"},
		{"a root above the receipt key", func(w *world) string {
			c := goodConfig()
			c["root"] = map[string]any{"path": "/var/lib/../lib"}
			w.writeConfig(c)
			return w.state(trial)
		}, "/var/lib/trialnet"},
		{"a host block device", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["devices"] = []map[string]any{{"path": "/dev/vda", "type": "b", "major": 254, "minor": 0}}
			w.writeConfig(c)
			return w.state(trial)
		}, "the block device /dev/vda (254:0)"},
		{"every device allowed", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["resources"] = map[string]any{"devices": []map[string]any{{"allow": false, "access": "rwm"}, {"allow": true, "type": "a", "access": "rwm"}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "lets it open block devices"},
		{"block devices opened by a rule without access", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["resources"] = map[string]any{"devices": []map[string]any{{"allow": true, "type": "b", "major": 254}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "lets it open block devices"},
		{"every character device opened (--device-cgroup-rule 'c *:* rwm')", func(w *world) string {
			// With CAP_MKNOD (Docker's default) it makes /dev/sg0 and
			// reads the host's disk with SG_IO READ commands, which want
			// no capability.
			c := goodConfig()
			c["linux"].(map[string]any)["resources"] = map[string]any{"devices": []map[string]any{{"allow": true, "type": "c", "access": "rwm"}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "lets it open every character device"},
		{"every character device opened by major -1", func(w *world) string {
			// runc 1.1.5 reads -1 as any major: a node of 10:229, refused
			// without this rule, opened with it.
			c := goodConfig()
			c["linux"].(map[string]any)["resources"] = map[string]any{"devices": []map[string]any{{"allow": true, "type": "c", "major": -1, "access": "rwm"}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "lets it open every character device"},
		{"SCSI generic devices opened by a rule", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["resources"] = map[string]any{"devices": []map[string]any{{"allow": true, "type": "c", "major": 21, "access": "r"}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "lets it open character devices 21:*, among them a device that passes commands through to a disk (sg)"},
		// runc's cgroup v2 filter compares int32(major): 5+2^32 is 5.
		{"the console opened by a rule, its major past 32 bits", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["resources"] = map[string]any{"devices": []map[string]any{{"allow": true, "type": "c", "major": 5 + 1<<32, "minor": 1, "access": "rw"}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "its device cgroup rule c 4294967301:1 has numbers no device has"},
		// mknod keeps a major's low 12 bits: 4101 is 5.
		{"the console given, its major past 12 bits", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["devices"] = []map[string]any{{"path": "/dev/c", "type": "c", "major": 5 + 1<<12, "minor": 1}}
			w.writeConfig(c)
			return w.state(trial)
		}, "its device /dev/c (4101:1) has numbers no device has"},
		{"a minor past 20 bits", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["devices"] = []map[string]any{{"path": "/dev/c", "type": "c", "major": 5, "minor": 1 + 1<<20}}
			w.writeConfig(c)
			return w.state(trial)
		}, "its device /dev/c (5:1048577) has numbers no device has"},
		{"a SCSI generic device given", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["devices"] = []map[string]any{{"path": "/dev/sg0", "type": "c", "major": 21, "minor": 0}}
			w.writeConfig(c)
			return w.state(trial)
		}, "the device /dev/sg0 (21:0), a device that passes commands through to a disk (sg)"},
		// runc 1.1.5 here, with runc's default capabilities and /dev/tty1:
		// TIOCSCTTY took it (no session held it), then VT_ACTIVATE, which
		// switches the host's display, was let through.
		{"a virtual console given", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["devices"] = []map[string]any{{"path": "/dev/tty1", "type": "c", "major": 4, "minor": 1}}
			w.writeConfig(c)
			return w.state(trial)
		}, "the device /dev/tty1 (4:1), a virtual console"},
		{"a console's screen given", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["devices"] = []map[string]any{{"path": "/dev/vcs1", "type": "c", "major": 7, "minor": 1}}
			w.writeConfig(c)
			return w.state(trial)
		}, "the device /dev/vcs1 (7:1), a screen"},
		{"an input device given", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["devices"] = []map[string]any{{"path": "/dev/input/event0", "type": "c", "major": 13, "minor": 64}}
			w.writeConfig(c)
			return w.state(trial)
		}, "(13:64), the host's input devices"},
		{"uinput given", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["devices"] = []map[string]any{{"path": "/dev/uinput", "type": "c", "major": 10, "minor": 223}}
			w.writeConfig(c)
			return w.state(trial)
		}, "(10:223), a keyboard of its own (uinput)"},
		{"virtual consoles opened by a rule", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["resources"] = map[string]any{"devices": []map[string]any{{"allow": true, "type": "c", "major": 4, "access": "rw"}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "character devices 4:*, among them a virtual console"},
		{"every misc device opened by a rule", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["resources"] = map[string]any{"devices": []map[string]any{{"allow": true, "type": "c", "major": 10, "access": "rw"}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "character devices 10:*, among them a keyboard of its own (uhid)"},
		{"uhid given", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["devices"] = []map[string]any{{"path": "/dev/uhid", "type": "c", "major": 10, "minor": 239}}
			w.writeConfig(c)
			return w.state(trial)
		}, "(10:239), a keyboard of its own (uhid)"},
		{"uinput opened by a rule", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["resources"] = map[string]any{"devices": []map[string]any{{"allow": true, "type": "c", "major": 10, "minor": 223, "access": "rw"}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "character devices 10:223, among them a keyboard of its own (uinput)"},
		{"a host file under a device's name, in a user namespace", func(w *world) string {
			c := goodConfig()
			l := c["linux"].(map[string]any)
			l["namespaces"] = append(l["namespaces"].([]map[string]any), map[string]any{"type": "user"})
			l["devices"] = []map[string]any{{"path": w.file("secret"), "type": "c", "major": 1, "minor": 3}}
			w.writeConfig(c)
			return w.state(trial)
		}, "/secret (c 1:3) is something else on the host"},
		{"/proc/sys writable (--security-opt systempaths=unconfined)", func(w *world) string {
			// Root needs no capability to write kernel.core_pattern: a
			// "|/path" there is run by the kernel as the host's root.
			c := goodConfig()
			delete(c["linux"].(map[string]any), "readonlyPaths")
			delete(c["linux"].(map[string]any), "maskedPaths")
			w.writeConfig(c)
			return w.state(trial)
		}, "/proc/sys is writable"},
		{"/proc/sysrq-trigger writable", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["readonlyPaths"] = []string{"/proc/sys"}
			w.writeConfig(c)
			return w.state(trial)
		}, "/proc/sysrq-trigger is writable"},
		// Root writes an interrupt's affinity and a PCI device's
		// configuration space with no capability (runc 1.1.5 here: echo
		// to /proc/irq/default_smp_affinity took, and /proc/bus/pci/00/00.0
		// opened for writing, with runc's default capabilities).
		{"/proc/irq writable", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["readonlyPaths"] = []string{"/proc/bus", "/proc/fs", "/proc/sys", "/proc/sysrq-trigger"}
			w.writeConfig(c)
			return w.state(trial)
		}, "/proc/irq is writable"},
		{"/proc/bus writable", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["readonlyPaths"] = []string{"/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
			w.writeConfig(c)
			return w.state(trial)
		}, "/proc/bus is writable"},
		{"/proc/fs writable", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["readonlyPaths"] = []string{"/proc/bus", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
			w.writeConfig(c)
			return w.state(trial)
		}, "/proc/fs is writable"},
		{"a second proc mount, where readonlyPaths do not reach", func(w *world) string {
			w.setMount(map[string]any{"destination": "/p2/", "type": "proc", "source": "proc"})
			return w.state(trial)
		}, "/p2/sys is writable"},
		{"the host's disk mounted by the runtime", func(w *world) string {
			w.setMount(map[string]any{"destination": "/disk", "type": "ext4", "source": "/dev/vda1", "options": []string{"ro"}})
			return w.state(trial)
		}, `it mounts a file system of type "ext4" (/dev/vda1) on /disk`},
		{"tracefs mounted (kprobes need only root's uid)", func(w *world) string {
			w.setMount(map[string]any{"destination": "/t", "type": "tracefs", "source": "tracefs"})
			return w.state(trial)
		}, `type "tracefs"`},
		{"an overlay over the receipt key's directory", func(w *world) string {
			w.setMount(map[string]any{"destination": "/o", "type": "overlay", "source": "overlay",
				"options": []string{"lowerdir=/tmp:/var/lib/trialnet", "upperdir=/tmp/u", "workdir=/tmp/w"}})
			return w.state(trial)
		}, "its overlay on /o is made of /var/lib/trialnet"},
		{"an overlay layer by a relative path, through the image's link", func(w *world) string {
			// runc resolves it from the root file system (its init's
			// working directory), following the image's own links: with
			// runc 1.1.5, rootfs/x -> a host directory showed that
			// directory's files on /o. The bundle has no x.
			if err := os.MkdirAll(filepath.Join(w.bundle, "rootfs"), 0o755); err != nil {
				w.t.Fatal(err)
			}
			if err := os.Symlink("/var/lib/trialnet", filepath.Join(w.bundle, "rootfs", "x")); err != nil {
				w.t.Fatal(err)
			}
			w.setMount(map[string]any{"destination": "/o", "type": "overlay", "source": "overlay", "options": []string{"lowerdir=x:e"}})
			return w.state(trial)
		}, "its overlay on /o names x by a relative path"},
		// lowerdir+= (Linux 6.8 up, in mount(2)'s data too) names one
		// layer: runc 1.1.5 here, with rootfs/r2 a link climbing out to
		// /run, showed /run/trialnet's files on /o through
		// lowerdir+=r2/trialnet.
		{"an overlay layer by a relative path in lowerdir+", func(w *world) string {
			w.setMount(map[string]any{"destination": "/o", "type": "overlay", "source": "overlay", "options": []string{"lowerdir+=/usr", "lowerdir+=r2/trialnet"}})
			return w.state(trial)
		}, "its overlay on /o names r2/trialnet by a relative path"},
		{"an overlay data layer by a relative path", func(w *world) string {
			w.setMount(map[string]any{"destination": "/o", "type": "overlay", "source": "overlay", "options": []string{"lowerdir+=/usr", "datadir+=d"}})
			return w.state(trial)
		}, "its overlay on /o names d by a relative path"},
		// The kernel reads "\:" in lowerdir as a colon in one layer's path,
		// not a separator: here, with /tmp/l: a link to /run,
		// lowerdir=/usr:/tmp/l\:/trialnet showed /run/trialnet's files.
		{"an overlay layer whose path holds an escaped colon", func(w *world) string {
			dir := w.t.TempDir()
			if err := os.Symlink("/var/lib", filepath.Join(dir, "l:")); err != nil {
				w.t.Fatal(err)
			}
			w.setMount(map[string]any{"destination": "/o", "type": "overlay", "source": "overlay", "options": []string{"lowerdir=/usr:" + dir + `/l\:/trialnet`}})
			return w.state(trial)
		}, "/l:/trialnet, which holds or is inside /var/lib/trialnet"},
		{"an overlay layer with a last backslash, which the kernel drops", func(w *world) string {
			w.setMount(map[string]any{"destination": "/o", "type": "overlay", "source": "overlay", "options": []string{`lowerdir=/usr:/var/lib/trialnet\`}})
			return w.state(trial)
		}, "its overlay on /o is made of /var/lib/trialnet,"},
		{"sysfs writable", func(w *world) string {
			// /sys/kernel/uevent_helper: run by the kernel as the host's
			// root on the next uevent, written by root with no capability.
			w.setMount(map[string]any{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "rw"}})
			return w.state(trial)
		}, "it mounts sysfs writable on /sys"},
		{"part of the host's sysfs bound writable", func(w *world) string {
			// It holds no protected path, and is not of type sysfs.
			w.setMount(map[string]any{"destination": "/k", "type": "bind", "source": "/sys/kernel", "options": []string{"bind", "rw"}})
			return w.state(trial)
		}, "it binds /sys/kernel, of the host's sysfs, writable on /k"},
		{"a tmpfs entry that remounts the read-only sysfs rw", func(w *world) string {
			// runc 1.1.5: /sys, mounted ro, shows rw after this entry.
			c := goodConfig()
			c["mounts"] = append(c["mounts"].([]map[string]any),
				map[string]any{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"ro"}},
				map[string]any{"destination": "/sys", "type": "tmpfs", "source": "tmpfs", "options": []string{"remount", "rw"}})
			w.writeConfig(c)
			return w.state(trial)
		}, "it remounts what is on /sys (option remount)"},
		{"part of the host's sysfs bound ro, made rw by rrw", func(w *world) string {
			// runc 1.1.5: rrw clears the read-only flag after the bind.
			w.setMount(map[string]any{"destination": "/k", "type": "bind", "source": "/sys/kernel", "options": []string{"rbind", "ro", "rrw"}})
			return w.state(trial)
		}, "it binds /sys/kernel, of the host's sysfs, writable on /k"},
		{"sysfs ro, then rw", func(w *world) string {
			// runc and crun read options in order: the "rw" clears the "ro".
			w.setMount(map[string]any{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "ro", "rw"}})
			return w.state(trial)
		}, "it mounts sysfs writable on /sys"},
		{"cgroup ro, then rw", func(w *world) string {
			w.setMount(map[string]any{"destination": "/sys/fs/cgroup", "type": "cgroup2", "source": "cgroup2", "options": []string{"ro", "rw"}})
			return w.state(trial)
		}, "writable cgroup"},
		{"a second proc ro, then rw", func(w *world) string {
			w.setMount(map[string]any{"destination": "/p2", "type": "proc", "source": "proc", "options": []string{"ro", "nosuid", "rw"}})
			return w.state(trial)
		}, "/p2/sys is writable"},
		{"no seccomp profile (a runc bundle's default)", func(w *world) string {
			c := goodConfig()
			delete(c["linux"].(map[string]any), "seccomp")
			w.writeConfig(c)
			return w.state(trial)
		}, "its seccomp profile lets it use the kernel's keyrings (it has no seccomp profile (linux.seccomp))"},
		{"a profile that allows the key calls (podman's default)", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["seccomp"] = map[string]any{"defaultAction": "SCMP_ACT_ERRNO",
				"syscalls": []map[string]any{{"names": []string{"read", "keyctl", "add_key", "request_key"}, "action": "SCMP_ACT_ALLOW"}}}
			w.writeConfig(c)
			return w.state(trial)
		}, "keyctl: rule 0 (SCMP_ACT_ALLOW) lets it run; request_key: rule 0 (SCMP_ACT_ALLOW) lets it run): a container in a Trial must not reach the kernel's keyrings"},
		{"the refusal says what to do", func(w *world) string {
			c := goodConfig()
			c["linux"].(map[string]any)["seccomp"] = map[string]any{"defaultAction": "SCMP_ACT_ALLOW"}
			w.writeConfig(c)
			return w.state(trial)
		}, "--security-opt seccomp=" + DefaultSeccompProfile},
		// crun 1.8 loads this compiled filter (here one instruction:
		// return SECCOMP_RET_ALLOW) in place of linux.seccomp, which
		// refuses the key calls.
		{"crun's compiled filter in an annotation", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "run.oci.seccomp_bpf_data": "BgAAAAAA/38="}
			w.writeConfig(c)
			return w.state(trial)
		}, "its annotations run.oci.seccomp_bpf_data make crun run it with another seccomp filter"},
		{"a seccomp notification plugin for crun", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "run.oci.seccomp.plugins": "/x.so"}
			w.writeConfig(c)
			return w.state(trial)
		}, "its annotations run.oci.seccomp.plugins make crun"},
		// crun 1.8 runs the process under krun, in a microVM with a
		// kernel of its own, which the hook's judgement does not reach.
		{"crun's handler annotation", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "run.oci.handler": "krun"}
			w.writeConfig(c)
			return w.state(trial)
		}, "its annotation run.oci.handler: crun runs the container's process with another handler"},
		{"crun writing the hooks' output to a host file", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "run.oci.hooks.stdout": "/etc/cron.d/x"}
			w.writeConfig(c)
			return w.state(trial)
		}, "its annotation run.oci.hooks.stdout: crun, as the host's root, creates or appends to this host file"},
		{"a crun annotation in another case", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "Run.OCI.Keep_Original_Groups": "1"}
			w.writeConfig(c)
			return w.state(trial)
		}, "its annotation Run.OCI.Keep_Original_Groups: crun leaves the container's process the supplementary groups"},
		{"a runtime annotation's refusal says what to do", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "run.oci.hooks.stderr": "/etc/x"}
			w.writeConfig(c)
			return w.state(trial)
		}, "remove the annotation (the ones let through: run.oci.seccomp_fail_unknown_syscall, run.oci.timens_offset, and an empty run.oci.systemd.subgroup)"},
		{"a systemd subgroup below the scope", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "run.oci.systemd.subgroup": "../../x"}
			w.writeConfig(c)
			return w.state(trial)
		}, "its annotation run.oci.systemd.subgroup: crun moves the container's process into a cgroup below its systemd scope"},
		{"a run.oci annotation this trialnet does not know", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "run.oci.no_pivot": "1"}
			w.writeConfig(c)
			return w.state(trial)
		}, "its annotation run.oci.no_pivot: crun reads the run.oci annotations as orders, and this trialnet does not know this one"},
		{"a systemd unit property of the scope", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "org.systemd.property.BPFProgram": "connect4:/sys/fs/bpf/p"}
			w.writeConfig(c)
			return w.state(trial)
		}, "its annotation org.systemd.property.BPFProgram: crun's and runc's systemd cgroup managers"},
		{"runc's CRIU configuration", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "org.criu.config": "/tmp/criu.conf"}
			w.writeConfig(c)
			return w.state(trial)
		}, "its annotation org.criu.config: runc hands this host file to CRIU"},
		{"a wasm image for crun", func(w *world) string {
			c := goodConfig()
			c["annotations"] = map[string]string{AnnotationTrial: "eval-1", "module.wasm.image/variant": "compat"}
			w.writeConfig(c)
			return w.state(trial)
		}, "its annotation module.wasm.image/variant: crun runs the container's process in a WebAssembly runtime"},
		{"a profile under a key crun does not read", func(w *world) string {
			c := goodConfig()
			l := c["linux"].(map[string]any)
			l["SECCOMP"], l["seccomp"] = l["seccomp"], nil
			delete(l, "seccomp")
			w.writeConfig(c)
			return w.state(trial)
		}, `key linux.SECCOMP is spelt "seccomp"`},
		{"the host's mount namespace, joined by path", func(w *world) string {
			mnt := filepath.Join(w.proc, "4242", "ns", "mnt")
			_ = os.Remove(mnt)
			if err := os.Symlink(w.hostMnt, mnt); err != nil {
				w.t.Fatal(err)
			}
			c := goodConfig()
			l := c["linux"].(map[string]any)
			l["namespaces"] = append(l["namespaces"].([]map[string]any), map[string]any{"type": "mount", "path": "/proc/1/ns/mnt"})
			w.writeConfig(c)
			return w.state(trial)
		}, "it shares the runtime's (the host's) mnt namespace"},
		{"a PID namespace shared with a process outside the Trial", func(w *world) string {
			// podman --pid container:X, X a container of no Trial: root in
			// the Trial's container could ptrace X's processes, which
			// run in another network namespace.
			w.procNS("777", w.hostNet, filepath.Join(w.dir, "ns-ctr-pid"), w.file("c-777"), "/other")
			return w.state(trial)
		}, "its PID namespace holds process 777, which is not in the Trial"},
		{"the Docker daemon's socket bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/var/run/docker.sock", "type": "bind", "source": "/var/run/docker.sock", "options": []string{"rbind"}})
			return w.state(trial)
		}, "on /var/run/docker.sock"},
		{"containerd's socket bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/c.sock", "type": "bind", "source": "/run/containerd/containerd.sock", "options": []string{"rbind"}})
			return w.state(trial)
		}, "on /c.sock"},
		{"systemd's private socket bound in (systemd-run on the host)", func(w *world) string {
			w.setMount(map[string]any{"destination": "/s", "type": "bind", "source": "/run/systemd/private", "options": []string{"bind"}})
			return w.state(trial)
		}, "on /s, which holds or is inside /run/systemd"},
		{"root's systemd user manager bound in (systemd-run --user on the host)", func(w *world) string {
			w.setMount(map[string]any{"destination": "/u", "type": "bind", "source": "/run/user/0/systemd/private", "options": []string{"bind"}})
			return w.state(trial)
		}, "holds or is inside /run/user"},
		{"a user's session bus bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/b", "type": "bind", "source": "/var/run/user/1000/bus", "options": []string{"bind"}})
			return w.state(trial)
		}, "holds or is inside /var/run/user"},
		{"rootless Docker's socket bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/d.sock", "type": "bind", "source": "/run/user/1000/docker.sock", "options": []string{"bind"}})
			return w.state(trial)
		}, "on /d.sock"},
		{"snapd's socket bound in (a snap installed as root)", func(w *world) string {
			w.setMount(map[string]any{"destination": "/snapd.sock", "type": "bind", "source": "/run/snapd.socket", "options": []string{"bind"}})
			return w.state(trial)
		}, "on /snapd.sock"},
		{"libvirt's socket bound in (a guest defined with the host's disk)", func(w *world) string {
			w.setMount(map[string]any{"destination": "/lv", "type": "bind", "source": "/run/libvirt/libvirt-sock", "options": []string{"bind"}})
			return w.state(trial)
		}, "on /lv"},
		{"LXD's socket bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/lxd.sock", "type": "bind", "source": "/var/snap/lxd/common/lxd/unix.socket", "options": []string{"bind"}})
			return w.state(trial)
		}, "on /lxd.sock"},
		{"Incus's socket bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/incus.sock", "type": "bind", "source": "/var/lib/incus/unix.socket", "options": []string{"bind"}})
			return w.state(trial)
		}, "on /incus.sock"},
		// runc 1.1.5 here bound /run for the source /tmp/x/l/.. with l a
		// link to /run/lock: the kernel takes ".." after the link, a
		// lexical Clean before it.
		{"a bind's source that climbs out of a link (l/..)", func(w *world) string {
			l := filepath.Join(w.t.TempDir(), "l")
			if err := os.Symlink("/proc/sys", l); err != nil {
				w.t.Fatal(err)
			}
			w.setMount(map[string]any{"destination": "/p", "type": "bind", "source": l + "/..", "options": []string{"rbind", "ro"}})
			return w.state(trial)
		}, "which holds or is inside /proc"},
		{"an agent directory reached by l/..", func(w *world) string {
			sub := filepath.Join(w.dir, "pins", "sub")
			if err := os.Mkdir(sub, 0o755); err != nil {
				w.t.Fatal(err)
			}
			l := filepath.Join(w.t.TempDir(), "l")
			if err := os.Symlink(sub, l); err != nil {
				w.t.Fatal(err)
			}
			w.setMount(map[string]any{"destination": "/p", "type": "bind", "source": l + "/..", "options": []string{"rbind", "ro"}})
			return w.state(trial)
		}, "/pins (trialnet's own"},
		{"NRI's socket bound in (a plugin adjusts other containers)", func(w *world) string {
			w.setMount(map[string]any{"destination": "/nri", "type": "bind", "source": "/run/nri", "options": []string{"rbind"}})
			return w.state(trial)
		}, "on /nri"},
		{"the system D-Bus bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/bus", "type": "bind", "source": "/var/run/dbus/system_bus_socket", "options": []string{"bind"}})
			return w.state(trial)
		}, "on /bus"},
		{"k3s's containerd socket bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/k.sock", "type": "bind", "source": "/run/k3s/containerd/containerd.sock", "options": []string{"bind"}})
			return w.state(trial)
		}, "on /k.sock"},
		{"the cgroup tree bound in", func(w *world) string {
			w.setMount(map[string]any{"destination": "/cg", "type": "bind", "source": filepath.Join(w.mount, "trialnet"), "options": []string{"rbind", "ro"}})
			return w.state(trial)
		}, "on /cg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newContainerWorld(t)
			st := tc.setup(w)
			_, err := w.run(st)
			if r := (*Refusal)(nil); !errors.As(err, &r) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want refused with %q", err, tc.want)
			}
			if len(w.agent.added) != 0 {
				t.Errorf("the agent recorded a refused container: %+v", w.agent.added)
			}
		})
	}
}

// A container the agent does not record is refused: its Trial's layers
// would not say whose process boundary holds it.
func TestHookRefusesWhatTheAgentDoesNotRecord(t *testing.T) {
	w := newContainerWorld(t)
	w.agent.addErr = errors.New("disk full")
	_, err := w.run(w.state(map[string]string{AnnotationTrial: "eval-1"}))
	if err == nil || !strings.Contains(err.Error(), "did not record it: disk full") {
		t.Fatalf("got %v, want refused: not recorded", err)
	}
}

func (w *world) setNamespaces(types ...string) {
	c := goodConfig()
	var ns []map[string]any
	for _, typ := range types {
		ns = append(ns, map[string]any{"type": typ})
	}
	c["linux"].(map[string]any)["namespaces"] = ns
	w.writeConfig(c)
}

func (w *world) setCaps(set string, caps ...string) {
	c := goodConfig()
	c["process"].(map[string]any)["capabilities"].(map[string]any)[set] = caps
	w.writeConfig(c)
}

func (w *world) setMount(m map[string]any) {
	c := goodConfig()
	c["mounts"] = append(c["mounts"].([]map[string]any), m)
	w.writeConfig(c)
}

// profileWorld is a container annotated with a profile: its config and
// state name no Trial, and the fake agent's Trial is what ContainerTrial
// makes around it.
func profileWorld(t *testing.T, mutate func(map[string]any)) (*world, string) {
	w := newContainerWorld(t)
	c := goodConfig()
	c["annotations"] = map[string]string{AnnotationProfile: "claude"}
	if mutate != nil {
		mutate(c)
	}
	w.writeConfig(c)
	return w, w.state(map[string]string{AnnotationProfile: "claude"})
}

// A container annotated with a profile gets a Trial made around it, and
// is checked to be in it as one that joins a Trial is.
func TestHookMakesATrialForAProfile(t *testing.T) {
	w, st := profileWorld(t, nil)
	res, err := w.run(st)
	if err != nil || res.Trial != "eval-1" || !res.Made {
		t.Fatalf("a profile container: %v, %+v", err, res)
	}
	if len(w.agent.made) != 1 || w.agent.made[0].Profile != "claude" || w.agent.made[0].Container.PID != testPID || w.agent.made[0].Container.ID != "c1" {
		t.Errorf("asked the agent for %+v", w.agent.made)
	}
	if len(w.agent.added) != 0 || len(w.agent.destroyed) != 0 {
		t.Errorf("added %v, destroyed %v", w.agent.added, w.agent.destroyed)
	}
}

// A profile container gets every refusal of the config checks before
// the agent is asked for anything; one the agent's Trial does not hold
// is refused and its Trial destroyed.
func TestHookRefusesAProfileContainer(t *testing.T) {
	t.Run("privileged", func(t *testing.T) {
		w, st := profileWorld(t, func(c map[string]any) {
			c["process"].(map[string]any)["capabilities"].(map[string]any)["bounding"] = []string{"CAP_SYS_ADMIN"}
		})
		_, err := w.run(st)
		if err == nil || !strings.Contains(err.Error(), "CAP_SYS_ADMIN") || w.agent.calls != 0 {
			t.Errorf("got %v after %d agent calls, want refused before any", err, w.agent.calls)
		}
	})
	t.Run("host network", func(t *testing.T) {
		w, st := profileWorld(t, func(c map[string]any) {
			c["linux"].(map[string]any)["namespaces"] = []map[string]any{{"type": "pid"}, {"type": "mount"}, {"type": "cgroup"}}
		})
		_, err := w.run(st)
		if err == nil || !strings.Contains(err.Error(), "no network namespace of its own") || w.agent.calls != 0 {
			t.Errorf("got %v after %d agent calls, want refused before any", err, w.agent.calls)
		}
	})
	t.Run("outside the Trial made", func(t *testing.T) {
		w, st := profileWorld(t, nil)
		w.procNS("4242", w.file("ns-other"), w.file("p"), w.file("c"), "/trialnet/eval-1/libpod-c1")
		_, err := w.run(st)
		if err == nil || !strings.Contains(err.Error(), "network namespace is not the Trial's") {
			t.Fatalf("got %v, want refused", err)
		}
		if len(w.agent.destroyed) != 1 || w.agent.destroyed[0] != "eval-1" {
			t.Errorf("the Trial made for a refused container was not destroyed: %v", w.agent.destroyed)
		}
	})
	t.Run("agent refuses", func(t *testing.T) {
		w, st := profileWorld(t, nil)
		w.agent.err = errors.New("its network namespace has interfaces besides lo")
		_, err := w.run(st)
		if err == nil || !strings.Contains(err.Error(), "no Trial from profile claude could be made around it: its network namespace has interfaces besides lo") {
			t.Errorf("got %v", err)
		}
	})
}

// At poststop the hook tells the agent the container ended, for either
// claim; an unannotated container's poststop never reaches it.
func TestHookTellsTheAgentAContainerEnded(t *testing.T) {
	for _, ann := range []map[string]string{{AnnotationProfile: "claude"}, {AnnotationTrial: "eval-1"}, nil} {
		w := newContainerWorld(t)
		c := goodConfig()
		c["annotations"] = ann
		w.writeConfig(c)
		b, _ := json.Marshal(State{OCIVersion: "1.0.2", ID: "c1", Status: "stopped", Bundle: w.bundle, Annotations: ann})
		res, err := w.run(string(b))
		switch {
		case err != nil:
			t.Errorf("%v: %v", ann, err)
		case ann == nil && w.agent.calls != 0:
			t.Errorf("an unannotated container's end reached the agent")
		case ann != nil && (len(w.agent.ended) != 1 || w.agent.ended[0] != "c1" || res.Ended == nil):
			t.Errorf("%v: ended %v, result %+v", ann, w.agent.ended, res)
		}
	}
}

// The agent's own directories, which only its answer names, are checked
// against the config's mounts too: an overlay made of one shows in the
// kernel's view as an overlay alone, and a directory named through a
// symlink is compared resolved.
func TestHookRefusesAgentDirsInTheConfig(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(state, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, named string
		mount       map[string]any
	}{
		{"overlay upperdir", state, map[string]any{"destination": "/mnt", "type": "overlay", "source": "overlay",
			"options": []string{"lowerdir=/usr", "upperdir=" + state + "/upper", "workdir=" + state + "/work"}}},
		{"overlay lowerdir", state, map[string]any{"destination": "/mnt", "type": "overlay", "source": "overlay",
			"options": []string{"lowerdir=" + state}}},
		{"bind, the dir named through a symlink", link, map[string]any{"destination": "/mnt", "type": "bind", "source": state,
			"options": []string{"rbind", "ro"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newContainerWorld(t)
			w.info.AgentDirs = []string{tc.named}
			w.agent.trials["eval-1"] = w.info
			w.setMount(tc.mount)
			_, err := w.run(w.state(map[string]string{AnnotationTrial: "eval-1"}))
			if err == nil || !strings.Contains(err.Error(), "inside "+state) {
				t.Fatalf("got %v, want refused naming %s", err, state)
			}
			if len(w.agent.added) != 0 {
				t.Errorf("the agent recorded %v", w.agent.added)
			}
		})
	}
}

// runc runs prestart and createRuntime hooks for a restore from a
// checkpoint with the status stopped and the restored process's pid. Read
// as a poststop, the container would pass unjudged: a claimed one is
// refused, an unclaimed one judged as at createRuntime.
func TestHookRefusesARestore(t *testing.T) {
	restore := func(w *world, ann map[string]string, pid int) string {
		b, _ := json.Marshal(State{OCIVersion: "1.0.2", ID: "c1", Status: "stopped", Pid: pid, Bundle: w.bundle, Annotations: ann})
		return string(b)
	}
	for _, ann := range []map[string]string{{AnnotationTrial: "eval-1"}, {AnnotationProfile: "claude"}} {
		w := newContainerWorld(t)
		c := goodConfig()
		c["annotations"] = ann
		w.writeConfig(c)
		_, err := w.run(restore(w, ann, testPID))
		if err == nil || !strings.Contains(err.Error(), "restoring it from a checkpoint") {
			t.Errorf("%v: a restore: %v", ann, err)
		}
		if w.agent.calls != 0 {
			t.Errorf("%v: a restore reached the agent %d times (ended %v)", ann, w.agent.calls, w.agent.ended)
		}
		// A poststop whose process is gone is one still.
		if _, err := w.run(restore(w, ann, testPID+1)); err != nil || len(w.agent.ended) != 1 {
			t.Errorf("%v: a poststop with a pid that is gone: %v, ended %v", ann, err, w.agent.ended)
		}
	}
	// Unclaimed, its process in a Trial's cgroup.
	w := newContainerWorld(t)
	c := goodConfig()
	delete(c, "annotations")
	w.writeConfig(c)
	if _, err := w.run(restore(w, nil, testPID)); err == nil || !strings.Contains(err.Error(), "claims no Trial but its process is in Trial eval-1") {
		t.Errorf("an unclaimed restore in a Trial: %v", err)
	}
}

// A claimed container is judged before its first instruction: a hook
// run at poststart (crun, and runc's main branch: status running) comes
// after its process ran unjudged, and refuses it; crun's createRuntime
// says created, runc's creating.
func TestHookRefusesARunningContainer(t *testing.T) {
	w := newContainerWorld(t)
	ann := map[string]string{AnnotationTrial: "eval-1"}
	for status, ok := range map[string]bool{"creating": true, "created": true, "running": false} {
		b, _ := json.Marshal(State{OCIVersion: "1.0.2", ID: "c1", Status: status, Pid: testPID, Bundle: w.bundle, Annotations: ann})
		_, err := w.run(string(b))
		if ok != (err == nil) || err != nil && !strings.Contains(err.Error(), "must run at the createRuntime stage") {
			t.Errorf("status %s: %v", status, err)
		}
	}
}

// youki keeps the init's pid in the state it gives a poststop, and runs
// it at once after it kills a created container (youki delete): the
// process is then a zombie its parent has not reaped, or still dying of
// the SIGKILL (PF_EXITING, 0x4, in its flags), which ended, and no
// restore's. One alive and not exiting is still read as a restore.
func TestHookEndsAContainerWhoseProcessIsAZombie(t *testing.T) {
	ann := map[string]string{AnnotationTrial: "eval-1"}
	for _, c := range []struct {
		stat  string
		ended bool
	}{
		{"4242 (sleep (1) x) Z 1 4242 4242 0 -1 4194564 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0\n", true},
		{"4242 (sleep (1) x) D 1 4242 4242 0 -1 4194564 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0\n", true},
		{"4242 (sleep (1) x) S 1 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0\n", false},
	} {
		w := newContainerWorld(t)
		if err := os.WriteFile(filepath.Join(w.proc, "4242", "stat"), []byte(c.stat), 0o644); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(State{OCIVersion: "1.0.2", ID: "c1", Status: "stopped", Pid: testPID, Bundle: w.bundle, Annotations: ann})
		_, err := w.run(string(b))
		if c.ended != (err == nil && len(w.agent.ended) == 1) {
			t.Errorf("a poststop whose process's stat is %q: %v, ended %v", c.stat, err, w.agent.ended)
		}
	}
	// The kernel's stat of a zombie, read as the hook reads it: a child
	// that exited and is not waited for.
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Wait() }()
	dir := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid))
	for i := 0; i < 500 && !exited(dir); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if !exited(dir) {
		t.Errorf("%s: a child that exited is not read as a zombie", dir)
	}
	if exited("/proc/self") {
		t.Error("this process is read as exited")
	}
}
