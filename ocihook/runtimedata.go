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

// storageRoots are containers/storage's run and graph roots, podman's and
// CRI-O's defaults (storage.conf's runroot and graphroot): under each,
// DRIVER-containers/ID/userdata is container ID's runtime data, its
// /dev/shm, hostname, hosts, resolv.conf, secrets and config.json.
var storageRoots = []string{"/run/containers/storage", "/var/lib/containers/storage"}

// otherContainersData says why bind or overlay source dirs of m would
// show the container another container's runtime data: a directory
// holding every container's (the storage root, a DRIVER-containers
// directory, a directory above them), or one of a container whose id is
// not among own. Another container's /dev/shm or userdata is a channel
// out of the Trial to a process it does not hold, and another Trial's
// container's is that Trial's state.
func (m mountOf) otherContainersData(bundle string, own []string) []string {
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
		if w := containersData(resolve(bundle, src), own); w != "" {
			why = append(why, fmt.Sprintf("it mounts %s on %s, which %s: a container in a Trial sees only its own runtime data (and its pod's)", src, m.Destination, w))
		}
	}
	return why
}

// containersData says whose runtime data the host path src (resolved)
// holds, when that is not only own's ("": none, or own's).
func containersData(src string, own []string) string {
	for _, root := range storageRoots {
		if within(root, src) {
			return fmt.Sprintf("holds every container's data (%s)", root)
		}
		if !within(src, root) {
			continue
		}
		parts := strings.Split(strings.TrimPrefix(src, root+"/"), "/")
		if !strings.HasSuffix(parts[0], "-containers") {
			continue // image and layer stores
		}
		if len(parts) == 1 {
			return fmt.Sprintf("holds every container's data (%s)", src)
		}
		if !slices.Contains(own, parts[1]) {
			return fmt.Sprintf("is container %s's runtime data", parts[1])
		}
	}
	return ""
}

// resolve is the host path src names (relative to bundle if not
// absolute), through its links as the runtime follows them.
func resolve(bundle, src string) string {
	if !filepath.IsAbs(src) {
		src = filepath.Join(bundle, src)
	}
	src = filepath.Clean(src)
	if real, err := filepath.EvalSymlinks(src); err == nil {
		return real
	}
	return src
}
