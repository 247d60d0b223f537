// Package kubernetes holds the agent's manifests; its test checks offline
// the fields the deployment relies on.
package kubernetes

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type mount struct {
	Name             string `yaml:"name"`
	MountPath        string `yaml:"mountPath"`
	MountPropagation string `yaml:"mountPropagation"`
	SubPath          string `yaml:"subPath"`
}

type probe struct {
	Exec struct {
		Command []string `yaml:"command"`
	} `yaml:"exec"`
	TimeoutSeconds int `yaml:"timeoutSeconds"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom struct {
		FieldRef struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type container struct {
	Name            string   `yaml:"name"`
	Image           string   `yaml:"image"`
	Command         []string `yaml:"command"`
	Args            []string `yaml:"args"`
	RestartPolicy   string   `yaml:"restartPolicy"`
	Env             []envVar `yaml:"env"`
	SecurityContext struct {
		Privileged   bool `yaml:"privileged"`
		RunAsNonRoot bool `yaml:"runAsNonRoot"`
		RunAsUser    *int `yaml:"runAsUser"`
		Capabilities struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	StartupProbe   *probe  `yaml:"startupProbe"`
	ReadinessProbe *probe  `yaml:"readinessProbe"`
	LivenessProbe  *probe  `yaml:"livenessProbe"`
	VolumeMounts   []mount `yaml:"volumeMounts"`
}

type rule struct {
	Resources []string `yaml:"resources"`
	Verbs     []string `yaml:"verbs"`
}

type doc struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Rules []rule `yaml:"rules"`
	Spec  struct {
		UpdateStrategy struct {
			Type          string `yaml:"type"`
			RollingUpdate struct {
				MaxSurge       int `yaml:"maxSurge"`
				MaxUnavailable int `yaml:"maxUnavailable"`
			} `yaml:"rollingUpdate"`
		} `yaml:"updateStrategy"`
		Template struct {
			Spec struct {
				TerminationGracePeriodSeconds int    `yaml:"terminationGracePeriodSeconds"`
				HostPID                       bool   `yaml:"hostPID"`
				HostNetwork                   bool   `yaml:"hostNetwork"`
				ServiceAccountName            string `yaml:"serviceAccountName"`
				Tolerations                   []struct {
					Key    string `yaml:"key"`
					Effect string `yaml:"effect"`
				} `yaml:"tolerations"`
				InitContainers []container `yaml:"initContainers"`
				Containers     []container `yaml:"containers"`
				Volumes        []struct {
					Name     string `yaml:"name"`
					HostPath *struct {
						Path string `yaml:"path"`
					} `yaml:"hostPath"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

const manifest = "trialnet-agent.yaml"

// load parses the manifest: its documents by kind, and the DaemonSet's
// containers by name.
func load(t *testing.T) (map[string]doc, map[string]container) {
	t.Helper()
	return loadFile(t, manifest)
}

func loadFile(t *testing.T, manifest string) (map[string]doc, map[string]container) {
	t.Helper()
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	byKind := map[string]doc{}
	for {
		var d doc
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		byKind[d.Kind] = d
	}
	ds, ok := byKind["DaemonSet"]
	if !ok {
		t.Fatal("no DaemonSet")
	}
	ps := ds.Spec.Template.Spec
	byName := map[string]container{}
	for _, c := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
		byName[c.Name] = c
	}
	return byKind, byName
}

