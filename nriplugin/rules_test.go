//go:build linux

package nriplugin

import (
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/ident"
	"github.com/trialnet/trialnet/trial"
)

// testPod is a pod as containerd presents it to NRI, annotated with
// profiles (none: not annotated).
func testPod(ns, name string, profiles string) *api.PodSandbox {
	pod := &api.PodSandbox{Id: "sandbox-" + name, Name: name, Namespace: ns, Uid: "uid-" + ns + "-" + name,
		Annotations: map[string]string{"kubernetes.io/config.source": "api"},
		Linux: &api.LinuxPodSandbox{Namespaces: []*api.LinuxNamespace{
			{Type: "network", Path: "/var/run/netns/cni-1234"}, {Type: "ipc"}, {Type: "uts"}, {Type: "pid"}, {Type: "mount"}}}}
	if profiles != "" {
		pod.Annotations[AnnotationProfile] = profiles
	}
	return pod
}

// testContainer is an unprivileged container of a pod, as containerd
// (cgroupfs driver, cgroup v2) presents it to NRI.
func testContainer(id string) *api.Container {
	return &api.Container{Id: id, Name: "main-" + id, Args: []string{"sleep", "inf"},
		Env:         []string{"PATH=/usr/bin:/bin", "HTTPS_PROXY=http://corp-proxy:8080"},
		Annotations: map[string]string{"io.kubernetes.cri.container-type": "container"},
		Mounts: []*api.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/kubelet/pods/uid/etc-hosts", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/sandbox-x/resolv.conf", Options: []string{"rbind", "rprivate", "rw"}},
		},
		Linux: &api.LinuxContainer{CgroupsPath: "/kubepods/besteffort/poduid/" + id,
			Namespaces: []*api.LinuxNamespace{{Type: "pid"}, {Type: "ipc", Path: "/proc/42/ns/ipc"}, {Type: "uts", Path: "/proc/42/ns/uts"},
				{Type: "mount"}, {Type: "network", Path: "/var/run/netns/cni-1234"}, {Type: "cgroup"}},
			// CRI-O's runtime default (containers-common's) lets the key
			// calls run.
			SeccompProfile: &api.SecurityProfile{ProfileType: api.SecurityProfile_RUNTIME_DEFAULT},
			SeccompPolicy: &api.LinuxSeccomp{DefaultAction: "SCMP_ACT_ERRNO", DefaultErrno: api.UInt32(uint32(38)),
				Architectures: []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86"}, Syscalls: []*api.LinuxSyscall{
					{Names: []string{"read", "keyctl", "add_key", "write", "request_key"}, Action: "SCMP_ACT_ALLOW"},
					{Names: []string{"personality"}, Action: "SCMP_ACT_ALLOW", Args: []*api.LinuxSeccompArg{{Index: 0, Value: 8, Op: "SCMP_CMP_EQ"}}}}}}}
}

func withoutNS(c *api.Container, typ string) *api.Container {
	c.Linux.Namespaces = slices.DeleteFunc(c.Linux.Namespaces, func(n *api.LinuxNamespace) bool { return n.Type == typ })
	return c
}

var (
	testPlugin    = &Plugin{HookPath: "/opt/trialnet/bin/trialnet-oci", ResolvConf: "/opt/trialnet/resolv.conf"}
	testProtected = testPlugin.protected()
)

