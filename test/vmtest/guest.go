//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// moduleInitCompressedFile asks finit_module to decompress the module
// itself (Linux 6.6+, CONFIG_MODULE_DECOMPRESS), for .ko.xz and .ko.zst.
const moduleInitCompressedFile = 4

// guestMain is PID 1 of the VM: it loads the modules the root share
// needs, mounts the host's root read-only with fresh writable /tmp, /run
// and /var, runs the plan's steps, writes their output to the results
// port (the second serial line) and powers off. It never returns.
func guestMain() {
	err := guest()
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmtest guest: %v\n", err)
	}
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}

func guest() error {
	for _, m := range []struct{ src, dst, fs string }{{"proc", "/proc", "proc"}, {"sys", "/sys", "sysfs"}, {"dev", "/dev", "devtmpfs"}} {
		if err := mount(m.src, m.dst, m.fs, 0, ""); err != nil {
			return err
		}
	}
	if err := loadInitramfsModules("/modules"); err != nil {
		return err
	}
	planPath := cmdlineValue("vmtest.plan")
	if planPath == "" {
		return errors.New("no vmtest.plan= on the kernel command line")
	}
	if err := switchToHostRoot(); err != nil {
		return err
	}
	var p plan
	b, err := os.ReadFile(planPath)
	if err != nil {
		return fmt.Errorf("read the plan: %w", err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return fmt.Errorf("parse the plan %s: %w", planPath, err)
	}
	if err := loUp(); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	_ = unix.Sethostname([]byte("vmtest"))
	// As on the development machines: TIOCSTI works for anyone (Debian
	// turns it off from 6.2 on), so that the tests see a Trial refused
	// what the kernel would otherwise allow.
	_ = os.WriteFile("/proc/sys/dev/tty/legacy_tiocsti", []byte("1"), 0)
	for _, m := range p.Modules {
		if out, err := exec.Command("/sbin/modprobe", m).CombinedOutput(); err != nil {
			fmt.Printf("vmtest guest: modprobe %s: %v %s\n", m, err, out)
		}
	}
	res, err := os.OpenFile("/dev/ttyS1", os.O_WRONLY|unix.O_NOCTTY, 0)
	if err != nil {
		return fmt.Errorf("open the results port: %w", err)
	}
	if err := rawTTY(int(res.Fd())); err != nil {
		return fmt.Errorf("results port: %w", err)
	}
	release, lsms := kernelRelease(), activeLSMs()
	fmt.Fprintf(res, "%s%s lsm=%s\n", markHeader, release, lsms)
	requireLSM := slices.Contains(strings.Split(lsms, ","), "bpf")
	for _, s := range p.Steps {
		runStep(res, s, requireLSM)
	}
	fmt.Fprintln(res, markDone)
	return res.Close()
}

// mount makes dst and mounts on it, with the error saying what failed.
func mount(src, dst, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", fstype, dst, err)
	}
	return nil
}

