//go:build linux

package ociruntime

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/trialnet/trialnet/internal/ident"
	"github.com/trialnet/trialnet/ocihook"
)

// maxConfig bounds the config.json read, as the hook bounds it.
const maxConfig = 16 << 20

// SlicePrefix and SliceSuffix make the cgroup parent that names a
// Trial: docker run --cgroup-parent trialnet-ID.slice. Docker 20.10
// passes no label or annotation to the runtime, and cannot name a
// network namespace or a cgroup outside its own; its --cgroup-parent
// reaches config.json with either cgroup driver (cgroupfs:
// "trialnet-ID.slice/CTR", systemd: "trialnet-ID.slice:docker:CTR",
// where a parent must be a slice name) and an image cannot set it.
const (
	SlicePrefix = "trialnet-"
	SliceSuffix = ".slice"
)

// bundle is a config.json read whole: every field kept as it was read
// (numbers as written), those the wrapper changes reached through it.
type bundle struct {
	path string
	doc  map[string]any
}

func readBundle(dir string) (*bundle, error) {
	return readJSONDoc(filepath.Join(dir, "config.json"))
}

// readJSONDoc reads the JSON object at path (a bundle's config.json, an
// exec's process.json) whole, bounded, strictly.
func readJSONDoc(path string) (*bundle, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfig+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxConfig {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxConfig)
	}
	if err := ocihook.DecodeStrict(b, new(any)); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber() // a uid or a memory limit past 2^53 stays as written
	var doc map[string]any
	if err := d.Decode(&doc); err != nil || doc == nil {
		return nil, fmt.Errorf("%s is not a JSON object: %v", path, err)
	}
	return &bundle{path: path, doc: doc}, nil
}

// object is the object at key in m, made if absent; nil if key holds
// something else.
func object(m map[string]any, key string) map[string]any {
	v, ok := m[key]
	if !ok || v == nil {
		o := map[string]any{}
		m[key] = o
		return o
	}
	o, _ := v.(map[string]any)
	return o
}

func (b *bundle) linux() (map[string]any, error) {
	l := object(b.doc, "linux")
	if l == nil {
		return nil, fmt.Errorf("%s: linux is not an object", b.path)
	}
	return l, nil
}

func (b *bundle) annotations() (map[string]any, error) {
	a := object(b.doc, "annotations")
	if a == nil {
		return nil, fmt.Errorf("%s: annotations is not an object", b.path)
	}
	return a, nil
}

// claim is the Trial a container asks for: by annotation (a runtime
// that passes them, Docker 24 and later with --annotation) or by the
// cgroup parent trialnet-ID.slice. profile is the annotation of that
// name, which only the hook acts on.
type claim struct {
	trial, profile string
	bySlice        bool
}

func (b *bundle) claim() (claim, error) {
	ann, err := b.annotations()
	if err != nil {
		return claim{}, err
	}
	var c claim
	c.trial, _ = ann[ocihook.AnnotationTrial].(string)
	c.profile, _ = ann[ocihook.AnnotationProfile].(string)
	l, err := b.linux()
	if err != nil {
		return claim{}, err
	}
	cp, _ := l["cgroupsPath"].(string)
	parent := cp
	if before, _, ok := strings.Cut(cp, ":"); ok { // systemd: slice:prefix:name
		parent = before
	} else {
		parent = filepath.Dir(strings.TrimPrefix(cp, "/"))
	}
	if id, ok := strings.CutPrefix(parent, SlicePrefix); ok && strings.HasSuffix(id, SliceSuffix) {
		id = strings.TrimSuffix(id, SliceSuffix)
		if !ident.Valid(id) {
			return claim{}, fmt.Errorf("the cgroup parent %s names no valid Trial id (%q)", parent, id)
		}
		if c.trial != "" && c.trial != id {
			return claim{}, fmt.Errorf("the cgroup parent %s and the annotation %s=%s name different Trials", parent, ocihook.AnnotationTrial, c.trial)
		}
		c.trial, c.bySlice = id, true
	} else if near := nearSlice(cp); near != "" {
		// Passed on as unclaimed, it would run where its engine put it
		// (on a Docker network), while its author believes it confined.
		return claim{}, fmt.Errorf("its cgroups path %s has %s, which looks like a Trial's cgroup parent but is not one: only a parent that is exactly %sID%s (no directory above or below it, in that case) places a container in Trial ID; give --cgroup-parent %sID%s, or a parent not spelt like one", cp, near, SlicePrefix, SliceSuffix, SlicePrefix, SliceSuffix)
	}
	return c, nil
}