// Each way a pod's container would leave its Trial, as NRI shows it, is
// refused before anything is made for it, with the reason; an ordinary
// container is not.
func TestRefusals(t *testing.T) {
	ordinary := testContainer("c0")
	if why := refusals(ordinary, testProtected, testPlugin.ownMount); len(why) > 0 {
		t.Fatalf("an ordinary container is refused: %q", why)
	}
	// As a second plugin instance sees it during a rolling update: the
	// first one's adjustment (its read-only resolv.conf) is not the pod's.
	adj, err := testPlugin.adjust(ordinary, client.TrialInfo{Spec: trial.Spec{Transparent: true}})
	if err != nil {
		t.Fatal(err)
	}
	ordinary.Mounts = append(ordinary.Mounts, adj.GetMounts()...)
	if why := refusals(ordinary, testProtected, testPlugin.ownMount); len(why) > 0 {
		t.Fatalf("a container with the plugin's own resolv.conf is refused: %q", why)
	}
	for _, tc := range []struct {
		name string
		ctr  *api.Container
		want string
	}{
		{"host network", withoutNS(testContainer("c1"), "network"), "no network namespace of its own"},
		{"host PID", withoutNS(testContainer("c2"), "pid"), "no pid namespace of its own"},
		{"host IPC", withoutNS(testContainer("c3"), "ipc"), "no ipc namespace of its own"},
		// containerd's privileged container: a writable cgroup file system
		// and no cgroup namespace (it holds every capability too, which
		// the hook refuses at createRuntime: NRI does not show them).
		{"privileged", func() *api.Container {
			c := withoutNS(testContainer("c4"), "cgroup")
			c.Mounts[2].Options = []string{"nosuid", "noexec", "nodev", "relatime", "rw"}
			return c
		}(), "writable cgroup file system"},
		{"privileged (cgroup namespace)", withoutNS(testContainer("c5"), "cgroup"), "no cgroup namespace of its own"},
		{"the control socket's directory", func() *api.Container {
			c := testContainer("c6")
			c.Mounts = append(c.Mounts, &api.Mount{Destination: "/x", Type: "bind", Source: "/run/trialnet", Options: []string{"rbind"}})
			return c
		}(), "binds /run/trialnet"},
		{"bpffs", func() *api.Container {
			c := testContainer("c7")
			c.Mounts = append(c.Mounts, &api.Mount{Destination: "/x", Type: "bind", Source: "/sys/fs", Options: []string{"rbind", "ro"}})
			return c
		}(), "binds /sys/fs"},
		{"shareProcessNamespace", func() *api.Container {
			c := testContainer("c9")
			c.Linux.Namespaces[0].Path = "/proc/42/ns/pid"
			return c
		}(), "shareProcessNamespace"},
		{"the hook's binary", func() *api.Container {
			c := testContainer("c10")
			c.Mounts = append(c.Mounts, &api.Mount{Destination: "/x", Type: "bind", Source: "/opt/trialnet", Options: []string{"rbind"}})
			return c
		}(), "binds /opt/trialnet"},
		{"containerd's socket", func() *api.Container {
			c := testContainer("c11")
			c.Mounts = append(c.Mounts, &api.Mount{Destination: "/x", Type: "bind", Source: "/run/containerd/containerd.sock", Options: []string{"rbind"}})
			return c
		}(), "binds /run/containerd/containerd.sock"},
		{"resolv.conf writable", func() *api.Container {
			c := testContainer("c12")
			c.Mounts = append(c.Mounts, &api.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: "/opt/trialnet/resolv.conf", Options: []string{"rbind", "rw"}})
			return c
		}(), "binds /opt/trialnet/resolv.conf"},
		{"resolv.conf ro, then rw", func() *api.Container {
			c := testContainer("c13")
			c.Mounts = append(c.Mounts, &api.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: "/opt/trialnet/resolv.conf", Options: []string{"rbind", "ro", "rw"}})
			return c
		}(), "binds /opt/trialnet/resolv.conf"},
		{"systemd cgroup driver", func() *api.Container {
			c := testContainer("c8")
			c.Linux.CgroupsPath = "kubepods-besteffort-poduid.slice:cri-containerd:c8"
			return c
		}(), "cgroupfs driver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := refusals(tc.ctr, testProtected, testPlugin.ownMount)
			if !strings.Contains(strings.Join(why, "; "), tc.want) {
				t.Fatalf("refusals %q, want one saying %q", why, tc.want)
			}
		})
	}
}

// A pod's trialnet.io/ annotations other than the profile are refused,
// not ignored: a pod that asks to join a Trial by id is not let run on
// the pod network.
func TestClaimProblems(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		want string // "": no problem
		any  bool
	}{
		{map[string]string{"app": "x"}, "", false},
		{map[string]string{AnnotationProfile: "claude"}, "", true},
		{map[string]string{AnnotationProfile: "claude, pypi"}, "", true},
		{map[string]string{"trialnet.io/trial": "eval-1"}, "not ones the NRI plugin takes", true},
		{map[string]string{"TrialNet.io/Profile": "x"}, "not ones the NRI plugin takes", true},
		{map[string]string{AnnotationProfile: "claude,"}, "empty profile", true},
		{map[string]string{AnnotationProfile: ""}, "empty profile", true},
	} {
		c := claimOf(&api.PodSandbox{Annotations: tc.ann})
		why := strings.Join(c.problems(), "; ")
		if c.any() != tc.any || (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
			t.Errorf("%v: any %v, problems %q; want any %v and %q", tc.ann, c.any(), why, tc.any, tc.want)
		}
	}
}

