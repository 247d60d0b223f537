//go:build linux

// Command vmtest runs trialnet's kernel-facing tests on a matrix of
// Debian's packaged kernels, each booted under QEMU (KVM where a guest runs
// under it, TCG otherwise). The guest's root is the host's root, shared
// read-only over virtiofs, with fresh tmpfs on /tmp, /run and /var (a
// checkout below them is bound back at its own path); its
// init is this same binary, built static. The test binaries are built on
// the host; their output comes back over the guest's second serial line.
// Per kernel it prints passed, failed and skipped tests, and it exits
// non-zero naming the kernel and the test of any failure, with the
// guest's console log kept beside the results.
//
//	go run ./test/vmtest                        # the whole matrix
//	go run ./test/vmtest -kernel 6.1 -run TestX # one kernel, some tests
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
)

// kernel is one entry of the matrix.
type kernel struct {
	Name   string // what -kernel names it by
	Prefix string // the kernel release starts with this (/boot/vmlinuz-<release>)
	Append string // more kernel command line
	// LSM says whether bpf must be in the guest's active LSM list: the
	// LSM tests are required there, and skip elsewhere, so a guest whose
	// list is not as expected would pass vacuously.
	LSM   bool
	About string
}

// The matrix: Debian's two current kernels with their default LSM list
// (bpf is in it), and 6.12 once more without bpf in lsm=, to prove the
// fallback. The Makefile installs them (make vm-deps).
var matrix = []kernel{
	{"6.12", "6.12.", "", true, "Debian 13's kernel (also in Debian 12's security archive), default LSM list"},
	{"6.1", "6.1.", "", true, "Debian 12's kernel: no connect_unix/sendmsg_unix hooks, no SO_PEERPIDFD, Landlock ABI 2"},
	{"6.12-nolsm", "6.12.", "lsm=lockdown,capability,landlock,yama,apparmor,tomoyo", false, "6.12 with bpf left out of lsm=: the BPF LSM fallback"},
}

// suite is what runs in the guests: the packages whose behaviour depends
// on the kernel, then the CLI's doctor and the demo's Trial. The whole
// suite runs each package in every guest (kernels, where set, narrows
// it). It took 65 minutes of this 2-core machine under TCG, two guests
// at a time (6,564 guest-seconds, each guest on one host thread, see
// accel.arg): CI's 90 minutes had no room left for it beside the host's
// suite, the fuzzers and a fresh machine's package installs. -suite
// ci runs the kernel-facing core (bpf, netns, sandbox, the escape
// suites, a Trial's own unix tools and nested sandboxes) in every guest
// and each other package in one or two, at least one of them with the
// BPF LSM active (the host's suite runs every package without it):
// about 60 % of the work.
var suite = []suiteEntry{
	{pkg: "./bpf", timeout: 10 * time.Minute},
	{pkg: "./netns", timeout: 5 * time.Minute},
	{pkg: "./sandbox", timeout: 15 * time.Minute},
	// With the network and process-boundary suites inside a container of
	// each runtime (podman with crun, a runc bundle).
	{pkg: "./test/escape", timeout: 20 * time.Minute},
	// CI: 6.1, whose layers differ most from the host's (no unix hooks,
	// the BPF LSM's programs to adopt across a restart).
	{pkg: "./agent", timeout: 20 * time.Minute, ci: []string{"6.1"}},
	{pkg: "./cmd/trialnet", timeout: 15 * time.Minute, ci: []string{"6.12"}},
	// What runs in a Trial over its own unix sockets, and sandboxes nested
	// in one: the LSM layer decides both where it is active.
	{pkg: "./test/clients", timeout: 10 * time.Minute, run: "TestPrivilegedOwnUnixTools|TestPrivilegedNested"},
	// Transparent mode: its sk_lookup program and the connect hooks'
	// allowances for it are the kernel's; its clients are the host's,
	// read through the guest's share of the host's root (the JVM's two
	// take two of its five minutes under TCG).
	{pkg: "./test/clients", timeout: 20 * time.Minute, run: "TestPrivilegedTransparent", ci: []string{"6.1", "6.12-nolsm"}},
	// The client suites again inside podman containers, which only the
	// guests can run: what they add to a Trial's own runs is the runtime,
	// not the kernel, so one guest runs them (14.5 minutes under TCG beside
	// the two other guests, the JVM clients' 2.5 among them: its 15 ran
	// out once the JVM clients ran in guests; 22 minutes beside them and
	// the host's suite, with the hook run for every container). CI runs
	// curl and Node's fetch through the proxy, and the resolver and Node's
	// fetch transparently (a subtest pattern splits on its slashes).
	{pkg: "./test/clients", timeout: 35 * time.Minute, run: "TestPrivilegedContainerClients", kernels: []string{"6.12"},
		ciRun: "TestPrivilegedContainerClients/^(proxy|transparent)$/^(curl|getent|node-fetch)$"},
	// Containers in a Trial: podman with crun and a runc bundle, which
	// need cgroup v2 alone (the guests have it, the hosts do not).
	// 20 minutes: ~2.5 on a quiet host's guest, but the refusal
	// subtests (a container each, through podman or Docker and the hook)
	// took ~20 s each beside two other guests and the host's suite, and
	// the package ran past 10 minutes there.
	{pkg: "./test/containers", timeout: 20 * time.Minute, ci: []string{"6.12", "6.12-nolsm"}},
}

