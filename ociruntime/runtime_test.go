//go:build linux

package ociruntime

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/ocihook"
)

func TestParseArgs(t *testing.T) {
	const root = "--root"
	for _, tc := range []struct {
		name    string
		args    []string
		command string
		bundle  string
		id      string
		log     string
		systemd int
		err     string
	}{
		{"containerd's create", []string{root, "/r", "--log", "/b/log.json", "--log-format", "json", "create", "--bundle", "/b", "--pid-file", "/b/init.pid", "ctr"},
			"create", "/b", "ctr", "/b/log.json", 0, ""},
		{"systemd driver", []string{"--root=/r", "--systemd-cgroup", "create", "-b=/b", "ctr"}, "create", "/b", "ctr", "", 1, ""},
		{"options after the id", []string{"create", "ctr", "--bundle", "/b", "--no-pivot"}, "create", "/b", "ctr", "", 0, ""},
		{"single dash", []string{"-root", "/r", "run", "-bundle", "/b", "-d", "ctr"}, "run", "/b", "ctr", "", 0, ""},
		{"the last bundle wins", []string{"create", "-b", "/a", "--bundle", "/b", "ctr"}, "create", "/b", "ctr", "", 0, ""},
		{"after --", []string{"create", "--bundle", "/b", "--", "-ctr"}, "create", "/b", "-ctr", "", 0, ""},
		{"no bundle", []string{"create", "ctr"}, "create", "", "ctr", "", 0, ""},
		{"state passes", []string{root, "/r", "state", "--weird", "ctr"}, "state", "", "", "", 0, ""},
		{"exec reads its container", []string{root, "/r", "exec", "--process", "/p.json", "ctr"}, "exec", "", "ctr", "", 0, ""},
		{"unknown exec option", []string{"exec", "--frob", "ctr"}, "", "", "", "", 0, "not one this wrapper knows"},
		{"version", []string{"--version"}, "", "", "", "", 0, ""},
		{"unknown global", []string{"--frob", "create", "ctr"}, "", "", "", "", 0, "not one this wrapper knows"},
		{"unknown create option", []string{"create", "--frob", "ctr"}, "", "", "", "", 0, "not one this wrapper knows"},
		{"triple dash", []string{"---root", "/r", "create", "ctr"}, "", "", "", "", 0, "malformed"},
		{"no id", []string{"create", "--bundle", "/b"}, "", "", "", "", 0, "no container id"},
		{"no value", []string{"create", "ctr", "--bundle"}, "", "", "", "", 0, "has no value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := parseArgs(tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if inv.command != tc.command || inv.bundle != tc.bundle || inv.id != tc.id || inv.log != tc.log || len(inv.systemd) != tc.systemd {
				t.Errorf("got %+v", inv)
			}
			if tc.systemd > 0 && slices.Contains(inv.withoutSystemd(), "--systemd-cgroup") {
				t.Errorf("--systemd-cgroup stays: %q", inv.withoutSystemd())
			}
		})
	}
}

type fakeAgent struct {
	info     client.TrialInfo
	err      error
	asks     []string
	prepares []client.ContainerPrepare
	// bundle is the bundle's directory, whose config.json the fake reads
	// at prepare: the wrapper must have written it by then.
	bundle string
	seen   string
}

func (f *fakeAgent) PrepareContainer(_ context.Context, req client.ContainerPrepare) (client.PreparedContainer, error) {
	f.prepares = append(f.prepares, req)
	if f.bundle != "" {
		b, _ := os.ReadFile(filepath.Join(f.bundle, "config.json"))
		f.seen = string(b)
	}
	return client.PreparedContainer{}, f.err
}

func (f *fakeAgent) Get(_ context.Context, id string) (client.TrialInfo, error) {
	f.asks = append(f.asks, id)
	return f.info, f.err
}