// A pod's Trial id keeps to the Trial id rules whatever the pod's names,
// and differs for pods that differ in namespace, name or uid.
func TestTrialID(t *testing.T) {
	long := strings.Repeat("a-very-long-name", 20)
	seen := map[string]bool{}
	for _, p := range []*api.PodSandbox{
		{Namespace: "evals", Name: "task-1", Uid: "u1"},
		{Namespace: "evals", Name: "task-1", Uid: "u2"},
		{Namespace: "evals-task", Name: "1", Uid: "u1"},
		{Namespace: "Evals", Name: "Task.1_x", Uid: "u1"},
		{Namespace: long, Name: long, Uid: "u1"},
		{Namespace: "-", Name: "-", Uid: ""},
	} {
		id := TrialID(p)
		if !ident.Valid(id) || !strings.HasPrefix(id, IDPrefix) || seen[id] {
			t.Errorf("pod %s/%s/%s: id %q (valid %v, seen %v)", p.Namespace, p.Name, p.Uid, id, ident.Valid(id), seen[id])
		}
		seen[id] = true
	}
}

// A writable hostPath of what the node's root runs or reads as its
// configuration lets a container's process run outside its Trial: a
// static pod manifest the kubelet starts on the host network, a cron
// entry, a binary. Each is refused, whatever it is under (subPath: the
// runtime's source is the file itself); read-only, or the kubelet's own
// pod directories, are not.
func TestRefusalsNodeCode(t *testing.T) {
	for _, src := range []string{"/etc/kubernetes/manifests", "/etc/kubernetes/manifests/evil.yaml", "/etc", "/etc/cron.d",
		"/usr/local/bin", "/usr", "/bin", "/sbin", "/lib/systemd/system", "/lib64", "/boot", "/root/.ssh", "/var/spool/cron",
		"/etc/containerd/config.toml", "/etc/crio", "/etc//cron.d/", "/var/lib/kubelet/config.yaml", "/var/lib/kubelet",
		// other containers' root file systems and the images they start from
		"/var/lib/containerd", "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/12/fs",
		"/var/lib/containerd/io.containerd.content.v1.content", "/var/lib/containers/storage/overlay", "/var/lib/docker", "/var/lib"} {
		// "ro" then "rw": the runtime reads options in order, and the last wins.
		for _, opts := range [][]string{{"rbind", "rprivate", "rw"}, {"rbind", "ro", "rw"}} {
			c := testContainer("c1")
			c.Mounts = append(c.Mounts, &api.Mount{Destination: "/x", Type: "bind", Source: src, Options: opts})
			why := strings.Join(refusals(c, testProtected, testPlugin.ownMount), "; ")
			if !strings.Contains(why, "writable") {
				t.Errorf("a writable bind of %s (%v): refusals %q, want one saying it is writable", src, opts, why)
			}
		}
	}
	for _, m := range []*api.Mount{
		{Destination: "/x", Type: "bind", Source: "/etc/ssl/certs", Options: []string{"rbind", "ro"}},
		{Destination: "/data", Type: "bind", Source: "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/data", Options: []string{"rbind", "rw"}},
		{Destination: "/data", Type: "bind", Source: "/mnt/datasets", Options: []string{"rbind", "rw"}},
		{Destination: "/etc/hostname", Type: "bind", Source: "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/x/hostname", Options: []string{"rbind", "rw"}},
	} {
		c := testContainer("c2")
		c.Mounts = append(c.Mounts, m)
		if why := refusals(c, testProtected, testPlugin.ownMount); len(why) > 0 {
			t.Errorf("a bind of %s (%v): refused %q", m.Source, m.Options, why)
		}
	}
}

// A network sysctl in the container's spec would be written by the
// runtime, as root, in the namespace the plugin puts it in: the Trial's,
// set up by the agent and shared by its other containers. Refused, in
// either spelling; the others (IPC's, in the pod's own namespace) are not.
func TestRefusalsNetSysctls(t *testing.T) {
	for _, k := range []string{"net.ipv4.ping_group_range", "net/ipv4/ip_unprivileged_port_start", "net.ipv4.conf.all.route_localnet", "Net.core.somaxconn"} {
		c := testContainer("c1")
		c.Linux.Sysctl = map[string]string{k: "0"}
		if why := strings.Join(refusals(c, testProtected, testPlugin.ownMount), "; "); !strings.Contains(why, "sysctl") {
			t.Errorf("sysctl %s: refusals %q, want one naming it", k, why)
		}
	}
	c := testContainer("c2")
	c.Linux.Sysctl = map[string]string{"kernel.shm_rmid_forced": "1"}
	if why := refusals(c, testProtected, testPlugin.ownMount); len(why) > 0 {
		t.Errorf("an IPC sysctl refused: %q", why)
	}
}