func TestAgentDaemonSet(t *testing.T) {
	byKind, containers := load(t)
	ps := byKind["DaemonSet"].Spec.Template.Spec
	if !ps.HostPID || !ps.HostNetwork {
		t.Errorf("hostPID %v, hostNetwork %v: the agent needs both", ps.HostPID, ps.HostNetwork)
	}
	if !slices.ContainsFunc(ps.Tolerations, func(x struct {
		Key    string `yaml:"key"`
		Effect string `yaml:"effect"`
	}) bool {
		return x.Key == "trialnet.io/enforcement" && x.Effect == "NoSchedule"
	}) {
		t.Error("the agent does not tolerate the enforcement taint")
	}
	hostPaths := map[string]string{}
	for _, v := range ps.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	agent, ok := containers["agent"]
	if !ok {
		t.Fatal("no agent container")
	}
	if !agent.SecurityContext.Privileged {
		t.Error("the agent is not privileged: Bidirectional propagation needs it")
	}
	want := map[string]string{"/sys/fs/bpf": "", "/sys/fs/cgroup": "", "/run/trialnet": "Bidirectional", "/var/lib/trialnet": ""}
	for path, prop := range want {
		found := false
		for _, m := range agent.VolumeMounts {
			if m.MountPath == path && hostPaths[m.Name] == path {
				found = true
				if prop != "" && m.MountPropagation != prop {
					t.Errorf("%s propagation %q, want %s", path, m.MountPropagation, prop)
				}
			}
		}
		if !found {
			t.Errorf("no hostPath mount of %s", path)
		}
	}
	cr := byKind["ClusterRole"]
	if len(cr.Rules) != 1 || !slices.Equal(cr.Rules[0].Resources, []string{"nodes"}) || !slices.Equal(cr.Rules[0].Verbs, []string{"get", "patch"}) {
		t.Errorf("ClusterRole %+v: only get/patch on nodes", cr.Rules)
	}
	role := byKind["Role"]
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, []string{"pods"}) || !slices.Equal(role.Rules[0].Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("Role %+v: only get/list/watch on pods (kubectl wait)", role.Rules)
	}
	if byKind["ServiceAccount"].Metadata.Name != ps.ServiceAccountName {
		t.Errorf("service account %q not defined", ps.ServiceAccountName)
	}
}

// The agent's --config is the ConfigMap's file mounted by itself
// (subPath): the agent refuses a config reached through a directory
// others may write, and a ConfigMap's volume is an emptyDir, mode 0777,
// so mounted as a directory at /etc/trialnet it kept the agent from
// starting. Seen red with the old mount of the whole volume there.
func TestAgentConfigIsAFileMount(t *testing.T) {
	_, containers := load(t)
	agent := containers["agent"]
	i := slices.Index(agent.Command, "--config")
	if i < 0 || i+1 >= len(agent.Command) {
		t.Fatalf("the agent's command %q has no --config", agent.Command)
	}
	cfg := agent.Command[i+1]
	for _, m := range agent.VolumeMounts {
		if m.Name != "config" {
			continue
		}
		if m.MountPath != cfg || m.SubPath != filepath.Base(cfg) {
			t.Errorf("the config volume is mounted at %s (subPath %q), want the file alone at %s (subPath %s)", m.MountPath, m.SubPath, cfg, filepath.Base(cfg))
		}
		return
	}
	t.Errorf("no mount of the config volume in the agent container")
}

// A rolling update cuts no Trial: the new pod starts beside the old one
// and takes over (maxSurge 1, maxUnavailable 0), and the old one is not
// killed before its drain can end; the agent keeps its listeners in a
// keeper container, which outlives the agent container's restarts.
func TestRollingUpdateHandsOver(t *testing.T) {
	byKind, containers := load(t)
	ds := byKind["DaemonSet"].Spec
	if u := ds.UpdateStrategy; u.Type != "RollingUpdate" || u.RollingUpdate.MaxSurge != 1 || u.RollingUpdate.MaxUnavailable != 0 {
		t.Errorf("update strategy %+v: want RollingUpdate, maxSurge 1, maxUnavailable 0", u)
	}
	if g := ds.Template.Spec.TerminationGracePeriodSeconds; g < int((15 * time.Minute).Seconds()) {
		t.Errorf("terminationGracePeriodSeconds %d: an old agent is killed before its 15-minute drain ends", g)
	}
	agent, keeper := containers["agent"], containers["keeper"]
	i := slices.Index(agent.Command, "--keeper")
	j := slices.Index(keeper.Command, "--socket")
	if i < 0 || j < 0 || agent.Command[i+1] != keeper.Command[j+1] {
		t.Errorf("the agent's --keeper and the keeper's --socket differ: %q, %q", agent.Command, keeper.Command)
	}
	if sc := keeper.SecurityContext; sc.Privileged || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("the keeper runs as root (the agent's peer check) with no capability: %+v", sc)
	}
	// Started before the agent, and kept running: a native sidecar.
	if !slices.ContainsFunc(byKind["DaemonSet"].Spec.Template.Spec.InitContainers, func(c container) bool { return c.Name == "keeper" }) || keeper.RestartPolicy != "Always" {
		t.Error("the keeper is not a native sidecar (an init container with restartPolicy: Always)")
	}
	// Ready only when this pod's agent answers: the old pod's answers on
	// the shared socket until the new one has taken over.
	i = slices.Index(agent.Command, "--pid-file")
	r := agent.ReadinessProbe
	if i < 0 || r == nil || !slices.Contains(r.Exec.Command, agent.Command[i+1]) || !slices.Contains(r.Exec.Command, "--pid-file") {
		t.Errorf("the readiness probe does not check the agent's --pid-file: %q, %+v", agent.Command, r)
	}
}