// dockerBundle is a bundle holding the config.json Docker 20.10 wrote
// for docker run --network none --cgroup-parent trialnet-eval-42.slice,
// with cgroupsPath and edit applied.
func dockerBundle(t *testing.T, cgroupsPath string, edit func(map[string]any)) string {
	t.Helper()
	b, err := os.ReadFile("testdata/docker-20.10.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	doc["linux"].(map[string]any)["cgroupsPath"] = cgroupsPath
	if edit != nil {
		edit(doc)
	}
	dir := t.TempDir()
	b, _ = json.Marshal(doc)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func readDoc(t *testing.T, dir string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

const ctr = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func newWrapper(a *fakeAgent) *Wrapper {
	return &Wrapper{Agent: func() Agent { return a }, Hook: "/usr/bin/trialnet", HookArgs: HookArgs("/run/t.sock"), CgroupMount: "/sys/fs/cgroup"}
}

var eval42 = client.TrialInfo{Netns: "/run/trialnet/netns/eval-42", Cgroup: "/sys/fs/cgroup/trialnet/eval-42", ProxyURL: "http://127.0.0.1:3128"}

// Both cgroup drivers' spellings of --cgroup-parent trialnet-eval-42.slice
// put the container in the Trial: its new network namespace becomes the
// Trial's, its cgroup one under the Trial's (and runc leaves systemd's
// manager), Docker's network setup hook goes, the hook is added last,
// the annotation and the proxy's variables are the Trial's; everything
// else in the bundle stays.
func TestPrepareSlice(t *testing.T) {
	for _, tc := range []struct{ driver, path string }{
		{"cgroupfs", "trialnet-eval-42.slice/" + ctr},
		{"systemd", "trialnet-eval-42.slice:docker:" + ctr},
	} {
		t.Run(tc.driver, func(t *testing.T) {
			dir := dockerBundle(t, tc.path, nil)
			before := readDoc(t, dir)
			a := &fakeAgent{info: eval42}
			args := []string{"--root", "/r", "--systemd-cgroup", "create", "--bundle", dir, ctr}
			out, err := newWrapper(a).Prepare(context.Background(), args)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(out, []string{"--root", "/r", "create", "--bundle", dir, ctr}) || !slices.Equal(a.asks, []string{"eval-42"}) {
				t.Errorf("runc args %q, agent asked %q", out, a.asks)
			}
			doc := readDoc(t, dir)
			l := doc["linux"].(map[string]any)
			if l["cgroupsPath"] != "/trialnet/eval-42/"+ctr {
				t.Errorf("cgroupsPath %v", l["cgroupsPath"])
			}
			nets := 0
			for _, n := range l["namespaces"].([]any) {
				if ns := n.(map[string]any); ns["type"] == "network" {
					nets++
					if ns["path"] != eval42.Netns {
						t.Errorf("network namespace %v", ns)
					}
				}
			}
			hooks := doc["hooks"].(map[string]any)
			if nets != 1 || len(hooks["prestart"].([]any)) != 0 {
				t.Errorf("%d network namespaces; prestart hooks %v (Docker's setkey must go)", nets, hooks["prestart"])
			}
			for _, stage := range []string{"createRuntime", "poststop"} {
				hs, _ := hooks[stage].([]any)
				if len(hs) == 0 || hs[len(hs)-1].(map[string]any)["path"] != "/usr/bin/trialnet" || len(hs[len(hs)-1].(map[string]any)["args"].([]any)) != 4 {
					t.Errorf("%s %v: want the hook last (a joined container's end moves it to the Trial's ended ones)", stage, hs)
				}
			}
			if doc["annotations"].(map[string]any)[ocihook.AnnotationTrial] != "eval-42" {
				t.Errorf("annotations %v", doc["annotations"])
			}
			env := doc["process"].(map[string]any)["env"].([]any)
			if slices.Contains(env, any("HTTPS_PROXY=http://elsewhere:8080")) || !slices.Contains(env, any("HTTPS_PROXY=http://127.0.0.1:3128")) ||
				!slices.Contains(env, any("no_proxy=127.0.0.1,localhost,::1")) || !slices.Contains(env, any("HOSTNAME=0123456789ab")) {
				t.Errorf("env %v", env)
			}
			for _, k := range []string{"mounts", "root", "hostname", "ociVersion"} {
				if b1, _ := json.Marshal(before[k]); string(b1) != jsonOf(doc[k]) {
					t.Errorf("%s changed", k)
				}
			}
			if b1, _ := json.Marshal(before["process"].(map[string]any)["capabilities"]); string(b1) != jsonOf(doc["process"].(map[string]any)["capabilities"]) {
				t.Error("capabilities changed")
			}
			// Docker's rule for /dev/console (c 5:1 rwm) goes, which the
			// hook refuses (a node of 5:1 opens the host's console); the
			// other rules stay.
			rules := before["linux"].(map[string]any)["resources"].(map[string]any)["devices"].([]any)
			rules = slices.DeleteFunc(rules, func(r any) bool { m := r.(map[string]any); return m["major"] == 5.0 && m["minor"] == 1.0 })
			if got := jsonOf(l["resources"].(map[string]any)["devices"]); got != jsonOf(rules) || len(rules) != 7 {
				t.Errorf("device rules %s, want Docker's %d without the console's: %s", got, len(rules), jsonOf(rules))
			}
			if fi, err := os.Stat(filepath.Join(dir, "config.json")); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("config.json mode %v, %v", fi.Mode(), err)
			}
		})
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// What the wrapper leaves to the hook: a host network (no namespace to
// point at the Trial's), a namespace joined by path, capabilities. The
// hook is in the bundle to refuse them.
func TestPrepareLeavesTheVerdictToTheHook(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(map[string]any)
		want string // the network namespace's path afterwards; "-": none
	}{
		{"host network", func(d map[string]any) {
			l := d["linux"].(map[string]any)
			l["namespaces"] = slices.DeleteFunc(l["namespaces"].([]any), func(n any) bool { return n.(map[string]any)["type"] == "network" })
		}, "-"},
		{"another container's network", func(d map[string]any) {
			for _, n := range d["linux"].(map[string]any)["namespaces"].([]any) {
				if ns := n.(map[string]any); ns["type"] == "network" {
					ns["path"] = "/proc/99/ns/net"
				}
			}
		}, "/proc/99/ns/net"},
		{"privileged", func(d map[string]any) {
			d["process"].(map[string]any)["capabilities"].(map[string]any)["bounding"] = []any{"CAP_SYS_ADMIN", "CAP_NET_ADMIN"}
		}, eval42.Netns},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := dockerBundle(t, "trialnet-eval-42.slice/"+ctr, tc.edit)
			if _, err := newWrapper(&fakeAgent{info: eval42}).Prepare(context.Background(), []string{"create", "-b", dir, ctr}); err != nil {
				t.Fatal(err)
			}
			doc := readDoc(t, dir)
			got := "-"
			for _, n := range doc["linux"].(map[string]any)["namespaces"].([]any) {
				if ns := n.(map[string]any); ns["type"] == "network" {
					got, _ = ns["path"].(string)
				}
			}
			cr, _ := doc["hooks"].(map[string]any)["createRuntime"].([]any)
			if got != tc.want || len(cr) != 1 {
				t.Errorf("network namespace %q (want %q), createRuntime hooks %v", got, tc.want, cr)
			}
		})
	}
}

// A container that names no Trial but shares a Trial container's PID or
// IPC namespace (docker run --pid container:X), or whose cgroup is in a
// Trial's, is refused without a word to the agent: no hook runs for it.
func TestPrepareRefusesAnUnclaimedContainerInATrial(t *testing.T) {
	proc := t.TempDir()
	for pid, cg := range map[string]string{"500": "/trialnet/eval-42/" + ctr, "600": "/system.slice/docker-x.scope"} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte("0::"+cg+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	joins := func(typ, pid string) func(map[string]any) {
		return func(d map[string]any) {
			for _, n := range d["linux"].(map[string]any)["namespaces"].([]any) {
				if ns := n.(map[string]any); ns["type"] == typ {
					ns["path"] = filepath.Join(proc, pid, "ns", typ)
				}
			}
		}
	}
	for _, tc := range []struct {
		name, path string
		edit       func(map[string]any)
		want       string
	}{
		{"--pid container:X of a Trial's", "/docker/" + ctr, joins("pid", "500"), "joins the pid namespace of process 500"},
		{"--ipc container:X of a Trial's", "/docker/" + ctr, joins("ipc", "500"), "joins the ipc namespace of process 500"},
		{"--cgroup-parent in a Trial's (cgroupfs)", "/trialnet/eval-42/" + ctr, nil, "in Trial eval-42's cgroup"},
		{"--pid container:X of another container", "/docker/" + ctr, joins("pid", "600"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := dockerBundle(t, tc.path, tc.edit)
			a := &fakeAgent{err: errors.New("no agent")}
			w := newWrapper(a)
			w.Trials = ocihook.Places{Proc: proc}
			_, err := w.Prepare(context.Background(), []string{"create", "-b", dir, ctr})
			if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) || len(a.asks) != 0 {
				t.Errorf("err %v, want %q; agent asked %q", err, tc.want, a.asks)
			}
		})
	}
}

// A container that names no Trial reaches runc as it came, its bundle
// untouched and the agent not asked; one that names a Trial the agent
// does not know, or whose bundle cannot be read, is refused.
func TestPrepareUnclaimedAndRefused(t *testing.T) {
	dir := dockerBundle(t, "/docker/"+ctr, nil)
	before, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	a := &fakeAgent{err: errors.New("no agent")}
	args := []string{"--root", "/r", "--systemd-cgroup", "create", "--bundle", dir, ctr}
	out, err := newWrapper(a).Prepare(context.Background(), args)
	after, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil || !slices.Equal(out, args) || len(a.asks) != 0 || string(before) != string(after) {
		t.Errorf("unclaimed: %q, %v, asked %q, changed %v", out, err, a.asks, string(before) != string(after))
	}
	for _, tc := range []struct {
		name, path string
		edit       func(map[string]any)
		want       string
	}{
		{"unknown Trial", "trialnet-eval-42.slice/" + ctr, nil, "cannot look Trial \"eval-42\" up: no agent"},
		{"bad id", "trialnet-Eval.42.slice/" + ctr, nil, "names no valid Trial id"},
		// A parent that reads as a claim but is not one: passed on
		// unclaimed, it ran on its Docker network, outside any Trial.
		{"below a Trial's slice", "/trialnet-eval-42.slice/agents/" + ctr, nil, "looks like a Trial's cgroup parent but is not one"},
		{"above a Trial's slice", "/evals/trialnet-eval-42.slice/" + ctr, nil, "looks like a Trial's cgroup parent but is not one"},
		{"another case", "/Trialnet-eval-42.slice/" + ctr, nil, "looks like a Trial's cgroup parent but is not one"},
		{"the slice as the container's own", "/trialnet-eval-42.slice", nil, "looks like a Trial's cgroup parent but is not one"},
		{"systemd, another case", "Trialnet-eval-42.slice:docker:" + ctr, nil, "looks like a Trial's cgroup parent but is not one"},
		{"two Trials", "trialnet-eval-42.slice/" + ctr, func(d map[string]any) {
			d["annotations"] = map[string]any{ocihook.AnnotationTrial: "other"}
		}, "name different Trials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := dockerBundle(t, tc.path, tc.edit)
			if _, err := newWrapper(a).Prepare(context.Background(), []string{"create", "-b", dir, ctr}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
	dup := t.TempDir()
	if err := os.WriteFile(filepath.Join(dup, "config.json"), []byte(`{"linux": {"cgroupsPath": "/docker/x", "CgroupsPath": "trialnet-eval-42.slice/x"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newWrapper(a).Prepare(context.Background(), []string{"create", "-b", dup, "x"}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a config that reads two ways: %v", err)
	}
	if _, err := newWrapper(a).Prepare(context.Background(), []string{"create", "-b", t.TempDir(), "x"}); err == nil {
		t.Error("a bundle without config.json passed")
	}
}

// An annotation under trialnet.io/ the wrapper does not act on (a
// profile, a key the hook refuses) still gets the hook, which decides;
// a profile alone gets it at createRuntime only, as the hooks.d entries
// run it (the agent ends its Trial).
func TestPrepareProfileGetsTheHook(t *testing.T) {
	for _, tc := range []struct {
		key      string
		poststop int
	}{{ocihook.AnnotationProfile, 0}, {"trialnet.io/Profile", 1}} {
		dir := dockerBundle(t, "/docker/"+ctr, func(d map[string]any) {
			d["annotations"] = map[string]any{tc.key: "claude"}
		})
		a := &fakeAgent{}
		if _, err := newWrapper(a).Prepare(context.Background(), []string{"create", "-b", dir, ctr}); err != nil {
			t.Fatal(err)
		}
		doc := readDoc(t, dir)
		hooks := doc["hooks"].(map[string]any)
		cr, _ := hooks["createRuntime"].([]any)
		ps, _ := hooks["poststop"].([]any)
		if len(cr) != 1 || len(ps) != tc.poststop || len(a.asks) != 0 || doc["linux"].(map[string]any)["cgroupsPath"] != "/docker/"+ctr {
			t.Errorf("%s: hooks %v, asked %q, cgroupsPath %v", tc.key, hooks, a.asks, doc["linux"].(map[string]any)["cgroupsPath"])
		}
	}
}

// A container annotated with a profile gets the hook, which decides,
// and is prepared with the agent last, after its bundle is written: its
// id, profile and cgroups path as runc reads them. An agent that cannot
// prepare it refuses the command. An annotation the wrapper does not
// know (a different spelling of the key) gets the hook alone.
func TestPrepareProfile(t *testing.T) {
	dir := dockerBundle(t, "/trialnet/"+ctr, func(d map[string]any) {
		d["annotations"] = map[string]any{"trialnet.io/profile": "claude"}
	})
	a := &fakeAgent{bundle: dir}
	if _, err := newWrapper(a).Prepare(context.Background(), []string{"create", "-b", dir, ctr}); err != nil {
		t.Fatal(err)
	}
	doc := readDoc(t, dir)
	want := client.ContainerPrepare{Container: ctr, Profile: "claude", CgroupsPath: "/trialnet/" + ctr}
	if cr, _ := doc["hooks"].(map[string]any)["createRuntime"].([]any); len(cr) != 1 || len(a.asks) != 0 || len(a.prepares) != 1 || a.prepares[0] != want {
		t.Errorf("hooks %v, asked %q, prepared %+v (want %+v)", cr, a.asks, a.prepares, want)
	}
	if !strings.Contains(a.seen, `"createRuntime"`) {
		t.Errorf("prepared before the bundle was written: %s", a.seen)
	}

	dir = dockerBundle(t, "/trialnet/"+ctr, func(d map[string]any) {
		d["annotations"] = map[string]any{"trialnet.io/profile": "claude"}
	})
	a = &fakeAgent{err: errors.New("no such profile")}
	if _, err := newWrapper(a).Prepare(context.Background(), []string{"create", "-b", dir, ctr}); err == nil || !strings.Contains(err.Error(), "could not prepare") {
		t.Errorf("an agent that refused to prepare: %v", err)
	}

	dir = dockerBundle(t, "/docker/"+ctr, func(d map[string]any) {
		d["annotations"] = map[string]any{"trialnet.io/Profile": "claude"}
	})
	a = &fakeAgent{}
	if _, err := newWrapper(a).Prepare(context.Background(), []string{"create", "-b", dir, ctr}); err != nil {
		t.Fatal(err)
	}
	if cr, _ := readDoc(t, dir)["hooks"].(map[string]any)["createRuntime"].([]any); len(cr) != 1 || len(a.prepares) != 0 {
		t.Errorf("hooks %v, prepared %+v", cr, a.prepares)
	}
}

func TestLogRefusal(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log.json")
	LogRefusal([]string{"--log", log, "--log-format", "json", "create", "--frob", "x"}, errors.New("no"))
	b, err := os.ReadFile(log)
	var line struct{ Level, Msg string }
	if err != nil || json.Unmarshal(b, &line) != nil || line.Level != "error" || line.Msg != "trialnet oci-runtime: no" {
		t.Errorf("log %q, %v", b, err)
	}
}

// A claimed container's profile refuses the key calls once the wrapper
// has rewritten it: Docker's is kept as it was with one rule more (and a
// rule that let a key call run no longer names it) beside the vsock
// refusal (TestPrepareRefusesVsock), a container run with
// seccomp=unconfined gets the least profile that refuses them, and a
// profile that is not an object refuses the command.
func TestPrepareRefusesTheKeyCalls(t *testing.T) {
	keyRule := `{"action":"SCMP_ACT_ERRNO","errnoRet":38,"names":["add_key","keyctl","request_key"]}`
	for _, tc := range []struct {
		name  string
		edit  func(map[string]any)
		check func(t *testing.T, before, after map[string]any)
	}{
		{"Docker's default", nil, func(t *testing.T, before, after map[string]any) {
			rules := after["syscalls"].([]any)
			if jsonOf(rules[len(rules)-1]) != keyRule {
				t.Errorf("last rule %s, want %s", jsonOf(rules[len(rules)-1]), keyRule)
			}
			after["syscalls"] = rules[:len(rules)-1]
			if err := ocihook.RefuseVsock(before); err != nil {
				t.Fatal(err)
			}
			if jsonOf(before) != jsonOf(after) {
				t.Errorf("Docker's profile changed beyond the added rule and the vsock refusal:\n%s\n%s", jsonOf(before), jsonOf(after))
			}
		}},
		{"a rule letting keyctl run", func(d map[string]any) {
			sc := d["linux"].(map[string]any)["seccomp"].(map[string]any)
			sc["syscalls"] = append(sc["syscalls"].([]any), map[string]any{"names": []any{"keyctl", "getpid"}, "action": "SCMP_ACT_ALLOW"},
				map[string]any{"names": []any{"add_key"}, "action": "SCMP_ACT_LOG"})
		}, func(t *testing.T, _, after map[string]any) {
			rules := after["syscalls"].([]any)
			if !slices.ContainsFunc(rules, func(r any) bool { return jsonOf(r) == `{"action":"SCMP_ACT_ALLOW","names":["getpid"]}` }) {
				t.Errorf("the allowing rule is not left naming getpid alone: %s", jsonOf(rules))
			}
			for _, r := range rules[:len(rules)-1] {
				for _, n := range r.(map[string]any)["names"].([]any) {
					if slices.Contains(ocihook.KeyCalls, n.(string)) {
						t.Errorf("a rule still names %s: %s", n, jsonOf(r))
					}
				}
			}
		}},
		{"seccomp=unconfined", func(d map[string]any) { delete(d["linux"].(map[string]any), "seccomp") },
			func(t *testing.T, _, after map[string]any) {
				if after["defaultAction"] != "SCMP_ACT_ALLOW" || jsonOf(after["syscalls"]) != jsonOf(ocihook.ContainerProfile(runtime.GOARCH)["syscalls"]) {
					t.Errorf("profile %s", jsonOf(after))
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := dockerBundle(t, "trialnet-eval-42.slice/"+ctr, tc.edit)
			before, _ := readDoc(t, dir)["linux"].(map[string]any)["seccomp"].(map[string]any)
			if _, err := newWrapper(&fakeAgent{info: eval42}).Prepare(context.Background(), []string{"create", "-b", dir, ctr}); err != nil {
				t.Fatal(err)
			}
			tc.check(t, before, readDoc(t, dir)["linux"].(map[string]any)["seccomp"].(map[string]any))
		})
	}
	dir := dockerBundle(t, "trialnet-eval-42.slice/"+ctr, func(d map[string]any) { d["linux"].(map[string]any)["seccomp"] = "unconfined" })
	if _, err := newWrapper(&fakeAgent{info: eval42}).Prepare(context.Background(), []string{"create", "-b", dir, ctr}); err == nil || !strings.Contains(err.Error(), "linux.seccomp is not an object") {
		t.Errorf("a profile that is not an object: %v", err)
	}
}

// runc runs no hook for exec: docker exec --privileged (or --cap-add)
// into a Trial's container would give a process in the Trial the
// capabilities the hook refused at its start.
func TestPrepareRefusesAPrivilegedExec(t *testing.T) {
	root := t.TempDir()
	state := func(id string, labels ...string) {
		if err := os.MkdirAll(filepath.Join(root, id), 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(map[string]any{"id": id, "config": map[string]any{"labels": labels}})
		if err := os.WriteFile(filepath.Join(root, id, "state.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bundle := execBundle(t, "HTTPS_PROXY=http://127.0.0.1:3128")
	state("in", "trialnet.io/trial=eval-42", "bundle="+bundle)
	state("out", "bundle=/b2")
	state("in-case", "Trialnet.IO/trial=eval-42", "bundle="+bundle) // a claim in the hook's reading
	process := func(caps ...string) string {
		p := filepath.Join(t.TempDir(), "process.json")
		b, _ := json.Marshal(map[string]any{"args": []string{"sh"}, "capabilities": map[string]any{"bounding": []string{"CAP_KILL"}, "ambient": caps}})
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	w := newWrapper(&fakeAgent{info: eval42})
	for _, tc := range []struct {
		args []string
		want string // "": let through
	}{
		{[]string{"--root", root, "exec", "--process", process("CAP_SYS_ADMIN"), "--detach", "in"}, "CAP_SYS_ADMIN"},
		{[]string{"--root", root, "exec", "-c", "net_admin", "in", "sh"}, "CAP_NET_ADMIN"},
		{[]string{"--root", root, "exec", "--process=" + process("CAP_KILL"), "in"}, ""},
		{[]string{"--root", root, "exec", "--process", process("CAP_SYS_ADMIN"), "out"}, ""},
		{[]string{"--root", root, "exec", "--process", process("CAP_SYS_ADMIN"), "in-case"}, "CAP_SYS_ADMIN"},
		{[]string{"--root", root, "exec", "gone", "sh"}, "cannot tell whether container gone is in a Trial"},
	} {
		_, err := w.Prepare(context.Background(), tc.args)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: refused: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: got %v, want refused with %q", tc.args, err, tc.want)
		}
	}
}

// execBundle is a container's bundle whose process has env.
func execBundle(t *testing.T, env ...string) string {
	dir := t.TempDir()
	b, _ := json.Marshal(map[string]any{"process": map[string]any{"args": []string{"sleep"}, "env": env}})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Docker starts an exec with the environment it keeps for the
// container, not the bundle's: the proxy variables the wrapper replaced
// at create (an operator's proxy, its credentials in it) came back in
// every docker exec, where the Trial reads them. An exec into a
// Trial's container gets the container's own, the Trial's; any other
// keeps what it was given.
func TestPrepareGivesAnExecTheTrialsProxy(t *testing.T) {
	root := t.TempDir()
	trialEnv := []string{"HTTPS_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128", "NO_PROXY=127.0.0.1,localhost,::1"}
	bundle := execBundle(t, append([]string{"PATH=/bin", "HOME=/root"}, trialEnv...)...)
	for id, labels := range map[string][]string{"in": {"trialnet.io/trial=eval-42", "bundle=" + bundle}, "out": {"bundle=" + bundle},
		"lost": {"trialnet.io/trial=eval-42"}} {
		if err := os.MkdirAll(filepath.Join(root, id), 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(map[string]any{"id": id, "config": map[string]any{"labels": labels}})
		if err := os.WriteFile(filepath.Join(root, id, "state.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	given := []any{"PATH=/usr/bin", "HTTPS_PROXY=http://ops:secret@proxy.corp:3128", "ALL_PROXY=socks5://proxy.corp:1080", "TERM=xterm"}
	process := func() string {
		p := filepath.Join(t.TempDir(), "process.json")
		b, _ := json.Marshal(map[string]any{"args": []string{"sh"}, "env": given, "user": map[string]any{"uid": 0, "gid": 0}})
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	w := newWrapper(&fakeAgent{info: eval42})
	p := process()
	if _, err := w.Prepare(context.Background(), []string{"--root", root, "exec", "--process", p, "--detach", "in"}); err != nil {
		t.Fatal(err)
	}
	doc := readProcess(t, p)
	want := []any{"PATH=/usr/bin", "TERM=xterm"}
	for _, e := range trialEnv {
		want = append(want, e)
	}
	if !slices.Equal(doc["env"].([]any), want) {
		t.Errorf("the exec's environment: %q, want %q", doc["env"], want)
	}
	if doc["user"] == nil || doc["args"] == nil {
		t.Errorf("the exec's process lost its other fields: %v", doc)
	}
	p = process()
	if _, err := w.Prepare(context.Background(), []string{"--root", root, "exec", "--process", p, "out"}); err != nil ||
		!slices.Equal(readProcess(t, p)["env"].([]any), given) {
		t.Errorf("an exec into a container of no Trial was changed (%v): %q", err, readProcess(t, p)["env"])
	}
	if _, err := w.Prepare(context.Background(), []string{"--root", root, "exec", "--process", process(), "lost"}); err == nil ||
		!strings.Contains(err.Error(), "names no bundle") {
		t.Errorf("an exec into a Trial's container whose bundle is unknown: %v", err)
	}
}

// readProcess reads an exec's process file.
func readProcess(t *testing.T, p string) map[string]any {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// runc restore makes a container from a bundle too (docker start
// --checkpoint): passed on unread, one that claims a Trial would run as
// its engine wrote it, on Docker's network and outside the Trial's
// cgroup, with no hook. It is refused; one that claims none is judged as
// at a create.
func TestPrepareRefusesARestore(t *testing.T) {
	restore := func(dir string) []string {
		// As containerd's go-runc passes it.
		return []string{"--root", "/r", "--log", "/l", "--log-format", "json", "restore", "--image-path", "/img", "--work-path", "/w",
			"--tcp-established", "--pid-file", "/p", "--no-subreaper", "--detach", "--bundle", dir, ctr}
	}
	for _, path := range []string{"trialnet-eval-42.slice/" + ctr, "trialnet-eval-42.slice:docker:" + ctr} {
		dir := dockerBundle(t, path, nil)
		before := readDoc(t, dir)
		a := &fakeAgent{info: eval42}
		_, err := newWrapper(a).Prepare(context.Background(), restore(dir))
		if err == nil || !strings.Contains(err.Error(), "restored from a checkpoint") {
			t.Errorf("%s: a restore: %v", path, err)
		}
		if jsonOf(before) != jsonOf(readDoc(t, dir)) || len(a.asks) != 0 {
			t.Errorf("%s: the bundle was rewritten or the agent asked (%q)", path, a.asks)
		}
	}
	a := &fakeAgent{err: errors.New("no agent")}
	dir := dockerBundle(t, "/docker/"+ctr, nil)
	if out, err := newWrapper(a).Prepare(context.Background(), restore(dir)); err != nil || !slices.Equal(out, restore(dir)) {
		t.Errorf("a restore that claims no Trial: %q, %v", out, err)
	}
	dir = dockerBundle(t, "/trialnet/eval-42/"+ctr, nil)
	if _, err := newWrapper(a).Prepare(context.Background(), restore(dir)); err == nil || !strings.Contains(err.Error(), "in Trial eval-42's cgroup") {
		t.Errorf("a restore that claims no Trial, in a Trial's cgroup: %v", err)
	}
}
