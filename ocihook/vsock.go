//go:build linux

package ocihook

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
)

// AF_VSOCK is not network-namespaced: from a VM guest a vsock socket
// reaches the hypervisor, and with vsock_loopback the host's own vsock
// listeners, past every namespace a Trial has. The cgroup hooks see only
// inet sockets; the BPF LSM layer refuses it where the kernel has that
// LSM. Without it a container's socket(AF_VSOCK) is up to its seccomp
// profile, which the hook then judges (vsockLetThrough) and the runtime
// wrappers make refuse it (RefuseVsock).
const (
	afVsock    = 40 // AF_VSOCK
	sysSocket  = 1  // socketcall's SYS_SOCKET
	VsockErrno = 97 // EAFNOSUPPORT, as from trialnet's own filter
)

// UringCalls are io_uring's system calls. A ring's IORING_OP_SOCKET
// makes a socket of any family, AF_VSOCK too, without socket(2), where
// no seccomp filter sees it; a ring made outside and handed in works
// too. Without the BPF LSM layer a container must be refused them all,
// as trialnet's own filter refuses them to the commands it launches.
var UringCalls = []string{"io_uring_setup", "io_uring_enter", "io_uring_register"}

// UringErrno is what a refused io_uring call returns: ENOSYS, as from
// trialnet's own filter, so that a program falls back to the calls it
// would make on a kernel without io_uring.
const UringErrno = 38

// abi is one way a container's process reaches the kernel's system calls,
// as seccomp tells them apart.
type abi struct {
	arch string // the seccomp architecture
	// wide: arguments are 64-bit registers, which libseccomp compares
	// whole while the kernel reads an int argument's low 32 bits:
	// socket(0x1_00000028) is AF_VSOCK, and "!= 40" lets it through.
	wide bool
	// narrowToo: libseccomp may compare only the low 32 bits (an ABI
	// of 32-bit arguments, or x32), so both readings are judged.
	narrowToo bool
	// socketcall: socket(2) is also reached as socketcall(SYS_SOCKET,
	// args), whose arguments are behind a pointer seccomp cannot read;
	// libseccomp turns each socket rule into a socketcall one for arg0
	// == SYS_SOCKET, the rule's conditions on arg0 replaced.
	socketcall bool
}

// abis are the ABIs of a host's processes: its own, and those it runs
// through compatibility (the kernel may have them switched off, which the
// hook does not count on).
func abis(goarch string) []abi {
	switch goarch {
	case "amd64":
		return []abi{{arch: "SCMP_ARCH_X86_64", wide: true}, {arch: "SCMP_ARCH_X32", wide: true, narrowToo: true},
			{arch: "SCMP_ARCH_X86", narrowToo: true, socketcall: true}}
	case "arm64":
		return []abi{{arch: "SCMP_ARCH_AARCH64", wide: true}, {arch: "SCMP_ARCH_ARM", narrowToo: true}}
	}
	return nil
}

// argSet is the set of values an argument can take that the kernel reads
// as lo: lo itself, or with wide every value whose low 32 bits are lo.
type argSet struct {
	lo   uint64
	wide bool
}

func (s argSet) max() uint64 {
	if s.wide {
		return math.MaxUint32<<32 | s.lo
	}
	return s.lo
}

// may says whether some value of s meets a; covers whether every one does.
func (s argSet) may(a argOf) bool {
	hi, lo := a.Value>>32, a.Value&math.MaxUint32
	switch a.Op {
	case "SCMP_CMP_EQ":
		return lo == s.lo && (s.wide || hi == 0)
	case "SCMP_CMP_NE":
		return s.wide || a.Value != s.lo
	case "SCMP_CMP_LT":
		return s.lo < a.Value
	case "SCMP_CMP_LE":
		return s.lo <= a.Value
	case "SCMP_CMP_GT":
		return s.max() > a.Value
	case "SCMP_CMP_GE":
		return s.max() >= a.Value
	case "SCMP_CMP_MASKED_EQ":
		// value is the mask, valueTwo the datum, which libseccomp masks
		// too (_db_node_mask_fixup): arg & mask == datum & mask, so a
		// datum's bits past its mask are not compared.
		m, d := a.Value, a.ValueTwo&a.Value
		if s.lo&m&math.MaxUint32 != d&math.MaxUint32 {
			return false
		}
		return s.wide || d>>32 == 0
	}
	return true // an operator this build does not know may match
}

