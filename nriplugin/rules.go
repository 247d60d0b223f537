//go:build linux

package nriplugin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/trialnet/trialnet/internal/ident"
	"github.com/trialnet/trialnet/ocihook"
)

// AnnotationProfile on a pod asks for a Trial made from these profiles
// (comma-separated) around its containers: the key the OCI hook reads.
const AnnotationProfile = ocihook.AnnotationProfile

// IDPrefix begins the id of every Trial the plugin makes: at a restart
// it destroys those of them whose pod is gone, and no other.
const IDPrefix = "k8s-"

// DefaultExempt are the namespaces whose pods pass untouched whatever
// their annotations: the cluster's own, and trialnet's (the agent's pod
// must never wait on the agent: cilium/tetragon#2402).
func DefaultExempt() []string { return []string{"kube-system", "trialnet"} }

// TrialID is the id of a pod's Trial: the prefix, as much of its
// namespace and name as fits in a Trial id, and a hash of namespace,
// name and uid, so that two pods (or a pod and its recreation under the
// same name) never share one.
func TrialID(pod *api.PodSandbox) string {
	sum := sha256.Sum256([]byte(pod.GetNamespace() + "/" + pod.GetName() + "/" + pod.GetUid()))
	hash := hex.EncodeToString(sum[:])[:12]
	readable := sanitize(pod.GetNamespace() + "-" + pod.GetName())
	room := 63 - len(IDPrefix) - 1 - len(hash)
	if len(readable) > room {
		readable = readable[:room]
	}
	id := IDPrefix + strings.Trim(readable, "-_") + "-" + hash
	if !ident.Valid(id) {
		panic("nriplugin: a Trial id out of the rules: " + id) // sanitize keeps to them
	}
	return id
}

// sanitize keeps a-z, 0-9 and '-' of s, lower-cased; anything else is '-'.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, s)
}

// claim is what a pod asks of trialnet.
type claim struct {
	profiles []string
	other    []string // trialnet.io/ keys the plugin does not take
}

// claimOf reads a pod's trialnet.io/ annotations. No profile and no
// other key: the pod is not trialnet's.
func claimOf(pod *api.PodSandbox) claim {
	var c claim
	for k, v := range pod.GetAnnotations() {
		switch {
		case k == AnnotationProfile:
			for p := range strings.SplitSeq(v, ",") {
				c.profiles = append(c.profiles, strings.TrimSpace(p))
			}
		case strings.HasPrefix(strings.ToLower(k), "trialnet.io/"):
			c.other = append(c.other, k)
		}
	}
	slices.Sort(c.other)
	return c
}

func (c claim) any() bool { return len(c.profiles) > 0 || len(c.other) > 0 }

// problems says why a claim cannot be served as it stands.
func (c claim) problems() []string {
	var why []string
	if len(c.other) > 0 {
		why = append(why, fmt.Sprintf("annotations %s are not ones the NRI plugin takes: a pod asks for a Trial with %s=PROFILE[,PROFILE]", strings.Join(c.other, ", "), AnnotationProfile))
	}
	if slices.Contains(c.profiles, "") {
		why = append(why, fmt.Sprintf("%s names an empty profile", AnnotationProfile))
	}
	return why
}

// runtimeDirs are the node's container runtimes' and NRI's sockets and
// state, under both spellings of /run: a container that binds one can
// start containers outside any Trial, or register as an NRI plugin. So
// can one that binds systemd's or the system bus's socket (container
// root is uid 0 to the peer: systemd-run as the node's root), or the
// kubelet's device and CSI plugin registries (a plugin's answer gives
// other pods' containers devices and mounts). A read-only bind does not
// stop connect(2), so any bind of these is refused.
var runtimeDirs = []string{"/run/containerd", "/var/run/containerd", "/run/crio", "/var/run/crio", "/run/nri", "/var/run/nri",
	"/run/dbus", "/var/run/dbus", "/run/systemd", "/var/run/systemd",
	"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/lib/kubelet/pod-resources"}