// The agent is ready when it answers on its socket with its eBPF layer
// attached and pinned (trialnet health), not when the kernel could
// enforce; it is restarted only when it stops answering (health --live).
// The kubelet must not cut a probe short before trialnet health gives up
// by itself, or a slow answer reads as a failure without its reason.
func TestAgentProbesAskTheAgent(t *testing.T) {
	_, containers := load(t)
	agent := containers["agent"]
	for _, tc := range []struct {
		name string
		p    *probe
		live bool
	}{
		{"startupProbe", agent.StartupProbe, true},
		{"readinessProbe", agent.ReadinessProbe, false},
		{"livenessProbe", agent.LivenessProbe, true},
	} {
		if tc.p == nil {
			t.Errorf("the agent has no %s", tc.name)
			continue
		}
		cmd := tc.p.Exec.Command
		if len(cmd) < 2 || cmd[0] != "trialnet" || cmd[1] != "health" || slices.Contains(cmd, "--live") != tc.live {
			t.Errorf("%s runs %q, want trialnet health (--live: %v)", tc.name, cmd, tc.live)
			continue
		}
		i := slices.Index(cmd, "--timeout")
		if i < 0 || i+1 == len(cmd) {
			t.Errorf("%s %q: give --timeout, so that timeoutSeconds can be checked against it", tc.name, cmd)
			continue
		}
		d, err := time.ParseDuration(cmd[i+1])
		if err != nil {
			t.Errorf("%s --timeout: %v", tc.name, err)
			continue
		}
		if time.Duration(tc.p.TimeoutSeconds)*time.Second <= d {
			t.Errorf("%s: timeoutSeconds %d, not above trialnet health --timeout %v", tc.name, tc.p.TimeoutSeconds, d)
		}
	}
}

// Every image names a version: a tag other than latest, or a digest; ours
// a release of trialnet (vMAJOR.MINOR.PATCH, its git tags).
func TestImagesArePinned(t *testing.T) {
	_, containers := load(t)
	release := regexp.MustCompile(`^v\d+\.\d+\.\d+$`)
	ours := 0
	for name, c := range containers {
		repo, tag, digest := splitImage(c.Image)
		switch {
		case digest != "":
		case tag == "":
			t.Errorf("container %s: image %q has no tag", name, c.Image)
		case tag == "latest":
			t.Errorf("container %s: image %q is :latest", name, c.Image)
		}
		if repo == "ghcr.io/trialnet/trialnet" {
			ours++
			if digest == "" && !release.MatchString(tag) {
				t.Errorf("container %s: image %q is not a trialnet release (vX.Y.Z)", name, c.Image)
			}
		}
	}
	if ours == 0 {
		t.Error("no container runs ghcr.io/trialnet/trialnet")
	}
}

// splitImage splits an image reference into repository, tag and digest. A
// colon before the last slash belongs to a registry's port.
func splitImage(ref string) (repo, tag, digest string) {
	repo, digest, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo, tag = repo[:i], repo[i+1:]
	}
	return repo, tag, digest
}

func TestSplitImage(t *testing.T) {
	for ref, want := range map[string][3]string{
		"alpine/kubectl":                         {"alpine/kubectl", "", ""},
		"alpine/kubectl:1.34.2":                  {"alpine/kubectl", "1.34.2", ""},
		"registry:5000/kubectl":                  {"registry:5000/kubectl", "", ""},
		"registry:5000/kubectl:latest":           {"registry:5000/kubectl", "latest", ""},
		"ghcr.io/trialnet/trialnet@sha256:ab12":  {"ghcr.io/trialnet/trialnet", "", "sha256:ab12"},
		"ghcr.io/trialnet/trialnet:v1@sha256:ab": {"ghcr.io/trialnet/trialnet", "v1", "sha256:ab"},
	} {
		repo, tag, digest := splitImage(ref)
		if [3]string{repo, tag, digest} != want {
			t.Errorf("splitImage(%q) = %q %q %q, want %q", ref, repo, tag, digest, want)
		}
	}
}

