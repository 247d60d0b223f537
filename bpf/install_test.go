//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// loadMain is a copy of the test binary that runs one Load of
// "CGROUP PINDIR", closes it (the pins stay) and exits 0, or prints why not.
func loadMain(spec string) int {
	cg, pins, _ := strings.Cut(spec, " ")
	l, err := Load(Options{Cgroup: cg, PinDir: pins})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	_ = l.Close()
	return 0
}

// attached lists the program ids attached to cg for each cgroup hook.
func attached(t *testing.T, cg string) map[string][]ebpf.ProgramID {
	t.Helper()
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]ebpf.ProgramID{}
	unixHooks := haveUnixHooks() == nil
	for _, h := range hooks {
		if h.unix && !unixHooks {
			continue // a kernel before 6.7 cannot be asked about them
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: h.attach})
		if err != nil {
			t.Fatalf("query %s: %v", h.name, err)
		}
		for _, p := range res.Programs {
			out[h.name] = append(out[h.name], p.ID)
		}
	}
	return out
}

// TestPrivilegedParallelFirstLoad starts ten Loads at once, each in its
// own process, against a fresh pin directory and cgroup: every one
// succeeds and exactly one program is attached per hook.
func TestPrivilegedParallelFirstLoad(t *testing.T) {
	privtest.Require(t)
	cg := testCgroup(t)
	pins := testPins(t, cg)
	const n = 10
	var wg sync.WaitGroup
	outs := make([]string, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "TRIALNET_BPF_LOAD="+cg+" "+pins)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			b, err := cmd.CombinedOutput()
			outs[i], errs[i] = string(b), err
		}()
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("load %d: %v: %s", i, errs[i], outs[i])
		}
	}
	l, err := Load(Options{Cgroup: cg, PinDir: pins})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	progs := attached(t, cg)
	for _, h := range hooks {
		if h.unix && !l.UnixHooks() {
			continue
		}
		if len(progs[h.name]) != 1 {
			t.Errorf("%s: %d programs attached to the cgroup, want 1 (%v)", h.name, len(progs[h.name]), progs[h.name])
		}
	}
}