// A socket of the node's init or of the kubelet's plugin registries
// starts processes or hands devices and mounts to containers outside the
// Trial: container root is uid 0 to the peer, and a read-only bind does
// not stop connect(2). Each is refused, read-only too.
func TestRefusalsNodeSockets(t *testing.T) {
	for _, src := range []string{"/run/dbus/system_bus_socket", "/var/run/dbus", "/run/systemd/private", "/run/systemd",
		"/var/lib/kubelet/device-plugins/kubelet.sock", "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/pod-resources", "/var/lib/kubelet/plugins"} {
		c := testContainer("c1")
		c.Mounts = append(c.Mounts, &api.Mount{Destination: "/x", Type: "bind", Source: src, Options: []string{"rbind", "ro"}})
		if why := strings.Join(refusals(c, testProtected, testPlugin.ownMount), "; "); !strings.Contains(why, "binds "+src) {
			t.Errorf("a read-only bind of %s: refusals %q, want one naming it", src, why)
		}
	}
}

// containerd binds each pod's /dev/shm, a tmpfs of the pod's own, from
// under its state in /run/containerd, which is protected: that bind
// passes in exactly containerd's shape for the container's own pod, and
// nothing else under /run/containerd passes by being named shm.
func TestRefusalsContainerdPodShm(t *testing.T) {
	const sb = "6f1b3a0e9c4d2b7a8e5f0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f"
	const other = "0f1b3a0e9c4d2b7a8e5f0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f"
	dir := "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/"
	shm := func(c *api.Container, m *api.Mount) *api.Container {
		c.PodSandboxId = sb
		c.Mounts = append(c.Mounts, m)
		return c
	}
	own := &api.Mount{Destination: "/dev/shm", Type: "bind", Source: dir + sb + "/shm", Options: []string{"rbind", "rprivate", "rw"}}
	if why := refusals(shm(testContainer("c1"), own), testProtected, testPlugin.ownMount); len(why) > 0 {
		t.Fatalf("containerd's own /dev/shm bind refused: %q", why)
	}
	for name, m := range map[string]*api.Mount{
		"another pod's":           {Destination: "/dev/shm", Type: "bind", Source: dir + other + "/shm", Options: []string{"rbind", "rprivate", "rw"}},
		"the sandbox's dir":       {Destination: "/dev/shm", Type: "bind", Source: dir + sb, Options: []string{"rbind", "rw"}},
		"under its shm":           {Destination: "/dev/shm", Type: "bind", Source: dir + sb + "/shm/x", Options: []string{"rbind", "rw"}},
		"a sibling named shmx":    {Destination: "/dev/shm", Type: "bind", Source: dir + sb + "/shmx", Options: []string{"rbind", "rw"}},
		"dot-dot to the state":    {Destination: "/dev/shm", Type: "bind", Source: dir + sb + "/shm/../../..", Options: []string{"rbind", "rw"}},
		"dot-dot back to shm":     {Destination: "/dev/shm", Type: "bind", Source: dir + sb + "/../" + sb + "/shm", Options: []string{"rbind", "rw"}},
		"the sandboxes":           {Destination: "/dev/shm", Type: "bind", Source: dir + "shm", Options: []string{"rbind", "rw"}},
		"elsewhere than /dev/shm": {Destination: "/data", Type: "bind", Source: dir + sb + "/shm", Options: []string{"rbind", "rw"}},
		"not a bind":              {Destination: "/dev/shm", Type: "overlay", Source: dir + sb + "/shm", Options: []string{"lowerdir=" + dir + sb + "/shm"}},
		"shared propagation":      {Destination: "/dev/shm", Type: "bind", Source: dir + sb + "/shm", Options: []string{"rbind", "rshared", "rw"}},
		"/var/run's spelling":     {Destination: "/dev/shm", Type: "bind", Source: "/var" + dir + sb + "/shm", Options: []string{"rbind", "rw"}},
		"an id not containerd's":  {Destination: "/dev/shm", Type: "bind", Source: dir + "..%2f/shm", Options: []string{"rbind", "rw"}},
	} {
		c := shm(testContainer("c1"), m)
		if name == "an id not containerd's" {
			c.PodSandboxId = "..%2f"
		}
		if why := refusals(c, testProtected, testPlugin.ownMount); len(why) == 0 {
			t.Errorf("%s (%s on %s): not refused", name, m.Source, m.Destination)
		}
	}
	// No pod id: no exception.
	c := shm(testContainer("c1"), own)
	c.PodSandboxId = ""
	if why := refusals(c, testProtected, testPlugin.ownMount); len(why) == 0 {
		t.Error("a pod's shm bind with no pod id: not refused")
	}
}
