//go:build linux

package ctr

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/ocihook"
	"golang.org/x/sys/unix"
)

// runc runs containers from bundles, one per command, with runc's own
// defaults (those of "runc spec": its capabilities, masked and read-only
// paths, no seccomp filter) but for the least seccomp profile that keeps
// the key calls from it (docs/containers.md), the Trial's namespace and
// cgroup, and trialnet oci-hook at createRuntime. Its standard input, output and error
// are handed down as podman's are (handDown).
type runc struct {
	e     *Env
	state string
	n     atomic.Int64
	top   []string // the Trials' cgroups it made cgroups under, for the v1 clean-up
}

// Runc is a runner of runc with a bundle.
func (e *Env) Runc(t testing.TB) Runner {
	t.Helper()
	r := &runc{e: e, state: t.TempDir()}
	t.Cleanup(func() {
		for _, rel := range r.top {
			RemoveV1Cgroups(rel)
		}
	})
	return r
}

func (r *runc) Name() string { return "runc-bundle" }

// runcCaps are "runc spec"'s.
var runcCaps = []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}

func (r *runc) Run(ctx context.Context, c Cmd) (int, error) {
	name := fmt.Sprintf("tn-%d-%d", os.Getpid(), r.n.Add(1))
	bundle, err := os.MkdirTemp("", "bundle-")
	if err != nil {
		return -1, err
	}
	defer os.RemoveAll(bundle)
	files, argv := handDown(c)
	cfg := r.config(c, argv, name)
	if !c.RuntimeSeccomp {
		cfg["linux"].(map[string]any)["seccomp"] = ocihook.ContainerProfile(runtime.GOARCH)
	}
	if err := devices(cfg, c.Devices); err != nil {
		return -1, err
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644)
	}
	if err != nil {
		return -1, err
	}
	if cg := r.e.cgroupOf(c.Trial); !slices.Contains(r.top, cg) {
		r.top = append(r.top, cg)
	}
	cmd := exec.CommandContext(ctx, "runc", "--root", r.state, "run", "--preserve-fds", strconv.Itoa(len(files)), "--bundle", bundle, name)
	cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = c.Stdout, c.ErrOut, files
	code, err := exitCode(cmd.Run())
	_ = exec.Command("runc", "--root", r.state, "delete", "--force", name).Run()
	return code, err
}

// config is the bundle's config.json for c.
func (r *runc) config(c Cmd, argv []string, name string) map[string]any {
	caps := map[string][]string{"bounding": runcCaps}
	if c.UID == 0 {
		caps["effective"], caps["permitted"] = runcCaps, runcCaps
	}
	cwd := c.Dir
	if cwd == "" {
		cwd = "/"
	}
	mounts := []map[string]any{
		{"destination": "/proc", "type": "proc", "source": "proc"},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": []string{"nosuid", "noexec", "nodev"}},
		{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
		{"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=1777"}},
		bind("/usr", "/usr", true), bind("/etc", "/etc", true),
	}
	for _, d := range c.Binds {
		mounts = append(mounts, bind(d, d, false))
	}
	for _, d := range c.ReadOnly {
		mounts = append(mounts, bind(d, d, true))
	}
	if c.ResolvConf != "" {
		mounts = append(mounts, bind(c.ResolvConf, "/etc/resolv.conf", true))
	}
	return map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]int{"uid": c.UID, "gid": c.GID}, "cwd": cwd, "args": argv,
			"env": c.Env, "capabilities": caps, "noNewPrivileges": true,
		},
		"root":     map[string]any{"path": r.e.rootOf(c), "readonly": true},
		"hostname": name,
		"mounts":   mounts,
		"linux": map[string]any{
			"namespaces": []map[string]string{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
				{"type": "cgroup"}, {"type": "network", "path": c.Trial.Netns}},
			"cgroupsPath": r.e.cgroupOf(c.Trial) + "/" + name,
			"maskedPaths": []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			"readonlyPaths": []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
		"hooks": map[string]any{"createRuntime": []map[string]any{{"path": r.e.Bin,
			"args": []string{"trialnet", "oci-hook", "--socket", r.e.Sock}, "timeout": 30}}},
		"annotations": annotations(c),
	}
}

// devices gives the bundle cfg the host block devices at paths, each with
// a device cgroup rule to read it, as podman --device does.
func devices(cfg map[string]any, paths []string) error {
	var nodes, rules []map[string]any
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return err
		}
		maj, minor := int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		nodes = append(nodes, map[string]any{"path": p, "type": "b", "major": maj, "minor": minor, "fileMode": 0o440, "uid": 0, "gid": 0})
		rules = append(rules, map[string]any{"allow": true, "type": "b", "major": maj, "minor": minor, "access": "r"})
	}
	if len(paths) > 0 {
		linux := cfg["linux"].(map[string]any)
		linux["devices"] = nodes
		linux["resources"] = map[string]any{"devices": append([]map[string]any{{"allow": false, "access": "rwm"}}, rules...)}
	}
	return nil
}

func bind(src, dst string, ro bool) map[string]any {
	opts := []string{"rbind", "nosuid", "nodev"}
	if ro {
		opts = append(opts, "ro")
	}
	return map[string]any{"destination": dst, "type": "bind", "source": src, "options": opts}
}

// RemoveV1Cgroups removes what runc made under rel in each cgroup v1
// hierarchy of a hybrid host (runc delete removes the leaf only), from the
// bottom up to rel's first component, the isolated host's parent.
func RemoveV1Cgroups(rel string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	top := strings.SplitN(strings.TrimPrefix(rel, "/"), "/", 2)[0]
	for line := range strings.Lines(string(b)) {
		pre, post, ok := strings.Cut(line, " - ")
		if f := strings.Fields(pre); ok && len(f) >= 5 && strings.HasPrefix(post, "cgroup ") {
			root := filepath.Join(cgroup2.UnescapeMountPath(f[4]), top)
			var dirs []string
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				_ = unix.Rmdir(dirs[i])
			}
		}
	}
}