// The capabilities the agent uses are listed twice: the systemd unit's
// bounding set, and in the manifest, whose privileged container holds
// every capability. The lists are equal, and docs/deploy.md explains each
// in an item of its own.
func TestCapabilitiesAgree(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join("..", "trialnet.service"))
	if err != nil {
		t.Fatal(err)
	}
	fromUnit := listed(t, unit, `(?m)^CapabilityBoundingSet=(.*)$`, "trialnet.service's CapabilityBoundingSet=")
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	fromManifest := listed(t, b, `(?m)^\s*# agent-capabilities: (.*)$`, manifest+"'s agent-capabilities comment")
	if !slices.Equal(fromUnit, fromManifest) {
		t.Errorf("capabilities differ:\n  trialnet.service: %v\n  %s: %v", fromUnit, manifest, fromManifest)
	}
	docs, err := os.ReadFile(filepath.Join("..", "..", "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range fromUnit {
		if !regexp.MustCompile("(?m)^- `" + c + "`: ").Match(docs) {
			t.Errorf("docs/deploy.md has no item \"- `%s`: why\"", c)
		}
	}
}

// listed is the sorted capability list in the one line of b that re
// matches.
func listed(t *testing.T, b []byte, re, what string) []string {
	t.Helper()
	m := regexp.MustCompile(re).FindAllSubmatch(b, -1)
	if len(m) != 1 {
		t.Fatalf("%s: %d lines, want 1", what, len(m))
	}
	caps := strings.Fields(string(m[0][1]))
	for _, c := range caps {
		if !strings.HasPrefix(c, "CAP_") {
			t.Fatalf("%s: %q is not a capability", what, c)
		}
	}
	slices.Sort(caps)
	return caps
}

// The sidecar needs no control socket (it follows the pod's Ready
// condition), no capability and no root.
func TestUntaintSidecarIsUnprivileged(t *testing.T) {
	_, containers := load(t)
	c, ok := containers["untaint"]
	if !ok {
		t.Fatal("no untaint container")
	}
	sc := c.SecurityContext
	uid := -1 // not given: the image's, root in most
	if sc.RunAsUser != nil {
		uid = *sc.RunAsUser
	}
	if !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || sc.Privileged || !sc.RunAsNonRoot || uid <= 0 {
		t.Errorf("untaint: drop %v, privileged %v, runAsNonRoot %v, runAsUser %d; want drop ALL, not privileged, a user other than root", sc.Capabilities.Drop, sc.Privileged, sc.RunAsNonRoot, uid)
	}
	for _, m := range c.VolumeMounts {
		if m.Name == "run" || strings.HasPrefix(m.MountPath, "/run/trialnet") {
			t.Errorf("untaint mounts %s: it needs no control socket", m.MountPath)
		}
	}
	fields := map[string]string{}
	for _, e := range c.Env {
		fields[e.Name] = e.ValueFrom.FieldRef.FieldPath
	}
	for name, path := range map[string]string{"NODE_NAME": "spec.nodeName", "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"} {
		if fields[name] != path {
			t.Errorf("untaint env %s from %q, want the downward API's %s", name, fields[name], path)
		}
	}
}

// fakeKubectl stands in for kubectl: the node's taint is the file
// tainted, the pod's Ready condition the content of the file ready, and
// the file fail makes the next taint call fail, as an unreachable API
// server would. Every call is appended to calls.
const fakeKubectl = `#!/bin/sh
echo "$*" >> "$FAKE/calls"
case "$1" in
taint)
	if [ -e "$FAKE/fail" ]; then rm -f "$FAKE/fail"; echo "error: the server is unavailable" >&2; exit 1; fi
	case "$4" in
	*-) [ -e "$FAKE/tainted" ] || { echo "error: taint \"$4\" not found" >&2; exit 1; }; rm -f "$FAKE/tainted" ;;
	*) : > "$FAKE/tainted" ;;
	esac ;;
wait)
	for a; do case "$a" in --for=condition=Ready=*) want=${a#--for=condition=Ready=} ;; esac; done
	while [ "$(cat "$FAKE/ready")" != "$want" ]; do sleep 0.01; done ;;
get)
	cat "$FAKE/others" 2>/dev/null ;;
*) echo "fake kubectl: unexpected $*" >&2; exit 2 ;;
esac
`

