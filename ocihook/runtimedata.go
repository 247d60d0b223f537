//go:build linux

package ocihook

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// AnnotationCRIOSandboxID is CRI-O's annotation on every container of a
// pod: the pod's sandbox container, whose userdata (shm, hostname,
// resolv.conf) CRI-O binds into each.
const AnnotationCRIOSandboxID = "io.kubernetes.cri-o.SandboxID"

// DefaultStorageRoots are containers/storage's run and graph roots,
// podman's and CRI-O's defaults (storage.conf's runroot and graphroot):
// under each, DRIVER-containers/ID/userdata is container ID's runtime
// data, its /dev/shm, hostname, hosts, resolv.conf, secrets and
// config.json.
var DefaultStorageRoots = []string{"/run/containers/storage", "/var/lib/containers/storage"}

// runtimeData says whose runtime data a host path is: a container in a
// Trial sees only its own (and its pod's). Another container's /dev/shm
// or userdata is a channel out of the Trial to a process it does not
// hold, and another Trial's container's is that Trial's state.
type runtimeData struct {
	roots []string // storage roots
	own   []string // the container's id and its pod sandbox's
}

// whose says why the host path src (resolved) is not the container's to
// mount ("": it holds no runtime data, or only own's): it holds every
// container's (a storage root, a DRIVER-containers directory, a
// directory above them), or is another container's.
func (d *runtimeData) whose(src string) string {
	for _, root := range d.roots {
		if within(root, src) {
			return fmt.Sprintf("holds every container's data (%s)", root)
		}
		if !within(src, root) {
			continue
		}
		parts := strings.Split(strings.TrimPrefix(src, root+"/"), "/")
		if !strings.HasSuffix(parts[0], "-containers") {
			continue // image and layer stores, volumes
		}
		if len(parts) == 1 {
			return fmt.Sprintf("holds every container's data (%s)", src)
		}
		if !slices.Contains(d.own, parts[1]) {
			return fmt.Sprintf("is container %s's runtime data", parts[1])
		}
	}
	return ""
}

// refusals says why bind or overlay source dirs of m would show the
// container runtime data not its own.
func (d *runtimeData) refusals(bundle string, m mountOf) []string {
	var srcs []string
	switch {
	case m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind"):
		srcs = []string{m.Source}
	case m.Type == "overlay":
		for _, o := range m.Options {
			if _, dirs, ok := strings.Cut(o, "="); ok {
				srcs = append(srcs, strings.Split(dirs, ":")...)
			}
		}
	}
	var why []string
	for _, src := range srcs {
		if src == "" {
			continue
		}
		if w := d.whose(resolve(bundle, src)); w != "" {
			why = append(why, fmt.Sprintf("it mounts %s on %s, which %s: a container in a Trial sees only its own runtime data (and its pod's)", src, m.Destination, w))
		}
	}
	return why
}

// mountRefusal says why mount m, as the kernel shows it, is runtime data
// not the container's ("": none): its directory within its file system
// is placed under the storage roots found in the hook's own mounts.
func (d *runtimeData) mountRefusal(roots []protectedFile, m mountEntry) string {
	for _, r := range roots {
		switch {
		case m.dev != r.dev:
		case within(r.inFS, m.root):
			return fmt.Sprintf("holds every container's data (%s)", r.path)
		case within(m.root, r.inFS):
			rel, _ := filepath.Rel(r.inFS, m.root)
			if w := d.whose(filepath.Join(r.path, rel)); w != "" {
				return w
			}
		}
	}
	return ""
}

// resolve is the host path src names (relative to bundle if not
// absolute), through its links as the runtime follows them.
func resolve(bundle, src string) string {
	if !filepath.IsAbs(src) {
		// runc joins it to the bundle (cleaned): l/.. is the bundle.
		src = filepath.Join(bundle, src)
	}
	// An absolute one is not cleaned first: runc hands it to the kernel
	// as written, which takes a ".." after a link from where the link led
	// (l/.. is the link target's parent), as EvalSymlinks does; Clean
	// would drop the link with it.
	if real, err := filepath.EvalSymlinks(src); err == nil {
		return real
	}
	return filepath.Clean(src)
}