func (s argSet) covers(a argOf) bool {
	switch a.Op {
	case "SCMP_CMP_EQ":
		return !s.wide && a.Value == s.lo
	case "SCMP_CMP_NE":
		return a.Value&math.MaxUint32 != s.lo || !s.wide && a.Value>>32 != 0
	case "SCMP_CMP_LT":
		return s.max() < a.Value
	case "SCMP_CMP_LE":
		return s.max() <= a.Value
	case "SCMP_CMP_GT":
		return s.lo > a.Value
	case "SCMP_CMP_GE":
		return s.lo >= a.Value
	case "SCMP_CMP_MASKED_EQ":
		return s.lo&a.Value&math.MaxUint32 == a.ValueTwo&math.MaxUint32 && a.ValueTwo>>32 == 0 && (!s.wide || a.Value>>32 == 0)
	}
	return false
}

// readings are the ways libseccomp on ABI b may compare an argument:
// whole, and for narrowToo on its low 32 bits only.
func (b abi) readings() []func(argOf) argOf {
	whole := func(a argOf) argOf { return a }
	if !b.narrowToo {
		return []func(argOf) argOf{whole}
	}
	low := func(a argOf) argOf {
		a.Value &= math.MaxUint32
		a.ValueTwo &= math.MaxUint32
		return a
	}
	return []func(argOf) argOf{whole, low}
}

// ruleMay says whether rule r may match a call whose argument 0 is in s,
// whatever the others are. runc adds a rule whose conditions name one
// argument twice as one rule per condition (any of them matches); a
// runtime that ANDs them matches less: "may" is judged as runc's.
func ruleMay(r syscallOf, s argSet, reading func(argOf) argOf) bool {
	if repeatsIndex(r.Args) {
		for _, a := range r.Args {
			if a.Index != 0 || s.may(reading(a)) {
				return true
			}
		}
		return false
	}
	for _, a := range r.Args {
		if a.Index == 0 && !s.may(reading(a)) {
			return false
		}
	}
	return true
}

// mayAny is ruleMay under any of b's readings.
func (b abi) mayAny(r syscallOf, s argSet) bool {
	for _, read := range b.readings() {
		if ruleMay(r, s, read) {
			return true
		}
	}
	return false
}

// ruleCovers says whether rule r matches every call whose argument 0 is
// in s: all its conditions are on argument 0 and each holds for all of s
// (so that it does under either reading of a repeated argument).
func ruleCovers(r syscallOf, s argSet, reading func(argOf) argOf) bool {
	for _, a := range r.Args {
		if a.Index != 0 || !s.covers(reading(a)) {
			return false
		}
	}
	return true
}

func repeatsIndex(args []argOf) bool {
	seen := map[uint]bool{}
	for _, a := range args {
		if seen[a.Index] {
			return true
		}
		seen[a.Index] = true
	}
	return false
}