// The sidecar's script, run against a fake kubectl: the node is tainted
// from the start and until the pod is Ready, untainted while it is, tainted
// again when it is not (after an API failure too), and when the sidecar
// gets SIGTERM; a taint already removed by someone else does not stall it.
func TestUntaintFollowsReadiness(t *testing.T) {
	_, containers := load(t)
	c := containers["untaint"]
	argv := append(slices.Clone(c.Command), c.Args...)
	if len(argv) < 3 || argv[0] != "sh" || argv[1] != "-c" {
		t.Fatalf("untaint runs %q, want sh -c SCRIPT", argv)
	}
	fake := t.TempDir()
	if err := os.WriteFile(filepath.Join(fake, "kubectl"), []byte(fakeKubectl), 0o755); err != nil {
		t.Fatal(err)
	}
	set := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(fake, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tainted := func() bool {
		_, err := os.Stat(filepath.Join(fake, "tainted"))
		return err == nil
	}
	calls := func() string {
		b, _ := os.ReadFile(filepath.Join(fake, "calls"))
		return string(b)
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("no %s after 10s; kubectl calls:\n%s", what, calls())
			}
		}
	}
	// waiting is true once the sidecar has waited n times for Ready=v:
	// it has got past everything before.
	waiting := func(v string, n int) func() bool {
		return func() bool { return strings.Count(calls(), "--for=condition=Ready="+v+" ") >= n }
	}
	set("ready", "false")

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "PATH="+fake+":"+os.Getenv("PATH"), "FAKE="+fake,
		"NODE_NAME=node-a", "POD_NAME=trialnet-agent-x1", "POD_NAMESPACE=trialnet", "HOME="+fake)
	// A file, not a pipe: a kubectl left behind cannot hold Wait up. Its
	// own process group, so that a failed test ends every process of it.
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if cmd.ProcessState == nil {
			<-done
		}
	})
	output := func() string {
		b, _ := os.ReadFile(out.Name())
		return string(b)
	}

	until("taint before the pod is Ready", tainted)
	until("wait for Ready", waiting("true", 1))
	time.Sleep(200 * time.Millisecond)
	if !tainted() {
		t.Fatal("untainted before the pod was Ready")
	}
	// Removed by someone else meanwhile: untainting must still succeed.
	if err := os.Remove(filepath.Join(fake, "tainted")); err != nil {
		t.Fatal(err)
	}
	set("ready", "true")
	until("wait for not Ready after the taint was gone already", waiting("false", 1))
	if tainted() {
		t.Fatal("tainted while the pod is Ready")
	}
	set("fail", "")
	set("ready", "false")
	until("taint again after the pod was not Ready (and one API failure)", tainted)
	set("ready", "true")
	until("wait for not Ready again", waiting("false", 2))
	if tainted() {
		t.Fatal("tainted while the pod is Ready again")
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after SIGTERM: %v\n%s", err, output())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("SIGTERM did not end the sidecar within 5s\n%s", output())
	}
	if !tainted() {
		t.Error("the sidecar stopped and left the node untainted")
	}

	// A rolling update: the new pod beside this one is Ready (its agent
	// took over); this one's end must not taint the node.
	set("ready", "true")
	set("others", "True")
	cmd2 := exec.Command(argv[0], argv[1:]...)
	cmd2.Env, cmd2.Stdout, cmd2.Stderr = cmd.Env, out, out
	cmd2.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd2.Start(); err != nil {
		t.Fatal(err)
	}
	done2 := make(chan error, 1)
	go func() { done2 <- cmd2.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd2.Process.Pid, syscall.SIGKILL)
		if cmd2.ProcessState == nil {
			<-done2
		}
	})
	until("wait for not Ready in the second sidecar", waiting("false", 3))
	if err := cmd2.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done2:
		if err != nil {
			t.Fatalf("after SIGTERM: %v\n%s", err, output())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("SIGTERM did not end the second sidecar within 5s\n%s", output())
	}
	if tainted() {
		t.Error("the old pod's sidecar tainted the node while the new pod's agent, Ready, serves it")
	}
	for _, l := range strings.Split(strings.TrimSpace(calls()), "\n") {
		f := strings.Fields(l)
		var ok bool
		switch f[0] {
		case "taint":
			ok = len(f) >= 4 && f[1] == "node" && f[2] == "node-a" && strings.HasPrefix(f[3], "trialnet.io/enforcement:NoSchedule")
		case "wait":
			ok = slices.Contains(f, "pod/trialnet-agent-x1") && slices.Contains(f, "-n") && slices.Contains(f, "trialnet")
		case "get":
			ok = slices.Contains(f, "spec.nodeName=node-a,metadata.name!=trialnet-agent-x1") && slices.Contains(f, "app=trialnet-agent")
		}
		if !ok {
			t.Errorf("kubectl %s: not this node's taint nor this pod", l)
		}
	}
}
