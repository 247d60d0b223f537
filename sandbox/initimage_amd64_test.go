//go:build linux && amd64

package sandbox

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/trial"
)

// earlyInitTables reads init_early.c's tables (TestEarlyInitTables) from
// the embedded init itself, by their symbols: what it mounts with.
func earlyInitTables() (ptys int, resolv string, dirs, shared, remote []string) {
	f, err := elf.NewFile(bytes.NewReader(initELF))
	if err != nil {
		panic(fmt.Sprintf("the embedded init: %v", err))
	}
	syms, err := f.Symbols()
	if err != nil {
		panic(fmt.Sprintf("the embedded init's symbols: %v", err))
	}
	// at is n bytes of the image at virtual address addr.
	at := func(addr, n uint64) []byte {
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && addr >= p.Vaddr && addr+n <= p.Vaddr+p.Filesz {
				b := make([]byte, n)
				if _, err := p.ReadAt(b, int64(addr-p.Vaddr)); err == nil {
					return b
				}
			}
		}
		panic(fmt.Sprintf("the embedded init has no %d bytes at %#x", n, addr))
	}
	str := func(addr uint64) string {
		var s []byte
		for b := at(addr, 1); b[0] != 0; b = at(addr, 1) {
			s, addr = append(s, b[0]), addr+1
		}
		return string(s)
	}
	sym := func(name string) elf.Symbol {
		for _, s := range syms {
			if s.Name == name {
				return s
			}
		}
		panic("the embedded init has no symbol " + name)
	}
	le := binary.LittleEndian
	ptys = int(int32(le.Uint32(at(sym("trialnet_init_max_ptys").Value, 4))))
	resolv = str(le.Uint64(at(sym("trialnet_init_resolv_conf").Value, 8)))
	// struct trialnet_own_dir: two pointers and a long long.
	own := sym("trialnet_init_own_dirs")
	for off := uint64(0); off < own.Size; off += 24 {
		e := at(own.Value+off, 24)
		dirs = append(dirs, fmt.Sprintf("%s=%s %d", str(le.Uint64(e)), str(le.Uint64(e[8:])), int64(le.Uint64(e[16:]))))
	}
	// trialnet_init_shared_dirs: pointers to the directories' names.
	sh, size := sym("trialnet_init_shared_dirs"), int64(le.Uint64(at(sym("trialnet_init_shared_bytes").Value, 8)))
	for off := uint64(0); off < sh.Size; off += 8 {
		shared = append(shared, fmt.Sprintf("%s %d", str(le.Uint64(at(sh.Value+off, 8))), size))
	}
	// trialnet_init_remote_fs: pointers to the types' names.
	rf := sym("trialnet_init_remote_fs")
	for off := uint64(0); off < rf.Size; off += 8 {
		remote = append(remote, str(le.Uint64(at(rf.Value+off, 8))))
	}
	return ptys, resolv, dirs, shared, remote
}

// The memfd every Trial's init runs from is shared by all of this
// process's Trials: nothing may change it, not even its holder.
func TestInitImageIsSealed(t *testing.T) {
	f, own, err := initImage()
	if err != nil {
		t.Fatal(err)
	}
	if own {
		defer f.Close()
	}
	got := make([]byte, len(initELF)+1)
	if n, _ := f.ReadAt(got, 0); !bytes.Equal(got[:n], initELF) {
		t.Fatalf("the init's memfd holds %d bytes, not the %d of the embedded init", n, len(initELF))
	}
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || seals&initSeals != initSeals {
		t.Errorf("the init's memfd has seals %#x (%v), want at least %#x", seals, err, initSeals)
	}
	// On a kernel with F_SEAL_EXEC (6.3+), its mode is sealed too.
	if execSealable(t) && seals&unix.F_SEAL_EXEC == 0 {
		t.Errorf("the init's memfd has seals %#x: no F_SEAL_EXEC, which this kernel has", seals)
	}
	// Another open of the same memfd, as /proc/1/exe would give one.
	rw, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	for _, c := range []struct {
		what string
		do   func() error
	}{
		{"write", func() error { _, err := f.WriteAt([]byte{0}, 0); return err }},
		{"write through another open", func() error { _, err := rw.WriteAt([]byte("#!/bin/sh\n"), 0); return err }},
		{"append", func() error { _, err := rw.WriteAt([]byte{0}, int64(len(initELF))); return err }},
		{"shrink", func() error { return rw.Truncate(0) }},
		{"grow", func() error { return rw.Truncate(int64(len(initELF)) + 4096) }},
		{"map writable", func() error {
			b, err := unix.Mmap(int(rw.Fd()), 0, len(initELF), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err == nil {
				_ = unix.Munmap(b)
			}
			return err
		}},
		{"add a seal", func() error { _, err := unix.FcntlInt(rw.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); return err }},
		{"chmod", func() error {
			if seals&unix.F_SEAL_EXEC == 0 {
				return unix.EPERM // no F_SEAL_EXEC on this kernel: checked above
			}
			return rw.Chmod(0)
		}},
	} {
		if err := c.do(); !errors.Is(err, unix.EPERM) {
			t.Errorf("%s on the init's memfd: %v, want EPERM", c.what, err)
		}
	}
	if n, _ := f.ReadAt(got, 0); !bytes.Equal(got[:n], initELF) {
		t.Errorf("the init's memfd changed")
	}
}

// execSealable says whether this kernel knows F_SEAL_EXEC.
func execSealable(t *testing.T) bool {
	fd, err := unix.MemfdCreate("probe", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_EXEC)
	return err == nil
}

// make generate rebuilds the committed init byte for byte (check-generate
// in CI holds it so): what runs is what its sources say.
func TestInitImageIsReproducible(t *testing.T) {
	if _, err := exec.LookPath("musl-gcc"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no musl-gcc (make deps installs musl-tools): the committed init cannot be checked")
		}
		t.Skip("no musl-gcc (make deps installs musl-tools)")
	}
	out := filepath.Join(t.TempDir(), "init.elf")
	cmd := exec.Command("make", "-s", "-C", "..", "init-elf", "INIT_ELF="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make init-elf: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, initELF) {
		t.Errorf("the init built from these sources (%d bytes) is not the embedded one (%d bytes): run make generate and commit sandbox/init_amd64.elf", len(got), len(initELF))
	}
}

