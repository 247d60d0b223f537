//go:build linux

package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
)

// A failed test, in a step or a subtest, fails the step; an end marker
// of another step inside a step's output does not end it; a step that
// never ended is not ok.
func TestParseResults(t *testing.T) {
	log := strings.Join([]string{
		"kernel noise",
		markHeader + "6.12.1 lsm=landlock,bpf",
		markBegin + "./a",
		"=== RUN   TestOne",
		"--- PASS: TestOne (0.01s)",
		"--- SKIP: TestTwo (0.00s)",
		"--- FAIL: TestThree (0.00s)",
		"    --- FAIL: TestThree/sub (0.00s)",
		"    --- PASS: TestThree/ok (0.00s)",
		markEnd + "./b exit=0 seconds=1.0", // printed by a test: not this step's end
		"--- FAIL: TestFour (0.00s)",
		markEnd + "./a exit=1 seconds=2.5",
		markBegin + "./c",
		"--- PASS: TestFive (0.00s)",
		markEnd + "./c exit=0 seconds=0.5",
		markBegin + "./d",
		"--- PASS: TestSix (0.00s)",
	}, "\n")
	g, out := parseResults(strings.NewReader(log), map[string]bool{"./a": true, "./c": true, "./d": true})
	if g.Release != "6.12.1" || g.LSMs != "landlock,bpf" || g.Done || len(g.Steps) != 3 {
		t.Fatalf("parsed %+v", g)
	}
	a, c, d := g.Steps[0], g.Steps[1], g.Steps[2]
	if a.Exit != 1 || a.Seconds != 2.5 || a.ok() || !slices.Equal(a.Passed, []string{"TestOne"}) || !slices.Equal(a.Skipped, []string{"TestTwo"}) ||
		!slices.Equal(a.Failed, []string{"TestThree", "TestThree/sub", "TestFour"}) {
		t.Errorf("step a: %+v", a)
	}
	if !c.ok() || len(c.Passed) != 1 {
		t.Errorf("step c: %+v", c)
	}
	if d.ok() || d.Exit != -1 {
		t.Errorf("a step that never ended: %+v", d)
	}
	if !strings.Contains(out["./a"], "TestFour") {
		t.Errorf("output of a: %q", out["./a"])
	}
}

func TestCompareVersions(t *testing.T) {
	rels := []string{"6.1.0-10-cloud-amd64", "6.1.0-9-cloud-amd64", "6.12.107+deb12-cloud-amd64", "6.12.99+deb12-cloud-amd64"}
	slices.SortFunc(rels, compareVersions)
	want := []string{"6.1.0-9-cloud-amd64", "6.1.0-10-cloud-amd64", "6.12.99+deb12-cloud-amd64", "6.12.107+deb12-cloud-amd64"}
	if !slices.Equal(rels, want) {
		t.Fatalf("sorted %v, want %v", rels, want)
	}
}

// Dependencies come before what needs them, built-in modules are left
// out, and a module that is neither is an error naming it.
func TestModuleClosure(t *testing.T) {
	dir := t.TempDir()
	dep := "kernel/fs/fuse/virtiofs.ko: kernel/fs/fuse/fuse.ko kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko\n" +
		"kernel/fs/fuse/fuse.ko:\n" +
		"kernel/drivers/virtio/virtio_ring.ko:\n" +
		"kernel/drivers/virtio/virtio_pci.ko.xz: kernel/drivers/virtio/virtio_pci-modern-dev.ko.xz kernel/drivers/virtio/virtio_ring.ko\n" +
		"kernel/drivers/virtio/virtio_pci-modern-dev.ko.xz:\n"
	if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/drivers/virtio/virtio.ko\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := moduleClosure(dir, []string{"virtio_pci", "virtiofs"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kernel/drivers/virtio/virtio_pci-modern-dev.ko.xz", "kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/virtio/virtio_pci.ko.xz", "kernel/fs/fuse/fuse.ko", "kernel/fs/fuse/virtiofs.ko"}
	if !slices.Equal(got, want) {
		t.Fatalf("closure %v, want %v", got, want)
	}
	if _, err := moduleClosure(dir, []string{"nosuch"}); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("a missing module: %v", err)
	}
}

// The initramfs writer's output is what cpio itself reads back.
func TestCpioWriter(t *testing.T) {
	privtest.RequireTool(t, "cpio")
	var b bytes.Buffer
	c := &cpioWriter{w: &b}
	c.dir("modules")
	c.chardev("dev/console", 5, 1)
	c.file("init", []byte("#!/bin/sh\n"), 0o755)
	c.file("modules/a.ko", []byte("abc"), 0o644) // odd lengths exercise the padding
	if err := c.close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cpio", "-t", "-v", "--quiet")
	cmd.Stdin = &b
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -t: %v\n%s", err, out)
	}
	for _, want := range []string{"drwxr-xr-x", "modules", "crw-------", "dev/console", "-rwxr-xr-x", "init", "modules/a.ko"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cpio -t lacks %q:\n%s", want, out)
		}
	}
}