// loadInitramfsModules loads dir's modules in the order of dir/order
// (dependencies first, as the host resolved them from modules.dep).
func loadInitramfsModules(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "order"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, name := range strings.Fields(string(b)) {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		flags := 0
		if !strings.HasSuffix(name, ".ko") {
			flags = moduleInitCompressedFile
		}
		err = unix.FinitModule(int(f.Fd()), "", flags)
		_ = f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return nil
}

func cmdlineValue(key string) string {
	if v := cmdlineValues(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// cmdlineValues are the values of every key= on the kernel command line.
func cmdlineValues(key string) []string {
	b, _ := os.ReadFile("/proc/cmdline")
	var out []string
	for _, f := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			out = append(out, v)
		}
	}
	return out
}

// guestMounts are what the guest mounts over the host's root, in order.
var guestMounts = []struct{ src, dst, fs, data string }{
	{"proc", "/proc", "proc", ""},
	{"sys", "/sys", "sysfs", ""},
	{"dev", "/dev", "devtmpfs", ""},
	{"devpts", "/dev/pts", "devpts", "mode=620,ptmxmode=666"},
	{"shm", "/dev/shm", "tmpfs", "mode=1777"},
	{"tmp", "/tmp", "tmpfs", "mode=1777"},
	{"run", "/run", "tmpfs", "mode=755"},
	{"var", "/var", "tmpfs", "mode=755"},
	{"cgroup2", "/sys/fs/cgroup", "cgroup2", "nsdelegate"},
	{"bpf", "/sys/fs/bpf", "bpf", "mode=700"},
	{"securityfs", "/sys/kernel/security", "securityfs", ""},
	{"tracefs", "/sys/kernel/tracing", "tracefs", ""},
	{"debugfs", "/sys/kernel/debug", "debugfs", ""},
}

// switchToHostRoot mounts the host's root (virtiofs tag "root") read-only,
// gives it what a booted system has (proc, sys, dev, cgroup2 alone so that
// every controller is there, bpffs, securityfs, tracefs) and fresh tmpfs
// where tests write, then makes it the root.
func switchToHostRoot() error {
	const nr = "/newroot"
	if err := mount("root", nr, "virtiofs", unix.MS_RDONLY, ""); err != nil {
		return err
	}
	// What the fresh mounts below would hide and the plan needs (a
	// checkout under /tmp): held aside, moved back on top of them.
	keeps := cmdlineValues("vmtest.keep")
	for i, k := range keeps {
		if err := mount(nr+k, fmt.Sprintf("/keep/%d", i), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
	}
	for _, m := range guestMounts {
		if err := mount(m.src, nr+m.dst, m.fs, 0, m.data); err != nil {
			return err
		}
	}
	// What systemd does at boot: the controllers a service may use are
	// enabled for the root's children, so that the Trial parent can
	// enable pids and memory for its Trials.
	if err := os.WriteFile(nr+"/sys/fs/cgroup/cgroup.subtree_control", []byte("+pids +memory"), 0); err != nil {
		return fmt.Errorf("enable the pids and memory controllers: %w", err)
	}
	for _, d := range []string{"/var/tmp", "/var/lib", "/var/cache", "/var/log", "/run/lock", "/tmp/home"} {
		if err := os.MkdirAll(nr+d, 0o755); err != nil {
			return err
		}
	}
	// As Debian's systemd makes them (tmpfiles.d's legacy.conf gives
	// /run/lock 1777): the boundary suite's shared-dir-file leaves a
	// file there, as any user may on a host.
	_ = os.Chmod(nr+"/var/tmp", 0o1777)
	_ = os.Chmod(nr+"/run/lock", 0o1777)
	_ = os.Symlink("/run", nr+"/var/run")
	_ = os.Symlink("/run/lock", nr+"/var/lock")
	for i, k := range keeps {
		if err := os.MkdirAll(nr+k, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(fmt.Sprintf("/keep/%d", i), nr+k, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("put %s back over the fresh mounts: %w", k, err)
		}
	}
	if err := unix.Chdir(nr); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	return unix.Chdir("/")
}

func loUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// rawTTY turns off output processing, so that the results arrive byte for
// byte (no \n to \r\n).
func rawTTY(fd int) error {
	t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return err
	}
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ICANON | unix.ISIG | unix.IEXTEN
	return unix.IoctlSetTermios(fd, unix.TCSETS, t)
}

func kernelRelease() string {
	var u unix.Utsname
	_ = unix.Uname(&u)
	return unix.ByteSliceToString(u.Release[:])
}

func activeLSMs() string {
	b, _ := os.ReadFile("/sys/kernel/security/lsm")
	return strings.TrimSpace(string(b))
}

// runStep runs s with its output framed on res. As PID 1 the guest reaps
// every orphan while it waits for the step's own process.
func runStep(res io.Writer, s step, requireLSM bool) {
	fmt.Printf("vmtest guest: %s\n", s.Name)
	fmt.Fprintf(res, "\n%s%s\n", markBegin, s.Name)
	start := time.Now()
	code := execStep(res, s, requireLSM)
	fmt.Fprintf(res, "\n%s%s exit=%d seconds=%.1f\n", markEnd, s.Name, code, time.Since(start).Seconds())
}

func execStep(res io.Writer, s step, requireLSM bool) int {
	env := append([]string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/go/bin",
		"HOME=/tmp/home", "TMPDIR=/tmp", "CI=true", "GOTRACEBACK=all",
	}, s.Env...)
	if requireLSM {
		env = append(env, "TRIALNET_REQUIRE_LSM=1")
	}
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(res, "vmtest guest: pipe: %v\n", err)
		return -1
	}
	null, _ := os.Open(os.DevNull)
	proc, err := os.StartProcess(s.Args[0], s.Args, &os.ProcAttr{
		Dir: s.Dir, Env: env, Files: []*os.File{null, w, w},
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	_ = w.Close()
	_ = null.Close()
	if err != nil {
		_ = r.Close()
		fmt.Fprintf(res, "vmtest guest: start %s: %v\n", s.Args[0], err)
		return -1
	}
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(res, r)
		close(copied)
	}()
	// A step past its time gets SIGQUIT (a Go binary prints every
	// goroutine's stack), then SIGKILL.
	timer := time.AfterFunc(time.Duration(s.Timeout)*time.Second, func() {
		_ = proc.Signal(syscall.SIGQUIT)
		time.AfterFunc(15*time.Second, func() { _ = proc.Kill() })
	})
	defer timer.Stop()
	code := -1
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			break
		}
		if pid == proc.Pid {
			code = ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
			break
		}
	}
	// An orphan that kept the pipe open must not hold up the next step.
	select {
	case <-copied:
	case <-time.After(3 * time.Second):
		_ = r.Close()
		<-copied
	}
	_ = r.Close()
	return code
}