// nodeCode are the node's paths whose files its root runs or takes as
// configuration, or that hold other containers' root file systems and
// images: a container that can write one runs code outside its Trial (a
// static pod manifest the kubelet starts on the host network, a cron
// entry, a binary, a file in another container's root). Each maps to
// the directories under it that a pod's own mounts come from: the
// kubelet's pods' volumes, containerd's pods' hostname and resolv.conf,
// CRI-O's containers' own files.
var nodeCode = map[string][]string{
	"/etc": nil, "/usr": nil, "/bin": nil, "/sbin": nil, "/lib": nil, "/lib32": nil, "/lib64": nil, "/libx32": nil,
	"/boot": nil, "/root": nil, "/var/spool": nil, "/var/lib/docker": nil,
	"/var/lib/kubelet":    {"/var/lib/kubelet/pods"},
	"/var/lib/containerd": {"/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes"},
	"/var/lib/containers": {"/var/lib/containers/storage/overlay-containers"},
}

// writesNodeCode says why bind m lets a container write nodeCode.
func writesNodeCode(m *api.Mount) string {
	bind := m.GetType() == "bind" || slices.Contains(m.GetOptions(), "bind") || slices.Contains(m.GetOptions(), "rbind")
	if !bind || ocihook.ReadOnly(m.GetOptions()) {
		return ""
	}
	src := filepath.Clean("/" + m.GetSource())
	for _, d := range slices.Sorted(maps.Keys(nodeCode)) {
		own := slices.ContainsFunc(nodeCode[d], func(e string) bool { return within(src, e) })
		if !own && (within(src, d) || within(d, src)) {
			return fmt.Sprintf("it binds %s writable on %s, which holds or is inside %s, where the node's root or another container runs code or reads its configuration from (a static pod, a cron entry, a binary would run outside the Trial); bind it read-only (readOnly: true) or use a volume", m.GetSource(), m.GetDestination(), d)
		}
	}
	return ""
}

// within: path p is dir or under it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// refusals says why a container of an annotated pod is refused, before
// anything is made for it: the OCI hook's rules applied to what NRI shows
// of its spec (namespaces and mounts; NRI shows no capabilities, which
// the hook checks at createRuntime).
// protected are the node's paths no container may mount; own tells the
// plugin's own mount (an earlier plugin instance's adjustment, during a
// rolling update), which is not the pod's doing.
func refusals(ctr *api.Container, protected []string, own func(*api.Mount) bool) []string {
	spec := ocihook.Spec{Namespaces: map[string]string{}, PodSandbox: ctr.GetPodSandboxId()}
	var extra []string
	for _, n := range ctr.GetLinux().GetNamespaces() {
		spec.Namespaces[n.GetType()] = n.GetPath()
	}
	for _, m := range ctr.GetMounts() {
		if own(m) {
			continue
		}
		if w := writesNodeCode(m); w != "" {
			extra = append(extra, w)
		}
		spec.Mounts = append(spec.Mounts, ocihook.Mount{Destination: m.GetDestination(), Type: m.GetType(), Source: m.GetSource(), Options: m.GetOptions()})
	}
	why := append(spec.Refusals(protected), extra...)
	for _, k := range slices.Sorted(maps.Keys(ctr.GetLinux().GetSysctl())) {
		// runc takes "/" for "."; the kernel's names are lower-case.
		if n := strings.ToLower(strings.ReplaceAll(k, "/", ".")); strings.HasPrefix(n, "net.") {
			why = append(why, fmt.Sprintf("it sets sysctl %s, which the runtime would write in the Trial's network namespace (the agent's, shared by its other containers); drop it from the pod's securityContext.sysctls", k))
		}
	}
	if path := spec.Namespaces["pid"]; path != "" {
		why = append(why, fmt.Sprintf("it joins the PID namespace %s (shareProcessNamespace): the pod's sandbox (pause) process, which stays in the pod's network namespace, would be a process it could trace or signal, and through it reach that network; give each container its own (shareProcessNamespace: false)", path))
	}
	if strings.Contains(ctr.GetLinux().GetCgroupsPath(), ":") {
		why = append(why, fmt.Sprintf("the runtime gives it the systemd cgroup path %q: a Trial's cgroup is not a systemd slice, so the runtime must use the cgroupfs driver (containerd: SystemdCgroup = false; CRI-O: cgroup_manager = \"cgroupfs\"; the kubelet's cgroupDriver with it)", ctr.GetLinux().GetCgroupsPath()))
	}
	return why
}