// vsockLetThrough says, for each ABI of the host's processes on which the
// profile may let socket(AF_VSOCK, any, any) run, why; nil: it refuses it
// on every one. On x86 (i386) socketcall(SYS_SOCKET, …) must be refused
// too, since the family is behind a pointer there. The judgement is
// exact where it can be and otherwise errs towards "may run":
//   - an ABI the profile does not list (its own is always in) gets
//     libseccomp's bad-architecture action, which neither runc nor crun
//     changes: KILL, so the call is refused;
//   - a rule whose action lets a call run (ALLOW, LOG, TRACE, NOTIFY, one
//     this build does not know) and that may match lets it through,
//     whatever other rules say: which of two matching rules wins is up to
//     libseccomp's ordering, not the profile's;
//   - otherwise the call is refused when the default action refuses, or
//     when one refusing rule matches it for every argument (two rules
//     that only together cover it are not counted) and no rule for the
//     call compares an argument other than 0: libseccomp 2.5.4 compiles
//     such a set of rules into a filter whose comparison of argument 0
//     reads the other argument's value where their chains meet (with
//     "arg0 > 10: KILL" and "arg0 <= 40 && arg1 >= 40: ERRNO",
//     socket(40, 1, 0) runs: 1 is not > 10). For the same reason a rule
//     letting the call run for other families is counted as one that may
//     let this one run where a rule for the call compares another
//     argument: with the default refusing, only refusing rules may;
//   - flags (log, spec_allow, tsync, wait_killable_recv) change no action.
func (s *seccompOf) vsockLetThrough(goarch string) []string {
	if s == nil {
		return []string{"it has no seccomp profile (linux.seccomp)"}
	}
	all := abis(goarch)
	if all == nil {
		return []string{"the hook cannot judge a profile on " + goarch}
	}
	var why []string
	for i, b := range all {
		if i > 0 && !slices.ContainsFunc(s.Architectures, func(a string) bool { return sameArch(a, b.arch) }) {
			continue // the bad-architecture action kills
		}
		fam := argSet{lo: afVsock, wide: b.wide}
		if w := s.refusal("socket", fam, b, nil); w != "" {
			why = append(why, b.arch+": socket(AF_VSOCK): "+w)
		}
		if b.socketcall {
			mux := func(r syscallOf) bool { return slices.Contains(r.Names, "socket") }
			if w := s.refusal("socketcall", argSet{lo: sysSocket}, b, mux); w != "" {
				why = append(why, b.arch+": socketcall(SYS_SOCKET), which carries the family where seccomp cannot read it: "+w)
			}
		}
	}
	for _, call := range UringCalls {
		if w := s.letsThrough(call); w != "" {
			why = append(why, call+", whose ring makes sockets (IORING_OP_SOCKET) where seccomp cannot see them: "+w)
		}
	}
	return why
}

// refusal says why call with argument 0 in set may run on ABI b, or "".
// muxed picks the rules libseccomp also applies to call with argument 0
// replaced (socket's on socketcall): such a rule that lets a call run
// lets this one through whatever its conditions.
func (s *seccompOf) refusal(call string, set argSet, b abi, muxed func(syscallOf) bool) string {
	named := func(r syscallOf) bool { return slices.Contains(r.Names, call) || muxed != nil && muxed(r) }
	// A rule for call that the runtime adds and that compares another
	// argument than 0: beside it, libseccomp 2.5 may read that argument
	// where another rule compares argument 0 (see vsockLetThrough).
	other := slices.IndexFunc(s.Syscalls, func(r syscallOf) bool {
		return named(r) && !s.asDefault(r) && slices.ContainsFunc(r.Args, func(a argOf) bool { return a.Index != 0 })
	})
	miscompiled := func(what string) string {
		r := s.Syscalls[other]
		return fmt.Sprintf("%s, and rule %d compares argument %d: libseccomp 2.5 (Debian 12's) compiles such rules into a filter that reads another argument where a rule compares argument 0, and may let the call run; "+
			"make every rule for %s compare argument 0 alone, or have only rules that refuse it and a default that refuses",
			what, other, r.Args[slices.IndexFunc(r.Args, func(a argOf) bool { return a.Index != 0 })].Index, call)
	}
	covered, cannot := false, -1
	for i, r := range s.Syscalls {
		viaMux := muxed != nil && muxed(r)
		if !named(r) {
			continue
		}
		if !slices.Contains(refusing, r.Action) {
			if viaMux {
				return fmt.Sprintf("rule %d (%s) for socket becomes one for socketcall(SYS_SOCKET) whatever its conditions, and lets it run", i, r.Action)
			}
			if b.mayAny(r, set) {
				cond := ""
				if len(r.Args) > 0 {
					cond = fmt.Sprintf(" (its conditions %s hold for some such call)", argsString(r.Args))
				}
				return fmt.Sprintf("rule %d (%s) lets it run%s", i, r.Action, cond)
			}
			if cannot < 0 && !s.asDefault(r) {
				cannot = i
			}
			continue
		}
		if viaMux && !slices.Contains(r.Names, call) {
			continue // counted on only when named
		}
		c := true
		for _, read := range b.readings() {
			c = c && ruleCovers(r, set, read)
		}
		covered = covered || c
	}
	switch {
	case cannot >= 0 && other >= 0:
		return miscompiled(fmt.Sprintf("rule %d (%s) lets it run for other arguments", cannot, s.Syscalls[cannot].Action))
	case slices.Contains(refusing, s.DefaultAction):
		return ""
	case covered && other >= 0:
		return miscompiled(fmt.Sprintf("the default action %s lets it run and a rule refuses it", s.DefaultAction))
	case covered:
		return ""
	}
	return fmt.Sprintf("no rule refuses it for every argument, and the default action %s lets it run", orNone(s.DefaultAction))
}