// A Trial's PID 1 runs from the sealed memfd: its /proc/1/exe is not the
// trialnet binary, and a uid-0 command of the Trial that opens it can
// neither change nor replace what the next Trial's init runs.
func TestPrivilegedInitExeIsTheSealedImage(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	code, out := runProbeAs(t, tr, 0, Command{}, "swap-init")
	if code != probeOK {
		t.Fatalf("swap-init: %d %s", code, out)
	}
	// Where Landlock scopes ptrace, a command cannot even open it (the
	// init is outside its domain); elsewhere the seals hold.
	if refused := strings.HasSuffix(out, " open EACCES") || strings.HasSuffix(out, " open EPERM"); !refused {
		if !strings.HasPrefix(out, "exe /memfd:trialnet-init ") {
			t.Errorf("inside the Trial, /proc/1/exe is %q, want the memfd trialnet-init", out)
		}
		want := " write EPERM truncate EPERM chmod "
		if execSealable(t) {
			want += "EPERM"
		}
		if !strings.Contains(out, want) {
			t.Errorf("a uid-0 command's changes to /proc/1/exe: %q, want %q", out, want)
		}
	}
	init, err := findInit(tr.Cgroup)
	if err != nil || init.pidfd < 0 {
		t.Fatalf("the Trial's init: %v", err)
	}
	defer unix.Close(init.pidfd)
	var host, pid1 unix.Stat_t
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(self, &host); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat("/proc/"+strconv.Itoa(init.pid)+"/exe", &pid1); err != nil {
		t.Fatal(err)
	}
	if pid1.Dev == host.Dev && pid1.Ino == host.Ino {
		t.Errorf("the Trial's init runs the host's trialnet binary %s", self)
	}
	image, err := sharedImage()
	if err != nil {
		t.Fatal(err)
	}
	if image != nil { // nil: each init has a memfd of its own (initImage)
		var mem unix.Stat_t
		if err := unix.Fstat(int(image.Fd()), &mem); err != nil {
			t.Fatal(err)
		}
		if pid1.Dev != mem.Dev || pid1.Ino != mem.Ino {
			t.Errorf("the Trial's init runs %d:%d, not the sealed memfd %d:%d", pid1.Dev, pid1.Ino, mem.Dev, mem.Ino)
		}
	}
	got, err := os.ReadFile("/proc/" + strconv.Itoa(init.pid) + "/exe")
	if !bytes.Equal(got, initELF) {
		t.Errorf("the init's memfd changed: %v", err)
	}
}

// BenchmarkInitStart times a Trial's init alone, from its start to its
// ready byte and the end of its pipe (the set-up done, the reaper's exec
// begun: what a first command waits for), and on to the reaper asleep,
// with the CPU the init used in all. TRIALNET_BASELINE_BIN names an
// earlier build of trialnet, whose init is that binary itself (early.c's
// constructor), timed in the same loop.
func BenchmarkInitStart(b *testing.B) {
	benchInitStart(b, initArgs(false, false, "", nil, nil, nil))
}

// BenchmarkInitStartMasked is BenchmarkInitStart with the set-up a
// launcher asks for by default: transparent mode (the Trial's
// resolv.conf) and trialnet's directories hidden.
func BenchmarkInitStartMasked(b *testing.B) {
	benchInitStart(b, initArgs(false, true, "", hiddenDirs(b.TempDir()), nil, nil))
}

