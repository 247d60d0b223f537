//go:build linux

// Package ctr runs a command in a container that joins a Trial, for the
// suites that try again, from inside a container, what they try from a
// process Trial (test/escape, test/clients). A Runner is one container
// runtime: podman with crun, and runc with a bundle, here; another
// (Docker's) plugs in by implementing Runner. Every container is started
// as docs/containers.md says (the Trial's network namespace, a cgroup
// under the Trial's, trialnet.io/trial, the proxy's variables) with
// trialnet oci-hook at createRuntime, so it is the guard's to admit.
//
// The containers' root is a Debian one made from the host's: its /usr and
// /etc bound read-only, its own /proc, /dev, /sys and /tmp, and the
// directories a Cmd names bound at the same path. No image can be pulled
// here, and the kernel matrix's guests share the host's root, so the
// clients installed on the host are those the containers run.
package ctr

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// Cmd is one command to run in a container in Trial.
type Cmd struct {
	Trial client.TrialInfo
	Args  []string
	// Env is the process's whole environment: add ProxyEnv for the
	// proxy's variables.
	Env      []string
	UID, GID int
	Dir      string // the working directory ("": /)
	// Binds are host directories the container sees at the same path,
	// writable; ReadOnly the same, read-only.
	Binds, ReadOnly []string
	// ResolvConf, if set, is a host file bound over /etc/resolv.conf
	// (a transparent Trial's stub).
	ResolvConf string
	// Stdin and Stderr, if set, are the process's own descriptors 0 and 2,
	// handed through the runtime as they are (a socket stays a socket, a
	// terminal a terminal); otherwise stdin is empty and standard error
	// goes to ErrOut.
	Stdin, Stderr *os.File
	// Stdout is the process's standard output; ErrOut its standard error
	// when Stderr is nil, and the runtime's own messages.
	Stdout, ErrOut io.Writer
	// Devices are host block devices the container is given, read-only,
	// at the same path (an attacker's bundle: the host's disk).
	Devices []string
	// Root, if set, is the container's root in place of the Debian one
	// (an attacker's bundle: the host's /).
	Root string
	// Annotations are more annotations for the container.
	Annotations map[string]string
	// RuntimeSeccomp runs it with the runtime's own seccomp profile
	// (podman's default, which lets the key calls run; none in a bundle)
	// in place of the one trialnet oci-hook install wrote: the hook
	// refuses it.
	RuntimeSeccomp bool
}

// Runner runs a command in a container in a Trial and returns its exit
// status; err is for a runtime that could not run it at all.
type Runner interface {
	Name() string
	Run(ctx context.Context, c Cmd) (int, error)
}

// ProxyEnv is the proxy's environment of every container in a Trial:
// what trialnet's launcher gives the commands it starts there, which
// docs/containers.md gives containers.
func ProxyEnv(info client.TrialInfo) []string {
	return trial.ProxyEnv(info.ProxyURL)
}

// Env is what every runner shares: trialnet's binary, the agent's control
// socket, a hooks directory holding trialnet's entry, the seccomp profile
// that install wrote beside it, and the root.
type Env struct {
	Bin, Sock, Hooks, Seccomp string
	root                      string
	mount                     string // the cgroup2 mount
}

// New prepares containers for the agent serving sock: it builds trialnet
// (or takes the kernel matrix's, TRIALNET_TEST_BIN), installs the hook in
// a hooks directory of the test's own (and its seccomp profile beside
// it) and makes the Debian root.
func New(t testing.TB, sock string) *Env {
	t.Helper()
	e := &Env{Sock: sock, Bin: os.Getenv("TRIALNET_TEST_BIN")}
	if e.Bin == "" {
		e.Bin = filepath.Join(t.TempDir(), "trialnet")
		testkit.BuildTrialnet(t, moduleRoot(t), e.Bin)
		testkit.BuildTrialnetOCI(t, moduleRoot(t), e.Bin) // what oci-hook install writes
	}
	var err error
	if e.mount, err = cgroup2.Mount(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e.Hooks, e.Seccomp, e.root = filepath.Join(dir, "hooks.d"), filepath.Join(dir, "seccomp.json"), filepath.Join(dir, "root")
	if out, err := exec.Command(e.Bin, "oci-hook", "install", "--hooks-dir", e.Hooks, "--seccomp-profile", e.Seccomp, "--socket", sock).CombinedOutput(); err != nil {
		t.Fatalf("trialnet oci-hook install: %v\n%s", err, out)
	}
	if err := DebianRoot(e.root); err != nil {
		t.Fatal(err)
	}
	return e
}

// moduleRoot is the module's top, above the test's directory.
func moduleRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for ; filepath.Dir(dir) != dir; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
	}
	t.Fatal("no go.mod above the test's directory")
	return ""
}