// asDefault says whether rule r has the default action, errno and all,
// which runc and crun both skip rather than add (a rule of no effect):
// an errno not given is EPERM to both.
func (s *seccompOf) asDefault(r syscallOf) bool {
	errno := func(e *uint32) uint32 {
		if e == nil {
			return 1
		}
		return *e
	}
	return r.Action == s.DefaultAction && errno(r.ErrnoRet) == errno(s.DefaultErrnoRet)
}

// sameArch says whether a runtime reads listed as arch (an SCMP_ARCH_
// name). runc takes the names as spelt; crun strips "SCMP_ARCH_" and
// looks up the rest lowercased, so "x86" and "SCMP_ARCH_x86" are i386
// to it as much as SCMP_ARCH_X86.
func sameArch(listed, arch string) bool {
	crun := func(a string) string { return strings.ToLower(strings.TrimPrefix(a, "SCMP_ARCH_")) }
	return crun(listed) == crun(arch)
}

func argsString(args []argOf) string {
	var out []string
	for _, a := range args {
		v := fmt.Sprintf("arg%d %s %#x", a.Index, strings.TrimPrefix(a.Op, "SCMP_CMP_"), a.Value)
		if a.Op == "SCMP_CMP_MASKED_EQ" {
			v = fmt.Sprintf("arg%d & %#x == %#x", a.Index, a.Value, a.ValueTwo)
		}
		out = append(out, v)
	}
	return strings.Join(out, ", ")
}

// vsockAdvice is what the operator of a container refused for vsock does.
func vsockAdvice(profile string) string {
	return "without the BPF LSM layer (the agent has not attached it: the kernel boots without bpf in lsm=, or the agent is older than this hook and does not say) nothing but the container's seccomp profile keeps it from AF_VSOCK, which no network namespace holds: from a VM guest it reaches the hypervisor, and host-local vsock listeners through vsock_loopback. " +
		"Give it a profile that refuses socket(40, …) on every architecture it lists (and socketcall(1, …) where it lists SCMP_ARCH_X86): " +
		"trialnet oci-runtime (Docker) adds the refusal itself; with podman, --security-opt seccomp=" + profile + " (written by 'trialnet oci-hook install'; one written by an earlier trialnet may no longer pass: 'trialnet oci-hook install --force' writes it again); " +
		"in a bundle, a rule {\"names\":[\"socket\"],\"action\":\"SCMP_ACT_ERRNO\",\"errnoRet\":97,\"args\":[{\"index\":0,\"value\":4294967295,\"valueTwo\":40,\"op\":\"SCMP_CMP_MASKED_EQ\"}]} and no rule letting socket run for that family; " +
		"and a rule refusing " + strings.Join(UringCalls, ", ") + " with none letting them run; " +
		"or boot the kernel with bpf in lsm= (docs/containers.md, \"AF_VSOCK\")"
}

// allowBlocks are the families other than AF_VSOCK below 64, as aligned
// blocks of base and size: 0-31, 32-39, 41, 42-43, 44-47 and 48-63. A
// rule letting socket run that RefuseVsock rewrites keeps the blocks its
// own conditions on argument 0 allow, a block split in halves where they
// allow part of it, each as a condition on argument 0's low 32 bits, as
// the kernel reads the family. The kernel has no family past 63 (AF_MAX
// is 46): a value past them falls to the profile's other rules and its
// default. The masks fit in 32 bits, which every runtime's JSON reads
// (crun's parser has no integer past 2^63).
var allowBlocks = [][2]uint64{{0, 32}, {32, 8}, {41, 1}, {42, 2}, {44, 4}, {48, 16}}

// blockArgs are the conditions for the families of block [base,
// base+size) that meet every one of conds, conditions on argument 0.
func blockArgs(base, size uint64, conds []argOf) []argOf {
	in := 0
	for x := base; x < base+size; x++ {
		ok := true
		for _, c := range conds {
			ok = ok && (argSet{lo: x}).covers(c)
		}
		if ok {
			in++
		}
	}
	switch {
	case in == 0:
		return nil
	case in == int(size):
		return []argOf{{Index: 0, Value: math.MaxUint32 &^ (size - 1), ValueTwo: base, Op: "SCMP_CMP_MASKED_EQ"}}
	}
	return append(blockArgs(base, size/2, conds), blockArgs(base+size/2, size/2, conds)...)
}

