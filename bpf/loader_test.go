//go:build linux

package bpf

import (
	"errors"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/trialnet/trialnet/internal/privtest"
)

// testCgroup makes a throwaway parent cgroup on the cgroup2 mount.
func testCgroup(t testing.TB) string {
	t.Helper()
	root := cgroup2Mount(t)
	dir, err := os.MkdirTemp(root, "trialnet-bpftest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	return dir
}

func cgroup2Mount(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		l, r, ok := strings.Cut(line, " - ")
		if ok && strings.HasPrefix(r, "cgroup2 ") {
			return strings.Fields(l)[4]
		}
	}
	t.Fatal("no cgroup2 mount")
	return ""
}

// testPins is a pin directory of the test's own for cg, removed afterwards.
func testPins(t testing.TB, cg string) string {
	pins := DefaultPinDir + "-test-" + filepath.Base(cg)
	t.Cleanup(func() { _ = Uninstall(pins) })
	return pins
}

func loadTest(t testing.TB) (*Loader, Options) {
	t.Helper()
	privtest.Require(t)
	cg := testCgroup(t)
	opts := Options{Cgroup: cg, PinDir: testPins(t, cg)}
	l, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	return l, opts
}

func TestPrivilegedLoadAttachUninstall(t *testing.T) {
	l, opts := loadTest(t)
	cg, pins := opts.Cgroup, opts.PinDir
	if err := l.AddTrial(42, Policy{NetnsCookie: 7, UnixOpen: true}); err != nil {
		t.Fatal(err)
	}
	if !l.HasTrial(42) {
		t.Fatal("policy entry missing after AddTrial")
	}
	if _, err := l.Counters(42); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Loading again adopts the pinned maps: the entry is still there.
	l2, err := Load(Options{Cgroup: cg, PinDir: pins})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if !l2.HasTrial(42) {
		t.Fatal("re-load did not adopt the pinned policy map")
	}
	if err := l2.RemoveTrial(42); err != nil {
		t.Fatal(err)
	}
	if l2.HasTrial(42) {
		t.Fatal("policy entry left after RemoveTrial")
	}
}

// The Go counter names must be the C names bpftool shows.
func TestCounterNamesMatchBTF(t *testing.T) {
	spec, err := loadTrialnet()
	if err != nil {
		t.Fatal(err)
	}
	var st *btf.Struct
	if err := spec.Types.TypeByName("trial_counters", &st); err != nil {
		t.Fatal(err)
	}
	// trial_counters' members, then trial_ptys' denied as pty_denied.
	var ptys *btf.Struct
	if err := spec.Types.TypeByName("trial_ptys", &ptys); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ptys.Members, func(m btf.Member) bool { return m.Name == "denied" }) {
		t.Fatal("struct trial_ptys has no member denied")
	}
	fields := Counters{}.Fields()
	if len(fields) != len(st.Members)+1 || fields[len(st.Members)].Name != "pty_denied" {
		t.Fatalf("%d Go fields, %d C members of trial_counters and pty_denied: %v", len(fields), len(st.Members), fields)
	}
	for i, m := range st.Members {
		if fields[i].Name != m.Name {
			t.Errorf("field %d: Go name %q, C name %q", i, fields[i].Name, m.Name)
		}
	}
}