// suiteEntry is a package to test in the guests.
type suiteEntry struct {
	pkg     string
	timeout time.Duration
	run     string   // only these tests ("": all)
	kernels []string // only in these matrix entries' guests (nil: every one)
	ci      []string // under -suite ci, only in these (nil: as kernels)
	ciRun   string   // under -suite ci, only these tests ("": as run)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if os.Getpid() == 1 {
		guestMain()
	}
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "vmtest:", err)
		os.Exit(1)
	}
}

type options struct {
	kernels  []kernel
	run      string
	count    int
	pkgs     []string
	out      string
	releases []string
	parallel int
	ci       bool // -suite ci
	mem      string
	smp      int
	noDemo   bool
	accel    accel    // chosen once, before the boots
	keeps    []string // directories the guest binds back over its fresh mounts (guestKeeps)
}

func parseFlags() (*options, error) {
	o := &options{}
	kernels := flag.String("kernel", "", "comma-separated matrix entries to boot (default: all): "+matrixNames())
	flag.StringVar(&o.run, "run", "", "only tests matching this -test.run pattern (and no doctor or demo step)")
	flag.IntVar(&o.count, "count", 1, "run each test this many times (to hunt a flaky one)")
	pkgs := flag.String("pkgs", "", "comma-separated packages to test (default: the kernel-facing suite)")
	releases := flag.String("release", "", "space- or comma-separated kernel releases to boot, as the Makefile pins them (default: the newest installed for each entry)")
	flag.StringVar(&o.out, "out", "bin/vmtest", "output directory: binaries, plans, results and console logs")
	// Two at once: under TCG each guest runs on one host thread
	// (accel.arg), one per core here. Three at once gave each two thirds
	// of a core, timings no test had met before (a race in the terminal
	// relay showed there first: ca9b2e9), for little: -suite ci took 29
	// minutes so, against 42 two at a time with the fuzzers beside it
	// for 11.
	flag.IntVar(&o.parallel, "parallel", 2, "guests booted at once")
	suiteName := flag.String("suite", "full", "full: every package in every guest; ci: the kernel-facing core in every guest, the rest in one or two (about half the time)")
	flag.StringVar(&o.mem, "mem", "2G", "guest memory")
	flag.IntVar(&o.smp, "smp", 2, "guest CPUs")
	flag.Parse()
	if flag.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	switch *suiteName {
	case "full":
	case "ci":
		o.ci = true
	default:
		return nil, fmt.Errorf("-suite %q: want full or ci", *suiteName)
	}
	if o.count < 1 {
		return nil, fmt.Errorf("-count %d: want 1 or more", o.count)
	}
	for _, name := range strings.Split(*kernels, ",") {
		if name == "" {
			continue
		}
		i := slices.IndexFunc(matrix, func(k kernel) bool { return k.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("-kernel %q: no such matrix entry; there are %s", name, matrixNames())
		}
		o.kernels = append(o.kernels, matrix[i])
	}
	if len(o.kernels) == 0 {
		o.kernels = matrix
	}
	if *pkgs != "" {
		o.pkgs = strings.Split(*pkgs, ",")
	}
	o.releases = strings.FieldsFunc(*releases, func(r rune) bool { return r == ',' || r == ' ' })
	if o.run != "" {
		if _, err := regexp.Compile(o.run); err != nil {
			return nil, fmt.Errorf("-run: %w", err)
		}
	}
	o.noDemo = o.run != "" || *pkgs != ""
	return o, nil
}

func matrixNames() string {
	var n []string
	for _, k := range matrix {
		n = append(n, k.Name)
	}
	return strings.Join(n, ", ")
}

func run(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: it runs virtiofsd over the host's root (try: sudo make vmtest)")
	}
	o, err := parseFlags()
	if err != nil {
		return err
	}
	out, err := filepath.Abs(o.out)
	if err != nil {
		return err
	}
	o.out = out
	cwd, err := os.Getwd()
	if err != nil {
		return err
	}
	if o.keeps, err = guestKeeps(cwd, o.out); err != nil {
		return err
	}
	for _, tool := range []string{"qemu-system-x86_64", virtiofsd} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is missing: 'make vm-deps' installs QEMU and the kernels: %w", tool, err)
		}
	}
	boots := make([]*boot, 0, len(o.kernels))
	for _, k := range o.kernels {
		b, err := findKernel(k, o.releases)
		if err != nil {
			return err
		}
		boots = append(boots, b)
	}
	var why string
	o.accel, why = chooseAccel(ctx, boots[0].vmlinuz)
	fmt.Printf("vmtest: guests run under %s\n", why)
	start := time.Now()
	bins, err := build(ctx, o)
	if err != nil {
		return err
	}
	fmt.Printf("vmtest: built the test binaries in %.0fs\n", time.Since(start).Seconds())

	// Booted in the matrix's order, the longest guest first (6.12 runs
	// the container client suite too): the others share the second slot.
	sem := make(chan struct{}, o.parallel)
	var wg sync.WaitGroup
	for _, b := range boots {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			b.err = b.run(ctx, o, bins)
		})
	}
	wg.Wait()
	return report(boots, o.run != "", time.Since(start))
}