// vsockRule refuses socket(AF_VSOCK), its family compared on its low 32
// bits as the kernel reads it; socketcallRule socketcall(SYS_SOCKET).
func vsockRule() map[string]any {
	return map[string]any{"names": []any{"socket"}, "action": "SCMP_ACT_ERRNO", "errnoRet": json.Number(fmt.Sprint(VsockErrno)),
		"args": []any{argJSON(argOf{Index: 0, Value: math.MaxUint32, ValueTwo: afVsock, Op: "SCMP_CMP_MASKED_EQ"})}}
}

func uringRule() map[string]any {
	return map[string]any{"names": toAny(UringCalls), "action": "SCMP_ACT_ERRNO", "errnoRet": json.Number(fmt.Sprint(UringErrno))}
}

func socketcallRule() map[string]any {
	return map[string]any{"names": []any{"socketcall"}, "action": "SCMP_ACT_ERRNO", "errnoRet": json.Number(fmt.Sprint(VsockErrno)),
		"args": []any{argJSON(argOf{Index: 0, Value: sysSocket, Op: "SCMP_CMP_EQ"})}}
}

func argJSON(a argOf) map[string]any {
	return map[string]any{"index": json.Number(fmt.Sprint(a.Index)), "value": json.Number(fmt.Sprint(a.Value)),
		"valueTwo": json.Number(fmt.Sprint(a.ValueTwo)), "op": a.Op}
}

// ruleOf reads a rule of a profile decoded as generic JSON: an OCI rule,
// or a podman or Docker file's, whose other keys (includes, excludes,
// comment) it keeps as they are.
func ruleOf(rule map[string]any) (syscallOf, error) {
	var r struct {
		syscallOf
		Name string `json:"name"`
	}
	b, err := json.Marshal(rule)
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if r.Name != "" {
		r.Names = append(r.Names, r.Name)
	}
	return r.syscallOf, err
}