func benchInitStart(b *testing.B, args []string) {
	privtest.Require(b)
	filter, err := seccompFile(false)
	if err != nil {
		b.Fatal(err)
	}
	builds := []struct {
		name string
		cmd  func(ready *os.File) (*exec.Cmd, error)
	}{{"", func(ready *os.File) (*exec.Cmd, error) {
		cmd, release, err := initCommand(args, ready, filter)
		if err == nil {
			b.Cleanup(release)
		}
		return cmd, err
	}}}
	if base := os.Getenv("TRIALNET_BASELINE_BIN"); base != "" {
		builds = append(builds, struct {
			name string
			cmd  func(ready *os.File) (*exec.Cmd, error)
		}{"baseline-", func(ready *os.File) (*exec.Cmd, error) {
			return &exec.Cmd{Path: base, Args: args, ExtraFiles: []*os.File{ready, filter}}, nil
		}})
	}
	ready := make([][]time.Duration, len(builds))
	asleep := make([][]time.Duration, len(builds))
	cpu := make([][]time.Duration, len(builds))
	for b.Loop() {
		for i, build := range builds {
			r, a, c := startInitOnce(b, build.cmd)
			ready[i], asleep[i], cpu[i] = append(ready[i], r), append(asleep[i], a), append(cpu[i], c)
		}
	}
	for i, build := range builds {
		for _, m := range []struct {
			name string
			ds   []time.Duration
		}{{"ready", ready[i]}, {"asleep", asleep[i]}, {"cpu", cpu[i]}} {
			slices.Sort(m.ds)
			b.ReportMetric(float64(m.ds[len(m.ds)/2].Microseconds()), build.name+m.name+"-p50-µs")
		}
	}
}

// startInitOnce starts an init in PID, mount and IPC namespaces of its
// own and ends it once its reaper sleeps.
func startInitOnce(b *testing.B, command func(ready *os.File) (*exec.Cmd, error)) (ready, asleep, cpu time.Duration) {
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	cmd, err := command(w)
	if err != nil {
		b.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC}
	start := time.Now()
	err = cmd.Start()
	_ = w.Close()
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}()
	if msg, _ := io.ReadAll(r); len(msg) != 1 {
		b.Fatalf("the init: %q", execMessage(msg))
	}
	ready = time.Since(start)
	// The reaper, past its loader and its signals: asleep in pause.
	stat := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
	cmdline := fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid)
	for {
		c, _ := os.ReadFile(cmdline)
		s, _ := os.ReadFile(stat)
		if string(c) == initArg0+"\x00" && bytes.Contains(s, []byte(") S ")) {
			return ready, time.Since(start), 0
		}
		runtime.Gosched()
	}
}

// A build without its init (a checkout whose init_amd64.elf was emptied,
// a merge that lost it) says so, and what to do, at the first Trial.
func TestInitImageMissingSaysWhatToDo(t *testing.T) {
	saved := initELF
	t.Cleanup(func() { initELF = saved })
	for _, image := range [][]byte{nil, []byte("version https://git-lfs.github.com/spec/v1\n")} {
		initELF = image
		f, err := initMemfd()
		if err == nil {
			_ = f.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "missing from this build") || !strings.Contains(err.Error(), "make generate") {
			t.Errorf("an init of %q: %v, want it named missing, with make generate", image, err)
		}
	}
}