// nearSlice is the first element of cgroups path cp (either driver's
// spelling) that reads as a Trial's cgroup parent without regard to
// case, where the path as a whole is not the claim: an element above or
// below the Trial's slice, or a slice spelt in another case.
func nearSlice(cp string) string {
	for _, el := range strings.FieldsFunc(cp, func(r rune) bool { return r == '/' || r == ':' }) {
		l := strings.ToLower(el)
		if strings.HasPrefix(l, SlicePrefix) && strings.HasSuffix(l, SliceSuffix) {
			return el
		}
	}
	return ""
}

// namespaces maps the namespace types the spec names to their paths
// ("": a new one); one not well-formed is left out (runc refuses it).
func (b *bundle) namespaces() map[string]string {
	out := map[string]string{}
	l, _ := b.linux()
	nss, _ := l["namespaces"].([]any)
	for _, n := range nss {
		ns, _ := n.(map[string]any)
		typ, _ := ns["type"].(string)
		path, _ := ns["path"].(string)
		out[typ] = path
	}
	return out
}

func (b *bundle) cgroupsPath() string {
	l, _ := b.linux()
	cp, _ := l["cgroupsPath"].(string)
	return cp
}

// place puts the container in its Trial: a new network namespace
// becomes the Trial's (one joined by path, or none at all, stays as it
// is for the hook to judge), its cgroup one under the Trial's, Docker's
// network setup hook goes (the network is the Trial's, not Docker's to
// configure), the annotation names the Trial, and the proxy variables
// are the Trial's.
func (b *bundle) place(trial, netns, cgroupRel, ctrID, proxyURL string) error {
	l, err := b.linux()
	if err != nil {
		return err
	}
	nss, _ := l["namespaces"].([]any)
	for _, n := range nss {
		if ns, ok := n.(map[string]any); ok && ns["type"] == "network" {
			if p, _ := ns["path"].(string); p == "" {
				ns["path"] = netns
				b.dropNetworkSetup()
			}
		}
	}
	l["cgroupsPath"] = strings.TrimSuffix(cgroupRel, "/") + "/" + ctrID
	ann, err := b.annotations()
	if err != nil {
		return err
	}
	ann[ocihook.AnnotationTrial] = trial
	return b.setProxyEnv(proxyURL)
}

// dropNetworkSetup removes Docker's libnetwork-setkey hook: it would
// hand the Trial's namespace to Docker's network controller, which
// configures it (interfaces, routes, IPv6 on its loopback) as a
// container's own.
func (b *bundle) dropNetworkSetup() {
	hooks, _ := b.doc["hooks"].(map[string]any)
	for stage, v := range hooks {
		list, _ := v.([]any)
		hooks[stage] = slices.DeleteFunc(slices.Clone(list), func(h any) bool {
			m, _ := h.(map[string]any)
			args, _ := m["args"].([]any)
			return len(args) > 0 && args[0] == "libnetwork-setkey"
		})
	}
}

// proxyVars are replaced, never merged, as trialnet's launcher does:
// a Trial must not inherit a proxy.
var proxyVars = []string{"HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "NO_PROXY", "no_proxy",
	"ALL_PROXY", "all_proxy", "NODE_USE_ENV_PROXY"}

const noProxy = "127.0.0.1,localhost,::1"

