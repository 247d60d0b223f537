//go:build linux

// Package testenv gives system tests and benchmarks a trialnet host of
// their own: a parent cgroup, bpffs pins and a namespace directory that
// nothing else uses, removed when the test ends.
package testenv

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/sandbox"
	"golang.org/x/sys/unix"
)

func suffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// IsolatedHost is a host configuration of the test's own, so that tests
// running at the same time never see each other's Trials.
func IsolatedHost(t testing.TB, name string) agent.Config {
	t.Helper()
	mount, err := sandbox.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	s := suffix()
	cfg := agent.Config{
		Parent:   filepath.Join(mount, "trialnet-"+name+"-"+s),
		PinDir:   bpf.DefaultPinDir + "-" + name + "-" + s,
		NetnsDir: t.TempDir(),
		StateDir: t.TempDir(),
	}
	if err := os.Mkdir(cfg.Parent, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Sweep(cfg) })
	return cfg
}

// Sweep removes everything under an isolated host, even what a failed
// test left: Trials (processes, cgroups, namespaces), pins and the parent.
func Sweep(cfg agent.Config) {
	_ = agent.Uninstall(cfg, "", true)
	_ = os.Remove(cfg.Parent)
}

// PlainCgroup is a cgroup outside any trialnet parent: no eBPF applies.
func PlainCgroup(t testing.TB, name string) string {
	t.Helper()
	mount, err := sandbox.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(mount, "trialnet-"+name+"-plain-"+suffix())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = KillAndRemove(dir) })
	return dir
}

// KillAndRemove kills everything in a cgroup and removes it, with the
// launch lock of any command started in it.
func KillAndRemove(dir string) error {
	if id, err := bpf.CgroupID(dir); err == nil {
		defer sandbox.RemoveLaunchLock(id)
		// A launch into a cgroup made by hand (sandbox.Attach) makes its
		// cgroup v1 pool groups, which only a Trial's own Close removes.
		defer func() {
			for _, g := range v1PoolGroups(id) {
				_ = rmdirSoon(g)
			}
		}()
	}
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	return rmdirSoon(dir)
}

// rmdirSoon removes the cgroup dir once its killed processes are gone
// (bounded).
func rmdirSoon(dir string) error {
	for range 100 {
		if err := unix.Rmdir(dir); err == nil || os.IsNotExist(err) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return unix.Rmdir(dir)
}

// v1PoolGroups are the cgroup v1 pool groups of the cgroup whose id is
// cgroupID, in each v1 hierarchy mounted here.
func v1PoolGroups(cgroupID uint64) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	name := "trialnet-" + strconv.FormatUint(cgroupID, 10)
	var out []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, fstype := strings.Fields(pre), strings.Fields(post)
		if ok && len(fields) >= 5 && len(fstype) > 0 && fstype[0] == "cgroup" {
			out = append(out, filepath.Join(fields[4], sandbox.ParentName, name))
		}
	}
	return out
}

// SeedBwrap is bwrap in the shape the seed runs each Harness in: the host
// read-only, its own /dev, /proc (in a PID namespace of its own) and /tmp,
// a fresh home with one login file bound in read-write, a new session, and
// death with its parent. extra come before the command (--unshare-net).
func SeedBwrap(home, login string, extra ...string) []string {
	args := []string{"bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
		"--tmpfs", home, "--bind", login, filepath.Join(home, filepath.Base(login)), "--setenv", "HOME", home,
		"--unshare-pid", "--new-session", "--die-with-parent"}
	return append(append(args, extra...), "--")
}

// ServedAgent starts an agent of cfg on an isolated host, with a data
// directory (and, unless cfg names some, a resolver that answers
// nothing), serving its control API on dir/agent.sock; everything ends
// with the test.
func ServedAgent(t testing.TB, name string, cfg agent.AgentConfig) (a *agent.Agent, dir, sock string) {
	t.Helper()
	dir = t.TempDir()
	cfg.Host, cfg.DataDir = IsolatedHost(t, name), filepath.Join(dir, "data")
	if cfg.Resolvers == nil {
		cfg.Resolvers = []string{"127.0.0.1:9"}
	}
	a, err := agent.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(true) })
	sock = filepath.Join(dir, "agent.sock")
	ln, err := agent.ListenSocket(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := a.Server()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return a, dir, sock
}

// StartIn starts a process in cgroup, in the network namespace at netns
// ("": the host's), with new namespaces flags, as a runtime places a
// container before its hooks run; it returns the pid once the process is
// there, and kills it with the test.
func StartIn(t testing.TB, cgroup, netns string, flags uintptr) int {
	t.Helper()
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	args := []string{"sh", "-c", "echo ready; exec sleep 600"}
	if netns != "" {
		args = append([]string{"nsenter", "--net=" + netns, "--"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("the process did not start: %q %v", line, err)
	}
	return cmd.Process.Pid
}