// Where vm.memfd_noexec is 2 (Linux 6.3+, per PID namespace), no memfd
// may be executed: the init runs from a read-only tmpfs of trialnet's
// own instead, which neither root's write nor its chmod changes, and the
// doctor says so. The setting is made in a PID namespace of the test's
// own, which it ends with.
func TestPrivilegedInitImageUnderMemfdNoexec(t *testing.T) {
	if mode := os.Getenv("TRIALNET_MEMFD_NOEXEC"); mode != "" {
		if err := os.WriteFile("/proc/sys/vm/memfd_noexec", []byte("2"), 0); err != nil {
			fmt.Println("set vm.memfd_noexec:", err)
			return
		}
		if mode == "nomount" {
			// No CAP_SYS_ADMIN on this thread, which makes the image:
			// the fall-back cannot mount its tmpfs either.
			runtime.LockOSThread()
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var caps [2]unix.CapUserData
			err := unix.Capget(&hdr, &caps[0])
			if err == nil {
				caps[0].Effective &^= 1 << unix.CAP_SYS_ADMIN
				err = unix.Capset(&hdr, &caps[0])
			}
			if err != nil {
				fmt.Println("drop CAP_SYS_ADMIN:", err)
				return
			}
			_, release, err := initCommand([]string{initArg0})
			release()
			fmt.Println("initCommand:", err)
			return
		}
		_, err := initMemfd()
		fmt.Println("initMemfd:", err)
		from, err := CheckInitImage()
		fmt.Printf("CheckInitImage: %s %v\n", from, err)
		image, _, err := initImage()
		if err != nil {
			return
		}
		self := "/proc/self/fd/" + strconv.Itoa(int(image.Fd()))
		_, err = os.OpenFile(self, os.O_WRONLY, 0)
		fmt.Println("write:", errors.Is(err, unix.EROFS))
		fmt.Println("chmod:", errors.Is(os.Chmod(self, 0o777), unix.EROFS), errors.Is(unix.Fchmod(int(image.Fd()), 0o777), unix.EROFS))
		cmd, release, err := initCommand([]string{initArg0})
		if err == nil {
			err = cmd.Start()
			release()
		}
		if err == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		fmt.Println("exec:", err)
		return
	}
	privtest.Require(t)
	if _, err := os.Stat("/proc/sys/vm/memfd_noexec"); err != nil {
		t.Skip("no vm.memfd_noexec (Linux 6.3+): every memfd may be executed")
	}
	host, err := os.ReadFile("/proc/sys/vm/memfd_noexec")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPrivilegedInitImageUnderMemfdNoexec$")
	cmd.Env = append(os.Environ(), "TRIALNET_MEMFD_NOEXEC=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, want := range []string{
		"initMemfd: vm.memfd_noexec is 2 in this PID namespace, which forbids executing any memfd (permission denied)",
		"CheckInitImage: a read-only tmpfs of its own (vm.memfd_noexec is 2: no memfd may be executed) <nil>",
		"write: true", "chmod: true true", "exec: <nil>",
	} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("under vm.memfd_noexec=2: %s; want %q", out, want)
		}
	}
	// Neither: the error says why each failed and what to do, and the
	// launcher's deferred release does not panic.
	cmd = exec.Command(os.Args[0], "-test.run=^TestPrivilegedInitImageUnderMemfdNoexec$")
	cmd.Env = append(os.Environ(), "TRIALNET_MEMFD_NOEXEC=nomount")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID}
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("without CAP_SYS_ADMIN: %v: %s", err, out)
	}
	want := "initCommand: make the image a Trial's init is executed from: vm.memfd_noexec is 2 in this PID namespace, " +
		"which forbids executing any memfd (permission denied), and the fall-back, a read-only tmpfs of trialnet's own, " +
		"failed to open a tmpfs: operation not permitted: set vm.memfd_noexec to 1 or 0 where the agent runs"
	if !strings.Contains(string(out), want) {
		t.Errorf("under vm.memfd_noexec=2 without CAP_SYS_ADMIN: %s; want %q", out, want)
	}
	if after, err := os.ReadFile("/proc/sys/vm/memfd_noexec"); err != nil || !bytes.Equal(after, host) {
		t.Errorf("the host's vm.memfd_noexec was %q, is %q (%v)", host, after, err)
	}
}

// Where the kernel cannot seal the init image's mode (no F_SEAL_EXEC,
// before 6.3), its owner, uid 0, may chmod it: a Trial's uid-0 command
// can, through its init's /proc/1/exe, wherever nothing scopes ptrace to
// its own domain (no Landlock, or a nested Trial below Landlock ABI 6,
// which the LSM layer lets reach its own PID 1). The test does that
// chmod from the host, on a kernel made to lack F_SEAL_EXEC: the next
// Trial's init still starts.
func TestPrivilegedInitImageChmodStopsNoLaterTrial(t *testing.T) {
	shared := sharedImage
	initSealExec, sharedImage = 0, sync.OnceValues(newSharedImage)
	t.Cleanup(func() { initSealExec, sharedImage = unix.F_SEAL_EXEC, shared })
	h := newHost(t)
	first := newTrial(t, h, trial.Spec{UnixOpen: true})
	if code, out := runProbeAs(t, first, 0, Command{}, "read", "/proc/self/comm"); code != probeOK {
		t.Fatalf("the first Trial's command: %d %s", code, out)
	}
	init, err := findInit(first.Cgroup)
	if err != nil || init.pidfd < 0 {
		t.Fatalf("the first Trial's init: %v", err)
	}
	defer unix.Close(init.pidfd)
	if err := os.Chmod("/proc/"+strconv.Itoa(init.pid)+"/exe", 0); err != nil {
		t.Fatalf("chmod the first Trial's init image: %v (the test needs an image whose mode is not sealed)", err)
	}
	next := newTrial(t, h, trial.Spec{UnixOpen: true})
	if code, out := runProbeAs(t, next, 0, Command{}, "read", "/proc/self/comm"); code != probeOK {
		t.Fatalf("the next Trial's command after the first's uid 0 chmodded its init image: %d %s", code, out)
	}
}