// RefuseVsock changes a seccomp profile, decoded as generic JSON (an OCI
// linux.seccomp, or a podman or Docker profile file), so that the hook
// judges it to refuse socket(AF_VSOCK) (vsockLetThrough) and leaves every
// other family as it was:
//   - a rule that lets socket run for AF_VSOCK (podman's, with socket
//     among 370 names; Docker's "arg0 != 40", which 0x1_00000028 passes)
//     loses socket, and gets in its place one rule per block of
//     families its own conditions on argument 0 allow (allowBlocks),
//     with its other conditions;
//   - one rule refuses socket for a family whose low 32 bits are 40;
//   - where the profile lists SCMP_ARCH_X86: a rule letting socket run on
//     any family also lets socketcall(SYS_SOCKET) run there, which
//     carries the family where seccomp cannot read it. With such a rule
//     left, or one letting socketcall run, SCMP_ARCH_X86 is taken off the
//     profile (32-bit x86 programs then meet the bad-architecture action,
//     as trialnet's own filter refuses them too); without, a rule refuses
//     socketcall(SYS_SOCKET);
//   - io_uring's calls (UringCalls) are taken out of every rule and one
//     rule refuses them;
//   - a rule for socket or socketcall that compares an argument other
//     than 0 (podman's, for NETLINK_AUDIT) is one libseccomp 2.5
//     miscompiles beside the refusal (see vsockLetThrough): for those
//     calls, a refusing one goes and one letting them run loses those
//     conditions, which lets the families it let run whatever their
//     type and protocol.
func RefuseVsock(profile map[string]any) error {
	rules, err := withoutCalls(profile, UringCalls)
	if err != nil {
		return err
	}
	// Judged as on x32: 64-bit arguments, read whole or on their low half.
	wide, x32 := argSet{lo: afVsock, wide: true}, abi{wide: true, narrowToo: true}
	kept := make([]any, 0, len(rules)+len(allowBlocks)+2)
	letsSocketRun := false
	for i, x := range rules {
		rule, ok := x.(map[string]any)
		if !ok {
			return fmt.Errorf("the seccomp profile's rule %d is not an object", i)
		}
		r, err := ruleOf(rule)
		if err != nil {
			return fmt.Errorf("the seccomp profile's rule %d: %w", i, err)
		}
		lets := !slices.Contains(refusing, r.Action)
		if lets && slices.Contains(r.Names, "socketcall") {
			letsSocketRun = true
		}
		sock := func(n string) bool { return n == "socket" || n == "socketcall" }
		if slices.ContainsFunc(r.Names, sock) && slices.ContainsFunc(r.Args, func(a argOf) bool { return a.Index != 0 }) {
			// libseccomp 2.5 miscompiles it beside the refusal (see
			// vsockLetThrough): for socket and socketcall, a refusing
			// rule goes, one letting them run keeps its conditions on
			// argument 0 alone.
			if rest := slices.DeleteFunc(slices.Clone(r.Names), sock); len(rest) > 0 {
				other := cloneRule(rule)
				delete(other, "name")
				other["names"] = toAny(rest)
				kept = append(kept, other)
			}
			if !lets {
				continue
			}
			r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return !sock(n) })
			r.Args = slices.DeleteFunc(r.Args, func(a argOf) bool { return a.Index != 0 })
			rule = cloneRule(rule)
			delete(rule, "name")
			rule["names"] = toAny(r.Names)
			args := make([]any, len(r.Args))
			for i, a := range r.Args {
				args[i] = argJSON(a)
			}
			rule["args"] = args
		}
		if !lets || !slices.Contains(r.Names, "socket") {
			kept = append(kept, rule)
			continue
		}
		letsSocketRun = true
		if !x32.mayAny(r, wide) {
			kept = append(kept, rule)
			continue
		}
		if rest := slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return n == "socket" }); len(rest) > 0 {
			other := cloneRule(rule)
			delete(other, "name")
			other["names"] = toAny(rest)
			kept = append(kept, other)
		}
		if repeatsIndex(r.Args) {
			continue // read as one rule per condition: no piece can be added to it
		}
		var others []any
		var conds0 []argOf
		for _, a := range r.Args {
			if a.Index == 0 {
				conds0 = append(conds0, a)
			} else {
				others = append(others, argJSON(a))
			}
		}
		var pieces []argOf
		for _, b := range allowBlocks {
			pieces = append(pieces, blockArgs(b[0], b[1], conds0)...)
		}
		for _, p := range pieces {
			piece := cloneRule(rule)
			delete(piece, "name")
			piece["names"] = []any{"socket"}
			piece["args"] = append(slices.Clone(others), argJSON(p))
			kept = append(kept, piece)
		}
	}
	kept = append(kept, vsockRule())
	if hasArch(profile, "SCMP_ARCH_X86") {
		if letsSocketRun {
			dropArch(profile, "SCMP_ARCH_X86")
		} else {
			kept = append(kept, socketcallRule())
		}
	}
	profile["syscalls"] = append(kept, uringRule())
	return nil
}

func cloneRule(rule map[string]any) map[string]any {
	out := make(map[string]any, len(rule))
	for k, v := range rule {
		out[k] = v
	}
	return out
}

// hasArch says whether the profile lists arch: in architectures (OCI, and
// the old Docker form) or in archMap (a podman or Docker file).
func hasArch(profile map[string]any, arch string) bool {
	found := false
	eachArchList(profile, func(l []any) []any {
		found = found || slices.ContainsFunc(l, func(a any) bool { return isArch(a, arch) })
		return l
	})
	return found
}

func dropArch(profile map[string]any, arch string) {
	eachArchList(profile, func(l []any) []any {
		return slices.DeleteFunc(slices.Clone(l), func(a any) bool { return isArch(a, arch) })
	})
	if m, ok := profile["archMap"].([]any); ok {
		profile["archMap"] = slices.DeleteFunc(slices.Clone(m), func(e any) bool {
			o, _ := e.(map[string]any)
			return o != nil && isArch(o["architecture"], arch)
		})
	}
}

func isArch(listed any, arch string) bool {
	s, ok := listed.(string)
	return ok && sameArch(s, arch)
}

func eachArchList(profile map[string]any, fn func([]any) []any) {
	if l, ok := profile["architectures"].([]any); ok {
		profile["architectures"] = fn(l)
	}
	m, _ := profile["archMap"].([]any)
	for _, e := range m {
		o, _ := e.(map[string]any)
		if o == nil {
			continue
		}
		if sub, ok := o["subArchitectures"].([]any); ok {
			o["subArchitectures"] = fn(sub)
		}
	}
}