func TestPolicyRefusesWhatItCannotEnforce(t *testing.T) {
	lo := netip.MustParseAddrPort("127.0.0.1:3128")
	for _, tc := range []struct {
		name string
		p    Policy
		want string
	}{
		{"no netns cookie", Policy{}, "netns cookie"},
		{"non-loopback proxy", Policy{NetnsCookie: 1, Proxy: []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:3128")}}, "not a loopback"},
		{"proxy ports differ", Policy{NetnsCookie: 1, Proxy: []netip.AddrPort{lo, netip.MustParseAddrPort("[::1]:8080")}}, "same non-zero port"},
		{"two IPv4 proxies", Policy{NetnsCookie: 1, Proxy: []netip.AddrPort{lo, netip.MustParseAddrPort("127.0.0.2:3128")}}, "only one IPv4"},
		{"strict without proxy", Policy{NetnsCookie: 1, Strict: true}, "strict mode needs a proxy"},
		{"pool outside loopback", Policy{NetnsCookie: 1, Pool: netip.MustParsePrefix("10.100.0.0/16")}, "inside 127.0.0.0/8"},
		{"pool holding 127.0.0.1", Policy{NetnsCookie: 1, Pool: netip.MustParsePrefix("127.0.0.0/24")}, "leaves out 127.0.0.1"},
		{"pool holding the stub", Policy{NetnsCookie: 1, Pool: netip.MustParsePrefix("127.0.0.32/27")}, "127.0.0.53"},
		{"pool unmasked", Policy{NetnsCookie: 1, Pool: netip.MustParsePrefix("127.100.0.1/16")}, "masked"},
		{"pool holding the proxy", Policy{NetnsCookie: 1, Proxy: []netip.AddrPort{netip.MustParseAddrPort("127.100.0.9:3128")},
			Pool: netip.MustParsePrefix("127.100.0.0/16")}, "holds the proxy endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.p.encode()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
	for _, path := range []string{"relative.sock", "/a/../b.sock", "/" + strings.Repeat("x", 120)} {
		if _, err := unixKey(1, path); err == nil {
			t.Errorf("unix path %q accepted", path)
		}
	}
	v, err := Policy{NetnsCookie: 1, Strict: true, Proxy: []netip.AddrPort{lo}}.encode()
	if err != nil || v.ProxyPort != 3128 || v.ProxyIp4 != 0x0100007f || v.Flags != flagStrict {
		t.Fatalf("encode: %+v %v", v, err)
	}
	v, err = Policy{NetnsCookie: 1, Strict: true, Proxy: []netip.AddrPort{lo}, Pool: netip.MustParsePrefix("127.100.0.0/16")}.encode()
	if err != nil || v.PoolIp4 != 0x0000647f || v.PoolBits != 16 || v.Flags != flagStrict|flagTransparent {
		t.Fatalf("encode with a pool: %+v %v", v, err)
	}
}

// Where the kernel lacks the unix hooks and the BPF LSM layer, a Trial
// that wants unix confinement is refused and one that opts out is
// accepted; with the LSM layer, its peer check confines alone.
func TestPrivilegedMissingUnixHookFailsClosed(t *testing.T) {
	l, _ := loadTest(t)
	defer l.Close()
	l.unixHook = false // as on a kernel before 6.7
	lsmLinks := l.lsmLinks
	l.lsmLinks = nil // as without BPF LSM
	if err := l.AddTrial(5, Policy{NetnsCookie: 9}); !errors.Is(err, errUnixHookMissing) {
		t.Fatalf("got %v, want ErrUnixHookMissing", err)
	}
	if l.HasTrial(5) || l.TrialCount() != 0 {
		t.Fatal("a refused AddTrial left map entries")
	}
	if err := l.AddTrial(5, Policy{NetnsCookie: 9, UnixOpen: true}); err != nil {
		t.Fatalf("opting out must work: %v", err)
	}
	_ = l.RemoveTrial(5)
	l.lsmLinks = lsmLinks
	if l.LSM() {
		if err := l.AddTrial(5, Policy{NetnsCookie: 9}); err != nil {
			t.Fatalf("with the LSM layer, unix confinement needs no cgroup hook: %v", err)
		}
		_ = l.RemoveTrial(5)
	}
}

// A Load that fails half-way leaves the pins as they were and no program
// attached: here a foreign object sits where one link's pin belongs.
func TestPrivilegedFailedLoadLeavesNothing(t *testing.T) {
	privtest.Require(t)
	cg := testCgroup(t)
	pins := testPins(t, cg)
	if err := os.MkdirAll(pins, 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(filepath.Join(pins, "link_"+trialnetProgTrialnetSockCreate)); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(Options{Cgroup: cg, PinDir: pins}); err == nil {
		t.Fatal("Load adopted a map as a link")
	}
	entries, _ := os.ReadDir(pins)
	if len(entries) != 1 {
		t.Fatalf("pins after a failed Load: %v; want only the foreign one", entries)
	}
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unixHooks := haveUnixHooks() == nil
	for _, h := range hooks {
		if h.unix && !unixHooks {
			continue // a kernel before 6.7 cannot be asked about them
		}
		// A removed pin releases its link after an RCU grace period:
		// give the detach a moment (this raced once in six runs).
		var res *link.QueryResult
		for range 50 {
			if res, err = link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: h.attach}); err != nil || len(res.Programs) == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Programs) != 0 {
			t.Fatalf("%s still attached after a failed Load", h.name)
		}
	}
}

// Pins of an older, incompatible layout are replaced when no Trial uses
// them (an upgrade with nothing live, stale map entries or not), and
// refused while a Trial cgroup exists.
func TestPrivilegedIncompatiblePinsReplacedOnlyWhenUnused(t *testing.T) {
	privtest.Require(t)
	for _, used := range []bool{false, true} {
		cg := testCgroup(t)
		pins := testPins(t, cg)
		if err := os.MkdirAll(pins, 0o700); err != nil {
			t.Fatal(err)
		}
		old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 16})
		if err != nil {
			t.Fatal(err)
		}
		// A stale entry either way: only a live Trial cgroup makes pins used.
		if err := old.Put(uint64(42), uint32(1)); err != nil {
			t.Fatal(err)
		}
		if used {
			trial := filepath.Join(cg, "live")
			if err := os.Mkdir(trial, 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.Remove(trial) })
		}
		if err := old.Pin(filepath.Join(pins, trialnetMapPolicyMap)); err != nil {
			t.Fatal(err)
		}
		_ = old.Close()
		l, err := Load(Options{Cgroup: cg, PinDir: pins})
		if used {
			if err == nil || !strings.Contains(err.Error(), "incompatible") {
				t.Errorf("incompatible pins with a Trial in them: %v; want a refusal", err)
			}
			if l != nil {
				_ = l.Close()
			}
			continue
		}
		if err != nil {
			t.Fatalf("unused incompatible pins were not replaced: %v", err)
		}
		if !l.HasTrial(42) && l.TrialCount() == 0 {
			_ = l.Close()
			continue
		}
		_ = l.Close()
		t.Fatal("the replaced policy map still has the old entry")
	}
}

// ProgramTags, kept from the first call, are the kernel's tags of the
// programs enforcing now, on every call.
func TestPrivilegedProgramTags(t *testing.T) {
	l, _ := loadTest(t)
	first := l.ProgramTags()
	if len(first) == 0 {
		t.Fatal("no program tags")
	}
	for name, tag := range first {
		info, err := l.coll.Programs[name].Info()
		if err != nil {
			t.Fatal(err)
		}
		if tag != info.Tag || tag == "" {
			t.Errorf("%s: tag %q, the kernel's %q", name, tag, info.Tag)
		}
	}
	if again := l.ProgramTags(); !maps.Equal(first, again) {
		t.Errorf("a second call: %v, the first: %v", again, first)
	}
}

func BenchmarkProgramTags(b *testing.B) {
	l, _ := loadTest(b)
	for b.Loop() {
		if len(l.ProgramTags()) == 0 {
			b.Fatal("no tags")
		}
	}
}