// A checkout (or output directory) where the guest mounts a fresh tmpfs
// is bound back, once; one under a kernel filesystem the guest mounts is
// refused with the reason, as is a path its command line cannot carry.
func TestGuestKeeps(t *testing.T) {
	for _, tc := range []struct {
		dirs []string
		want []string
		err  string
	}{
		{[]string{"/work/trialnet", "/work/trialnet/bin/vmtest"}, nil, ""},
		{[]string{"/tmp/trialnet", "/tmp/trialnet/bin/vmtest"}, []string{"/tmp/trialnet"}, ""},
		{[]string{"/home/me/trialnet", "/var/tmp/out"}, []string{"/var/tmp/out"}, ""},
		{[]string{"/dev/shm/trialnet", "/run/out"}, []string{"/dev/shm/trialnet", "/run/out"}, ""},
		{[]string{"/tmpfoo/trialnet"}, nil, ""},
		{[]string{"/sys/fs/bpf/x"}, nil, "mounts its own /sys/fs/bpf"},
		{[]string{"/dev/trialnet"}, nil, "mounts its own /dev over"},
		{[]string{"/tmp/my clone"}, nil, "splits at spaces"},
	} {
		got, err := guestKeeps(tc.dirs...)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("guestKeeps(%q): %v, want an error with %q", tc.dirs, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("guestKeeps(%q) = %q, %v; want %q", tc.dirs, got, err, tc.want)
		}
	}
}

// A failed step's excerpt is its own output's end, not the next step's,
// and each failed test's own lines, however much ran after it.
func TestStepTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.log")
	log := markBegin + "./a\nok a\n" + markEnd + "./a exit=0 seconds=1\n" +
		markBegin + "./b\n=== RUN   TestX\nx_test.go:1: why\n--- FAIL: TestX (1.00s)\n=== RUN   TestXY\nthree\n" + markEnd + "./b exit=1 seconds=2\n" +
		markBegin + "./c\nstill running\n"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		step string
		want []string
	}{{"./b", []string{"=== RUN   TestXY", "three"}}, {"./c", []string{"still running"}}, {"./gone", nil}} {
		if got := lastOf(stepOutput(path, c.step), 2); !slices.Equal(got, c.want) {
			t.Errorf("the end of %s = %q, want %q", c.step, got, c.want)
		}
	}
	out := stepOutput(path, "./b")
	for _, c := range []struct {
		test string
		want []string
	}{{"TestX", []string{"x_test.go:1: why", "--- FAIL: TestX (1.00s)"}}, {"TestXY", nil}} {
		if got := failedTest(out, c.test, 2); !slices.Equal(got, c.want) {
			t.Errorf("failedTest(%s) = %q, want %q", c.test, got, c.want)
		}
	}
}

// An entry for one kernel runs in that guest only, unless a -run pattern
// replaces every entry's own: then each package runs once per guest.
func TestPlanKernelEntries(t *testing.T) {
	b := &built{tests: []builtTest{{pkg: "./p", run: "TestA", timeout: time.Minute},
		{pkg: "./p", run: "TestB", kernels: []string{"6.12"}, timeout: time.Minute}}}
	runs := func(k string, o *options) []string {
		var out []string
		for _, s := range b.plan(kernel{Name: k}, o).Steps {
			out = append(out, s.Args[len(s.Args)-1])
		}
		return out
	}
	for _, tc := range []struct {
		kernel, run string
		want        []string
	}{
		{"6.12", "", []string{"-test.run=TestA", "-test.run=TestB"}},
		{"6.1", "", []string{"-test.run=TestA"}},
		{"6.1", "TestC", []string{"-test.run=TestC"}},
	} {
		got := runs(tc.kernel, &options{run: tc.run, noDemo: true, count: 1})
		if !slices.Equal(got, tc.want) {
			t.Errorf("kernel %s, -run %q: steps %v, want %v", tc.kernel, tc.run, got, tc.want)
		}
	}
}

// -suite ci narrows entries to their ci guests and patterns; the whole
// suite keeps each entry's own.
func TestCISuiteEntries(t *testing.T) {
	find := func(ts []builtTest, pkg, run string) *builtTest {
		for i := range ts {
			if ts[i].pkg == pkg && strings.HasPrefix(ts[i].run, run) {
				return &ts[i]
			}
		}
		t.Fatalf("no %s %s in %v", pkg, run, ts)
		return nil
	}
	full, ci := (&options{}).tests(), (&options{ci: true}).tests()
	if a := find(full, "./agent", ""); a.kernels != nil {
		t.Errorf("the whole suite runs ./agent in %v, want every guest", a.kernels)
	}
	if a := find(ci, "./agent", ""); !slices.Equal(a.kernels, []string{"6.1"}) {
		t.Errorf("-suite ci runs ./agent in %v, want 6.1's", a.kernels)
	}
	if s := find(ci, "./sandbox", ""); s.kernels != nil {
		t.Errorf("-suite ci runs ./sandbox in %v, want every guest", s.kernels)
	}
	if c := find(full, "./test/clients", "TestPrivilegedContainerClients"); c.run != "TestPrivilegedContainerClients" || !slices.Equal(c.kernels, []string{"6.12"}) {
		t.Errorf("the whole suite's container clients: %q in %v", c.run, c.kernels)
	}
	if c := find(ci, "./test/clients", "TestPrivilegedContainerClients"); c.run == "TestPrivilegedContainerClients" {
		t.Errorf("-suite ci runs every container client: %q", c.run)
	}
}

// Under -suite ci every package of the suite still runs in a guest with
// the BPF LSM active: the host's suite runs each only without it.
func TestCISuiteMeetsTheLSM(t *testing.T) {
	for _, s := range suite {
		guests := s.kernels
		if s.ci != nil {
			guests = s.ci
		}
		lsm := slices.ContainsFunc(matrix, func(k kernel) bool {
			return k.LSM && (guests == nil || slices.Contains(guests, k.Name))
		})
		if !lsm {
			t.Errorf("-suite ci runs %s (%s) only in %v: no guest with the BPF LSM", s.pkg, s.run, guests)
		}
	}
}