func (b *bundle) setProxyEnv(proxyURL string) error {
	p := object(b.doc, "process")
	if p == nil {
		return fmt.Errorf("%s: process is not an object", b.path)
	}
	env, _ := p["env"].([]any)
	env = slices.DeleteFunc(slices.Clone(env), isProxyVar)
	for _, kv := range []string{"HTTPS_PROXY=" + proxyURL, "HTTP_PROXY=" + proxyURL, "https_proxy=" + proxyURL,
		"http_proxy=" + proxyURL, "NO_PROXY=" + noProxy, "no_proxy=" + noProxy, "NODE_USE_ENV_PROXY=1"} {
		env = append(env, kv)
	}
	p["env"] = env
	return nil
}

// refuseKeyCalls makes the bundle's seccomp profile refuse the kernel's
// key calls (ocihook.KeyCalls) and AF_VSOCK (ocihook.RefuseVsock), which
// a container in a Trial must not reach: Docker's default profile
// refuses the key calls already, and from Docker 23 socket(40, …) but
// not socket(0x1_00000028, …) nor the i386 socketcall; the rest of it is
// unchanged. A container without a profile (seccomp=unconfined) gets the
// least profile that refuses them, and every other call as it had. The
// vsock refusal is made whether or not the host has the BPF LSM layer,
// which refuses it too: the bundle does not depend on the kernel.
func (b *bundle) refuseKeyCalls() error {
	l, err := b.linux()
	if err != nil {
		return err
	}
	if l["seccomp"] == nil {
		l["seccomp"] = ocihook.ContainerProfile(runtime.GOARCH)
		return nil
	}
	sc, ok := l["seccomp"].(map[string]any)
	if !ok {
		return fmt.Errorf("%s: linux.seccomp is not an object", b.path)
	}
	if err := ocihook.RefuseVsock(sc); err != nil {
		return err
	}
	return ocihook.RefuseKeyCalls(sc)
}

// dropConsoleRule removes the device cgroup rules that let the
// container open the host's console, /dev/console (c 5:1), one of
// Docker's defaults: the hook refuses them (a node of 5:1 from the image,
// or made with CAP_MKNOD, opens the host's console, which the container
// does not need: its own terminal is a pty its runtime binds on
// /dev/console, opened by the rule c 136:*). Any other rule stays for the
// hook to judge.
func (b *bundle) dropConsoleRule() error {
	l, err := b.linux()
	if err != nil {
		return err
	}
	res, _ := l["resources"].(map[string]any)
	rules, ok := res["devices"].([]any)
	if !ok {
		return nil
	}
	res["devices"] = slices.DeleteFunc(slices.Clone(rules), func(r any) bool {
		m, _ := r.(map[string]any)
		// Numbers are read as written (json.Number).
		return m["allow"] == true && m["type"] == "c" && fmt.Sprint(m["major"]) == "5" && fmt.Sprint(m["minor"]) == "1"
	})
	return nil
}

// addHook appends trialnet oci-hook at createRuntime, after the hooks
// the bundle has: it checks the container as the kernel has it once the
// runtime has made it. With poststop, also at poststop, as the hooks.d
// entries run it (ocihook.Entries): for every claim but a profile alone,
// whose Trial the agent ends by itself.
func (b *bundle) addHook(binary string, args []string, poststop bool) error {
	hooks := object(b.doc, "hooks")
	if hooks == nil {
		return fmt.Errorf("%s: hooks is not an object", b.path)
	}
	argv := make([]any, len(args))
	for i, a := range args {
		argv[i] = a
	}
	stages := []string{"createRuntime"}
	if poststop {
		stages = append(stages, "poststop")
	}
	for _, stage := range stages {
		list, ok := hooks[stage].([]any)
		if !ok && hooks[stage] != nil {
			return fmt.Errorf("%s: hooks.%s is not a list", b.path, stage)
		}
		hooks[stage] = append(list, map[string]any{"path": binary, "args": argv, "timeout": ocihook.HookTimeout})
	}
	return nil
}

// write replaces config.json atomically with the same mode: the runtime
// reads the old file or the new one, never a part.
func (b *bundle) write() error {
	out, err := json.Marshal(b.doc)
	if err != nil {
		return err
	}
	fi, err := os.Stat(b.path)
	if err != nil {
		return err
	}
	return writeAtomic(b.path, out, fi.Mode().Perm())
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".trialnet-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
