//go:build linux

package ocihook

// Spec is what the hook's rules read of a container's OCI spec, for a
// caller that holds the spec in another shape than a bundle (the NRI
// plugin, before the runtime writes config.json): the same rules, so
// that a container refused there is the one the hook would refuse.
type Spec struct {
	// Namespaces maps each namespace type the container gets to its path
	// ("" for a new one); a type missing is one shared with the runtime.
	Namespaces map[string]string
	// Capabilities are the names in any of its capability sets; nil when
	// the caller cannot see them (the hook checks them at createRuntime).
	Capabilities []string
	Mounts       []Mount
	// PodSandbox is the id of the container's pod sandbox, whose
	// /dev/shm containerd binds from under its state (ContainerdShmDir);
	// "": no pod.
	PodSandbox string
}

// Mount is one of a Spec's mounts.
type Mount struct {
	Destination, Type, Source string
	Options                   []string
}

// Refusals says why the hook would refuse a container with this spec:
// a host namespace, a capability that leaves, a writable cgroup file
// system or a bind mount of one of protected (DefaultProtected). None:
// it passes these checks; the hook still checks the process itself, and
// the seccomp profile as the runtime wrote it (the plugin sets that
// policy itself, where the runtime shows it one to keep).
func (s Spec) Refusals(protected []string) []string {
	var c config
	if s.Capabilities != nil {
		c.Process = &processOf{}
		c.Process.Capabilities = &capsOf{Bounding: s.Capabilities}
	}
	c.Linux = &linuxOf{}
	for typ, path := range s.Namespaces {
		c.Linux.Namespaces = append(c.Linux.Namespaces, namespaceOf{Type: typ, Path: path})
	}
	for _, m := range s.Mounts {
		c.Mounts = append(c.Mounts, mountOf(m))
	}
	// The shape only: the hook finds the pod's tmpfs there at createRuntime.
	c.podShm = func(m mountOf) bool { return m.podShm(ContainerdShmDir, s.PodSandbox) }
	// Sources are absolute in a spec the runtime has not written yet:
	// no bundle to resolve a relative one against but the root.
	return c.check("/", protected)
}