// TestPrivilegedLoadAdoptsPins: a second Load over the pins of the first
// loads nothing (the very programs stay attached) and its Loader works;
// a pinned link running some other program is not adopted but replaced.
func TestPrivilegedLoadAdoptsPins(t *testing.T) {
	l, opts := loadTest(t)
	before := attached(t, opts.Cgroup)
	lsm, unixHooks, lsmErr := l.LSM(), l.UnixHooks(), l.LSMError()
	tags := l.ProgramTags()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l2, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	after := attached(t, opts.Cgroup)
	for _, h := range hooks {
		if fmt.Sprint(before[h.name]) != fmt.Sprint(after[h.name]) {
			t.Errorf("%s: programs %v before, %v after the second Load: it loaded instead of adopting", h.name, before[h.name], after[h.name])
		}
	}
	if l2.LSM() != lsm || l2.UnixHooks() != unixHooks || (l2.LSMError() == nil) != (lsmErr == nil) {
		t.Errorf("adopted: LSM %v unix %v lsmErr %v; installed: %v %v %v", l2.LSM(), l2.UnixHooks(), l2.LSMError(), lsm, unixHooks, lsmErr)
	}
	// The tags a receipt names, kept from adoption, are the kernel's.
	if got := l2.ProgramTags(); len(got) == 0 || !maps.Equal(got, tags) {
		t.Errorf("adopted loader's program tags %v, the installed one's %v", got, tags)
	}
	for name, tag := range l2.ProgramTags() {
		info, err := l2.coll.Programs[name].Info()
		if err != nil {
			t.Fatal(err)
		}
		if info.Tag != tag {
			t.Errorf("%s: tag %q, the kernel's %q", name, tag, info.Tag)
		}
		// What adoption read of it, with two calls for two fields.
		want, _ := info.MapIDs()
		gotTag, got, err := tagAndMaps(l2.coll.Programs[name])
		if err != nil || gotTag != info.Tag || !slices.Equal(got, want) || len(got) == 0 {
			t.Errorf("%s: tagAndMaps = %q, %v, %v; Info says %q, %v", name, gotTag, got, err, info.Tag, want)
		}
	}
	if err := l2.AddTrial(42, Policy{NetnsCookie: 7, UnixOpen: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := l2.Counters(42); err != nil {
		t.Fatal(err)
	}
	if st, err := l2.RunStats(); err != nil || len(st) < len(hooks)-2 {
		t.Errorf("RunStats of the adopted loader: %v, %v", st, err)
	}
	// Swap an allow-all program into the pinned connect4 link, as a
	// different trialnet build (or anyone with the pin) could.
	other, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := l2.links[0].lk.Update(other); err != nil {
		t.Fatal(err)
	}
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	l3, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l3.Close()
	if !l3.HasTrial(42) {
		t.Error("the policy entry did not survive the reload")
	}
	info, err := other.Info()
	if err != nil {
		t.Fatal(err)
	}
	otherID, _ := info.ID()
	if ids := attached(t, opts.Cgroup)[hooks[0].name]; len(ids) != 1 || ids[0] == otherID {
		t.Fatalf("connect4 runs %v after Load; the foreign program %d must have been replaced", ids, otherID)
	}
}

// Why the LSM layer is missing is recorded for adopting Loads only when
// it will not pass by itself: a transient failure leaves no record, so
// the next Load installs again and retries the layer.
func TestInstallRecordsOnlyLastingLSMReasons(t *testing.T) {
	for _, c := range []struct {
		err    error
		record bool
	}{
		{fmt.Errorf("%w: load: %w", errLSMMissing, unix.EPERM), true},
		{fmt.Errorf("%w: load: %w", errLSMMissing, unix.ENOMEM), false},
		{fmt.Errorf("%w: load: %w", errLSMMissing, unix.EAGAIN), false},
	} {
		f, err := os.CreateTemp(t.TempDir(), "lock")
		if err != nil {
			t.Fatal(err)
		}
		lk := &installLock{f}
		lk.record(c.err, nil)
		if got := lk.note().lsmMiss != ""; got != c.record {
			t.Errorf("%v: recorded %v, want %v", c.err, got, c.record)
		}
		_ = f.Close()
	}
}

// A pinned map the kernel will not describe fails adoption with the map's
// name and what to do, not a bare errno; it is no reason to install over
// the pins either.
func TestPrivilegedUnreadableMapInfoSaysWhatToDo(t *testing.T) {
	privtest.Require(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	_ = m.Close() // the kernel describes no closed map
	_, err = pinnedMapID(trialnetMapPolicyMap, m)
	if err == nil || errors.Is(err, errPinsDiffer) {
		t.Fatalf("info of a closed map: %v; want an error, and not errPinsDiffer", err)
	}
	for _, want := range []string{"map " + trialnetMapPolicyMap + ": read its info", "'trialnet uninstall' removes the pins"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}

// Uninstall with a pin directory off bpffs (paths.pin_dir: /etc, in a
// config someone else could write) removes nothing there and says why.
// Seen red without removePins's bpffs check: the file was removed.
func TestPrivilegedUninstallOnlyOnBPFFS(t *testing.T) {
	privtest.Require(t)
	dir := t.TempDir()
	t.Cleanup(func() { _ = os.Remove(lockDir + "/" + lockName(dir)) })
	keep := dir + "/passwd"
	if err := os.WriteFile(keep, []byte("root:x:0:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := Uninstall(dir)
	if err == nil || !strings.Contains(err.Error(), "not on bpffs") {
		t.Errorf("Uninstall(%s): %v, want a refusal naming bpffs", dir, err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("Uninstall removed a file off bpffs: %v", err)
	}
}

// An adopted program's .rodata is checked by the kernel's own account of
// the map (its name, type, entries and value size, read without the
// map's fdinfo) and by its value: a map that is not a one-entry .rodata
// array, or one whose constants differ, is refused.
func TestPrivilegedSameRodataChecksTheMap(t *testing.T) {
	privtest.Require(t)
	want := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	for _, c := range []struct {
		name   string
		spec   ebpf.MapSpec
		value  []byte
		refuse string
	}{
		{"the same constants", ebpf.MapSpec{Name: "trialnet.rodata", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}, want, ""},
		{"other constants", ebpf.MapSpec{Name: "trialnet.rodata", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}, []byte{1, 2, 3, 4, 5, 6, 7, 9}, "constants"},
		{"not a .rodata", ebpf.MapSpec{Name: "trialnet_data", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}, want, "not a pinned map"},
		{"two entries", ebpf.MapSpec{Name: "trialnet.rodata", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 2}, want, "not a pinned map"},
		{"a hash", ebpf.MapSpec{Name: "trialnet.rodata", Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 1}, want, "not a pinned map"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := ebpf.NewMap(&c.spec)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.Put(uint32(0), c.value); err != nil {
				t.Fatal(err)
			}
			info, err := m.Info()
			if err != nil {
				t.Fatal(err)
			}
			id, _ := info.ID()
			err = sameRodata(id, want)
			if c.refuse == "" && err != nil {
				t.Errorf("refused: %v", err)
			}
			if c.refuse != "" && (err == nil || !strings.Contains(err.Error(), c.refuse)) {
				t.Errorf("got %v, want a refusal naming %q", err, c.refuse)
			}
		})
	}
}