// DebianRoot makes root a root whose /usr and /etc are the host's (bound
// by each runner, read-only) and whose /bin, /sbin and /lib* lead into
// /usr, as on a merged-/usr Debian.
func DebianRoot(root string) error {
	for _, d := range []string{"usr", "etc", "proc", "sys", "dev", "tmp", "run", "root", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib32", "lib64"} {
		if _, err := os.Stat(filepath.Join("/usr", l)); err != nil {
			continue
		}
		if err := os.Symlink("usr/"+l, filepath.Join(root, l)); err != nil {
			return err
		}
	}
	return nil
}

// Runners are the runtimes this host can run, each prepared: podman with
// crun where cgroup v2 is alone on /sys/fs/cgroup (crun refuses a hybrid
// host; TRIALNET_REQUIRE_CONTAINERS=1, set in the kernel matrix's guests,
// makes its absence a failure), and runc everywhere.
func (e *Env) Runners(t testing.TB) []Runner {
	t.Helper()
	var rs []Runner
	if Unified() {
		for _, tool := range []string{"podman", "crun", "conmon"} {
			privtest.RequireTool(t, tool)
		}
		rs = append(rs, e.Podman(t))
	} else if os.Getenv("TRIALNET_REQUIRE_CONTAINERS") == "1" {
		t.Fatal("TRIALNET_REQUIRE_CONTAINERS=1, but cgroup v2 is not alone on /sys/fs/cgroup: podman and crun cannot run")
	} else {
		t.Log("podman with crun is not run: it needs cgroup v2 alone on /sys/fs/cgroup, which this host lacks (make vmtest runs it)")
	}
	privtest.RequireTool(t, "runc")
	return append(rs, e.Runc(t))
}

// Unified says whether cgroup v2 is alone on /sys/fs/cgroup.
func Unified() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// cgroupOf is the Trial's cgroup relative to the cgroup2 mount.
func (e *Env) cgroupOf(info client.TrialInfo) string {
	return strings.TrimPrefix(info.Cgroup, e.mount)
}

// annotations are the container's: trialnet's claim on the Trial and c's.
func annotations(c Cmd) map[string]string {
	a := map[string]string{"trialnet.io/trial": c.Trial.ID}
	for k, v := range c.Annotations {
		a[k] = v
	}
	return a
}

// handDown is how c's Stdin and Stderr reach the process as they are:
// both runtimes relay standard streams over pipes of their own (conmon's,
// or runc's when it has no terminal), so each is handed down as a
// preserved descriptor (3, 4) and moved into place by the container's
// shell. It returns the descriptors to preserve and the command to run.
func handDown(c Cmd) ([]*os.File, []string) {
	var files []*os.File
	script := "exec"
	for _, f := range []struct {
		file  *os.File
		redir string
	}{{c.Stdin, "0<&"}, {c.Stderr, "2>&"}} {
		if f.file != nil {
			n := strconv.Itoa(3 + len(files))
			files = append(files, f.file)
			script += " " + f.redir + n + " " + n + "<&-"
		}
	}
	if len(files) == 0 {
		return nil, c.Args
	}
	return files, append([]string{"/bin/sh", "-c", script + ` "$@"`, "sh"}, c.Args...)
}

// rootOf is c's root.
func (e *Env) rootOf(c Cmd) string {
	if c.Root != "" {
		return c.Root
	}
	return e.root
}

// exitCode is the status of a run that ended, or err.
func exitCode(err error) (int, error) {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return -1, fmt.Errorf("run the container: %w", err)
	}
	return 0, nil
}