// built is what the guests run.
type built struct {
	tests    []builtTest
	trialnet string
	oci      string // trialnet-oci, beside trialnet: what its oci-hook install and oci-runtime install write
	previous string // trialnet of the build before hand-overs (cmd/trialnet/testdata/previous-build)
	demo     string
	escapee  string
	probe    string // test/clients/transprobe
	init     string
}

type builtTest struct {
	pkg, bin, run string
	kernels       []string // nil: every guest
	timeout       time.Duration
}

// build compiles every binary the guests run. The guest's libc is the
// host's (its root is the host's), so trialnet and the tests are built as
// the host builds them, with cgo: the sandbox's early C path
// (sandbox/early.c) is what runs Trials' commands there too. The guest's
// init runs before that root is mounted, and the escapee and the probe
// run in containers' roots too: those are static, and trialnet-oci is
// static as the Makefile builds it.
func build(ctx context.Context, o *options) (*built, error) {
	dir := filepath.Join(o.out, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// Trials run as nobody: the binaries they exec must be reachable.
	for d := dir; d != "/" && strings.HasPrefix(d, o.out); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	b := &built{
		trialnet: filepath.Join(dir, "trialnet"),
		oci:      filepath.Join(dir, "trialnet-oci"),
		previous: filepath.Join(dir, "trialnet-previous"),
		demo:     filepath.Join(dir, "trialnet-demo"),
		escapee:  filepath.Join(dir, "escapee"),
		probe:    filepath.Join(dir, "transprobe"),
		init:     filepath.Join(dir, "vminit"),
	}
	cmds := [][]string{
		{"build", "-o", b.trialnet, "./cmd/trialnet"},
		{"build", "-o", b.oci, "./cmd/trialnet-oci"},
		{"build", "-o", b.demo, "./cmd/trialnet-demo"},
		{"build", "-o", b.escapee, "./test/escape/escapee"},
		{"build", "-o", b.probe, "./test/clients/transprobe"},
		{"build", "-o", b.init, "./test/vmtest"},
	}
	for _, t := range o.tests() {
		t.bin = filepath.Join(dir, strings.ReplaceAll(strings.Trim(t.pkg, "./"), "/", "_")+".test")
		if !slices.ContainsFunc(b.tests, func(o builtTest) bool { return o.pkg == t.pkg }) {
			cmds = append(cmds, []string{"test", "-c", "-o", t.bin, t.pkg})
		}
		b.tests = append(b.tests, t)
	}
	for _, args := range cmds {
		cmd := exec.CommandContext(ctx, "go", args...)
		if slices.Contains(args, b.init) || slices.Contains(args, b.escapee) || slices.Contains(args, b.probe) || slices.Contains(args, b.oci) {
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	// The guests cannot build (no writable cache, and TCG is slow): the
	// agent of the build before hand-overs, which the restart tests run,
	// is built here from git.
	rev, err := os.ReadFile("cmd/trialnet/testdata/previous-build")
	if err != nil {
		return nil, err
	}
	src, err := os.MkdirTemp("", "trialnet-previous-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(src)
	archive := exec.CommandContext(ctx, "sh", "-c", "git archive --format=tar \"$0\" | tar -x -C \"$1\"", strings.TrimSpace(string(rev)), src)
	if out, err := archive.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("the previous build's source (git %s): %w\n%s", rev, err, out)
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", b.previous, "./cmd/trialnet")
	build.Dir, build.Env = src, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the previous trialnet: %w\n%s", err, out)
	}
	return b, nil
}

// tests lists the packages to test: the suite, or those -pkgs names (a
// package of the suite keeps its -test.run and timeout).
func (o *options) tests() []builtTest {
	var out []builtTest
	for _, s := range suite {
		if o.pkgs == nil || slices.Contains(o.pkgs, s.pkg) {
			t := builtTest{pkg: s.pkg, timeout: s.timeout, run: s.run, kernels: s.kernels}
			if o.ci && s.ci != nil {
				t.kernels = s.ci
			}
			if o.ci && s.ciRun != "" {
				t.run = s.ciRun
			}
			out = append(out, t)
		}
	}
	for _, p := range o.pkgs {
		if !slices.ContainsFunc(suite, func(s suiteEntry) bool { return s.pkg == p }) {
			out = append(out, builtTest{pkg: p, timeout: 20 * time.Minute})
		}
	}
	return out
}

// plan is the list of steps for one guest.
func (b *built) plan(k kernel, o *options) plan {
	cwd, _ := os.Getwd()
	env := []string{"TRIALNET_TEST_BIN=" + b.trialnet, "TRIALNET_TEST_ESCAPEE=" + b.escapee, "TRIALNET_TEST_TRANSPROBE=" + b.probe,
		"TRIALNET_UPGRADE_TO=" + b.trialnet, "TRIALNET_PREVIOUS_AGENT=" + b.previous,
		// Every guest has cgroup v2 alone: the container tests must run.
		"TRIALNET_REQUIRE_CONTAINERS=1"}
	if o.accel.name == "tcg" {
		// A JVM takes about a minute under TCG: test/clients gives its
		// JVM clients fewer threads to start (C1 alone, the serial GC).
		env = append(env, "TRIALNET_VM_TCG=1")
	}
	// loop: test/escape gives a container a loop device for a host disk.
	p := plan{Kernel: k.Name, Modules: []string{"veth", "vsock_loopback", "loop"}}
	ran := map[string]bool{}
	for _, t := range b.tests {
		// A -run pattern replaces each entry's own: a package then runs
		// once, in every guest.
		if (t.kernels != nil && !slices.Contains(t.kernels, k.Name) && o.run == "") || (o.run != "" && ran[t.pkg]) {
			continue
		}
		ran[t.pkg] = true
		args := []string{t.bin, "-test.v", "-test.count=" + strconv.Itoa(o.count), "-test.timeout=" + (t.timeout - 30*time.Second).String()}
		switch {
		case o.run != "":
			args = append(args, "-test.run="+o.run)
		case t.run != "":
			args = append(args, "-test.run="+t.run)
		}
		p.Steps = append(p.Steps, step{Name: t.pkg, Args: args, Dir: filepath.Join(cwd, t.pkg), Env: env,
			Timeout: int(t.timeout.Seconds()), GoTest: true})
	}
	if !o.noDemo {
		p.Steps = append(p.Steps,
			step{Name: "trialnet doctor", Args: []string{b.trialnet, "doctor"}, Dir: cwd, Timeout: 120},
			step{Name: "make demo", Args: []string{b.demo, b.trialnet}, Dir: cwd, Timeout: 600})
	}
	return p
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// report prints one table per kernel and an error naming each failure.
func report(boots []*boot, filtered bool, took time.Duration) error {
	var failures, tails []string
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nkernel\trelease\tLSMs\tstep\tpassed\tfailed\tskipped\texit\tseconds")
	for _, b := range boots {
		if b.err != nil {
			failures = append(failures, fmt.Sprintf("%s: %v (console: %s)", b.k.Name, b.err, b.console()))
		}
		if b.res == nil {
			continue
		}
		for _, s := range b.res.Steps {
			exit := fmt.Sprint(s.Exit)
			if s.Exit == -1 {
				exit = "never ended"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0f\n", b.k.Name, b.release, b.res.LSMs, s.Name, s.counts(), exit, s.Seconds)
			if !s.ok() {
				what := fmt.Sprintf("exit %s", exit)
				if len(s.Failed) > 0 {
					what = "failed " + strings.Join(s.Failed, ", ")
				}
				failures = append(failures, fmt.Sprintf("%s: %s: %s (output: %s, console: %s)", b.k.Name, s.Name, what, b.resultsFile(), b.console()))
				out := stepOutput(b.resultsFile(), s.Name)
				for _, f := range s.Failed {
					if !strings.Contains(f, "/") {
						tails = append(tails, excerpt(b.k.Name+" "+s.Name+" "+f, failedTest(out, f, failLines)))
					}
				}
				tails = append(tails, excerpt(b.k.Name+" "+s.Name, lastOf(out, tailLines)))
			}
		}
		if !b.res.Done && b.err == nil {
			failures = append(failures, fmt.Sprintf("%s: the guest did not finish its plan (console: %s)", b.k.Name, b.console()))
			tails = append(tails, excerpt(b.k.Name+" console", lastLines(b.console(), tailLines)))
		}
		if hasBPF := slices.Contains(strings.Split(b.res.LSMs, ","), "bpf"); hasBPF != b.k.LSM {
			failures = append(failures, fmt.Sprintf("%s: the guest's active LSM list is %q; bpf in it: %v, want %v", b.k.Name, b.res.LSMs, hasBPF, b.k.LSM))
		}
		// A package that ran no test passed nothing: only a -run filter
		// may leave some without one, and not all.
		ran := 0
		for _, s := range b.res.Steps {
			n := len(s.Passed) + len(s.Failed) + len(s.Skipped)
			ran += n
			if s.GoTest && n == 0 && !filtered {
				failures = append(failures, fmt.Sprintf("%s: %s ran no test", b.k.Name, s.Name))
			}
		}
		if ran == 0 {
			failures = append(failures, fmt.Sprintf("%s: no test ran", b.k.Name))
		}
	}
	_ = tw.Flush()
	fmt.Printf("\nvmtest: %d kernels in %.0fs\n", len(boots), took.Seconds())
	if len(failures) > 0 {
		// The ends of what failed, last: a CI log shows only its tail,
		// and the files named above stay on the machine that ran it.
		fmt.Print(strings.Join(tails, ""))
		return fmt.Errorf("%d failures:\n  %s", len(failures), strings.Join(failures, "\n  "))
	}
	return nil
}

// tailLines is how much of a failed step's output, or of the console of a
// guest that died, the report repeats; failLines, how much of each failed
// test's own output (its errors are near its end).
const (
	tailLines = 12
	failLines = 40
)

func excerpt(what string, lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return fmt.Sprintf("--- the end of %s:\n%s\n", what, strings.Join(lines, "\n"))
}

// lastLines are the last n lines of the file at path (none if unreadable).
func lastLines(path string, n int) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return lines[max(0, len(lines)-n):]
}

// stepOutput is the lines the step wrote to the results file, before its
// end marker (or the file's end, if it never ended).
func stepOutput(path, step string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	_, out, ok := strings.Cut(string(b), markBegin+step+"\n")
	if !ok {
		return nil
	}
	out, _, _ = strings.Cut(out, markEnd+step+" ")
	return strings.Split(strings.TrimRight(out, "\n"), "\n")
}

func lastOf(lines []string, n int) []string { return lines[max(0, len(lines)-n):] }

// failedTest is the last n lines of a failed top-level test's own output:
// from its last "=== RUN" to its "--- FAIL", where its errors are. A step's
// tail alone shows only the tests that ran after it.
func failedTest(lines []string, name string, n int) []string {
	start := -1
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "=== RUN   "+name) && strings.TrimPrefix(l, "=== RUN   "+name) == "":
			start = i
		case start >= 0 && strings.HasPrefix(l, "--- FAIL: "+name+" ("):
			return lastOf(lines[start:i+1], n)
		}
	}
	return nil
}
