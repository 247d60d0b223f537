//go:build linux

package ocihook

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
)

// fuzzProfile reads a seccomp profile of the few names, actions, ops and
// values that the judgement turns on out of b, a byte a choice.
type fuzzProfile struct {
	b []byte
	i int
}

func (f *fuzzProfile) byte() byte {
	if f.i >= len(f.b) {
		return 0
	}
	f.i++
	return f.b[f.i-1]
}

func pick[T any](f *fuzzProfile, from []T) T { return from[int(f.byte())%len(from)] }

var (
	fuzzActions = []string{"SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_LOG", "SCMP_ACT_TRAP", "SCMP_ACT_TRACE", "SCMP_ACT_NOTIFY", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL_THREAD"}
	fuzzOps     = []string{"SCMP_CMP_EQ", "SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_GT", "SCMP_CMP_GE", "SCMP_CMP_MASKED_EQ"}
	fuzzNames   = []string{"socket", "socketcall", "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "read"}
	fuzzArches  = []string{"SCMP_ARCH_X86", "SCMP_ARCH_X32", "x86", "SCMP_ARCH_AARCH64"}
)

func (f *fuzzProfile) value() uint64 {
	switch c := f.byte(); c % 8 {
	case 0:
		return afVsock
	case 1:
		return 1<<32 | afVsock
	case 2:
		return math.MaxUint32
	case 3:
		return math.MaxUint64&^math.MaxUint32 | afVsock
	case 4:
		return uint64(c >> 3) // small: families, SYS_SOCKET, masks
	case 5:
		return math.MaxUint64
	}
	var v uint64
	for range 8 {
		v = v<<8 | uint64(f.byte())
	}
	return v
}

func (f *fuzzProfile) profile() *seccompOf {
	s := &seccompOf{DefaultAction: pick(f, fuzzActions), Architectures: []string{"SCMP_ARCH_X86_64"}}
	for a := f.byte(); a != 0; a >>= 2 {
		s.Architectures = append(s.Architectures, pick(f, fuzzArches))
	}
	for range f.byte() % 5 {
		r := syscallOf{Action: pick(f, fuzzActions)}
		for range 1 + f.byte()%2 {
			r.Names = append(r.Names, pick(f, fuzzNames))
		}
		for range f.byte() % 3 {
			r.Args = append(r.Args, argOf{Index: uint(f.byte() % 4 / 3), Op: pick(f, fuzzOps), Value: f.value(), ValueTwo: f.value()})
		}
		s.Syscalls = append(s.Syscalls, r)
	}
	return s
}

// condHolds says whether a holds for argument value v, compared as
// libseccomp compares it: whole (64 bits) or, low, on the low 32 bits
// of both (an ABI of 32-bit arguments).
func condHolds(a argOf, v uint64, low bool) bool {
	val, two := a.Value, a.ValueTwo
	if low {
		v, val, two = v&math.MaxUint32, val&math.MaxUint32, two&math.MaxUint32
	}
	switch a.Op {
	case "SCMP_CMP_EQ":
		return v == val
	case "SCMP_CMP_NE":
		return v != val
	case "SCMP_CMP_LT":
		return v < val
	case "SCMP_CMP_LE":
		return v <= val
	case "SCMP_CMP_GT":
		return v > val
	case "SCMP_CMP_GE":
		return v >= val
	case "SCMP_CMP_MASKED_EQ":
		return v&val == two&val
	}
	return true
}

// matches says whether rule r matches a call with argument 0 v and its
// other arguments chosen to match, as runc adds it: its conditions ANDed,
// or, one argument named twice, one rule per condition.
func matches(r syscallOf, v uint64, low bool) bool {
	if repeatsIndex(r.Args) {
		return len(r.Args) == 0 || slices.ContainsFunc(r.Args, func(a argOf) bool { return a.Index != 0 || condHolds(a, v, low) })
	}
	return !slices.ContainsFunc(r.Args, func(a argOf) bool { return a.Index == 0 && !condHolds(a, v, low) })
}

// FuzzVsockJudgement holds vsockLetThrough to calls tried one by one: a
// profile it accepts on amd64 refuses socket(AF_VSOCK) for each family
// value the kernel reads as 40 that it is tried with (high bits where
// libseccomp compares 64 bits, both readings where it may compare 32),
// and socketcall(SYS_SOCKET) on i386; adding a rule that lets socket run
// never turns a refusal into an acceptance; and RefuseVsock's and
// RefuseKeyCalls's rewrite of any profile is one the hook accepts.
func FuzzVsockJudgement(f *testing.F) {
	for _, s := range []string{"", "\x00\x00\x01\x00\x00\x01\x01\x06\x07\x00", "\x01\x05\x02\x00\x00\x01\x01\x03\x01", "\x00\x41\x01\x01\x03\x00\x00\x01\x01\x06\x0c\x04"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fp := &fuzzProfile{b: b}
		s := fp.profile()
		why := s.vsockLetThrough("amd64")
		for _, abi := range abis("amd64") {
			if abi.arch != "SCMP_ARCH_X86_64" && !slices.ContainsFunc(s.Architectures, func(a string) bool { return sameArch(a, abi.arch) }) {
				continue
			}
			said := slices.ContainsFunc(why, func(w string) bool { return strings.HasPrefix(w, abi.arch+": socket(") })
			highs := []uint64{0}
			if abi.wide {
				highs = append(highs, 1, math.MaxUint32, uint64(fp.byte())<<24)
				for _, r := range s.Syscalls {
					for _, a := range r.Args {
						highs = append(highs, a.Value>>32, a.ValueTwo>>32, a.Value>>32+1, a.Value>>32-1)
					}
				}
			}
			for _, h := range highs {
				if v := h<<32 | afVsock; runs(s, "socket", v, abi) && !said {
					t.Fatalf("%+v: judged %q, nothing of socket(%#x) on %s, which may run", s, why, v, abi.arch)
				}
			}
			if abi.socketcall && !slices.ContainsFunc(why, func(w string) bool { return strings.HasPrefix(w, abi.arch+": socketcall(") }) {
				if runs(s, "socketcall", sysSocket, abi) || slices.ContainsFunc(s.Syscalls, func(r syscallOf) bool {
					return slices.Contains(r.Names, "socket") && !slices.Contains(refusing, r.Action)
				}) {
					t.Fatalf("%+v: judged %q, nothing of socketcall(SYS_SOCKET) on %s, which may run", s, why, abi.arch)
				}
			}
		}
		if why != nil {
			more := *s
			more.Syscalls = append(slices.Clone(s.Syscalls), syscallOf{Names: []string{"socket"}, Action: "SCMP_ACT_ALLOW",
				Args: []argOf{{Op: pick(fp, fuzzOps), Value: fp.value(), ValueTwo: fp.value()}}})
			if more.vsockLetThrough("amd64") == nil {
				t.Fatalf("%+v refused (%q), accepted with a rule letting socket run more", s, why)
			}
		}

		// The rewrite, through JSON as the wrappers read a profile.
		raw, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var generic map[string]any
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		if err := d.Decode(&generic); err != nil {
			t.Fatal(err)
		}
		if err := RefuseVsock(generic); err != nil {
			t.Fatal(err)
		}
		if err := RefuseKeyCalls(generic); err != nil {
			t.Fatal(err)
		}
		if raw, err = json.Marshal(generic); err != nil {
			t.Fatal(err)
		}
		var rewritten seccompOf
		if err := json.Unmarshal(raw, &rewritten); err != nil {
			t.Fatalf("the rewrite of %+v does not read back: %v\n%s", s, err, raw)
		}
		if w := append(rewritten.vsockLetThrough("amd64"), rewritten.keyCallsLetThrough()...); w != nil {
			t.Fatalf("the rewrite of %+v is refused: %q\n%s", s, w, raw)
		}
	})
}

// runs says whether call with argument 0 v may run on ABI abi: a rule
// letting it run matches under some reading, or none refusing it
// matches under every reading and the default lets it run.
func runs(s *seccompOf, call string, v uint64, abi abi) bool {
	readings := []bool{false}
	if abi.narrowToo {
		readings = append(readings, true)
	}
	refused := slices.Contains(refusing, s.DefaultAction)
	for _, r := range s.Syscalls {
		if !slices.Contains(r.Names, call) {
			continue
		}
		every, some := true, false
		for _, low := range readings {
			m := matches(r, v, low)
			every, some = every && m, some || m
		}
		if !slices.Contains(refusing, r.Action) {
			if some {
				return true
			}
			continue
		}
		// Conditions on other arguments: the call chooses them not to match.
		if every && !slices.ContainsFunc(r.Args, func(a argOf) bool { return a.Index != 0 }) {
			refused = true
		}
	}
	return !refused
}
