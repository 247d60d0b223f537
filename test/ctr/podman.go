//go:build linux

package ctr

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// podman runs containers with podman and crun, with storage and state of
// the test's own, from the Debian root as it is (--rootfs: nothing to pull
// or import).
type podman struct {
	e    *Env
	base []string
}

// Podman is a runner of podman with crun.
func (e *Env) Podman(t testing.TB) Runner {
	t.Helper()
	// podman refuses a run root longer than 50 bytes: t.TempDir's are.
	dir, err := os.MkdirTemp("", "pm-")
	if err != nil {
		t.Fatal(err)
	}
	p := &podman{e: e, base: []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"),
		"--tmpdir", filepath.Join(dir, "tmp"), "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs",
		"--events-backend", "none", "--runtime", "crun", "--hooks-dir", e.Hooks,
		// Not /etc/containers/networks: podman makes it if it is missing,
		// and the kernel matrix's guests see the host's /etc read-only.
		"--network-config-dir", filepath.Join(dir, "networks")}}
	t.Cleanup(func() {
		_ = exec.Command("podman", append(p.base, "rm", "--all", "--force")...).Run()
		_ = os.RemoveAll(dir)
	})
	return p
}

func (p *podman) Name() string { return "podman-crun" }

func (p *podman) Run(ctx context.Context, c Cmd) (int, error) {
	args := append(append([]string{}, p.base...), "run", "--rm", "--cgroups", "no-conmon",
		"--cgroup-parent", p.e.cgroupOf(c.Trial), "--network", "ns:"+c.Trial.Netns,
		"--user", strconv.Itoa(c.UID)+":"+strconv.Itoa(c.GID), "--tmpfs", "/tmp:mode=1777",
		"-v", "/usr:/usr:ro", "-v", "/etc:/etc:ro")
	if !c.RuntimeSeccomp {
		args = append(args, "--security-opt", "seccomp="+p.e.Seccomp)
	}
	for k, v := range annotations(c) {
		args = append(args, "--annotation", k+"="+v)
	}
	if c.Dir != "" {
		args = append(args, "--workdir", c.Dir)
	}
	for _, d := range c.Binds {
		args = append(args, "-v", d+":"+d)
	}
	for _, d := range c.ReadOnly {
		args = append(args, "-v", d+":"+d+":ro")
	}
	if c.ResolvConf != "" {
		args = append(args, "-v", c.ResolvConf+":/etc/resolv.conf:ro")
	}
	for _, d := range c.Devices {
		args = append(args, "--device", d+":"+d+":r")
	}
	for _, e := range c.Env {
		args = append(args, "--env", e)
	}
	cmd := exec.CommandContext(ctx, "podman")
	cmd.Stdout, cmd.Stderr = c.Stdout, c.ErrOut
	var argv []string
	cmd.ExtraFiles, argv = handDown(c)
	if len(cmd.ExtraFiles) > 0 {
		args = append(args, "--preserve-fds", strconv.Itoa(len(cmd.ExtraFiles)))
	}
	// --rootfs makes the first argument after the options the root, in
	// the image's place; the command follows it.
	cmd.Args = append(append(append([]string{"podman"}, args...), "--rootfs", p.e.rootOf(c)), argv...)
	return exitCode(cmd.Run())
}
