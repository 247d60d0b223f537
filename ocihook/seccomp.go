//go:build linux

package ocihook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// KeyCalls are the kernel key service's system calls. Keyrings belong to
// a uid, not to a PID or IPC namespace: a container running as a uid a
// host process also runs as reads that process's user keyring with them,
// and request_key makes the kernel run the host's /sbin/request-key as
// root. trialnet's own seccomp filter refuses them to the commands it
// launches; a container must be given a profile that refuses them too.
var KeyCalls = []string{"add_key", "keyctl", "request_key"}

// seccompOf is linux.seccomp of the OCI runtime spec, read whole: a key
// this build does not know is refused (see UnmarshalJSON), since the
// runtime may read in it something that lets the key calls through.
type seccompOf struct {
	DefaultAction    string      `json:"defaultAction"`
	DefaultErrnoRet  *uint32     `json:"defaultErrnoRet"`
	Architectures    []string    `json:"architectures"`
	Flags            []string    `json:"flags"`
	ListenerPath     string      `json:"listenerPath"`
	ListenerMetadata string      `json:"listenerMetadata"`
	Syscalls         []syscallOf `json:"syscalls"`
}

type syscallOf struct {
	Names    []string `json:"names"`
	Action   string   `json:"action"`
	ErrnoRet *uint32  `json:"errnoRet"`
	Args     []argOf  `json:"args"`
}

type argOf struct {
	Index    uint   `json:"index"`
	Value    uint64 `json:"value"`
	ValueTwo uint64 `json:"valueTwo"`
	Op       string `json:"op"`
}

// UnmarshalJSON reads the profile refusing unknown keys, in it and in
// its rules: a field of a later spec (or a misspelt one) could change
// what the runtime lets through, and what the hook cannot read it does
// not vouch for.
func (s *seccompOf) UnmarshalJSON(b []byte) error {
	type plain seccompOf
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode((*plain)(s)); err != nil {
		return fmt.Errorf("linux.seccomp: %w", err)
	}
	return nil
}

// refusing are the actions that keep a call from running whatever its
// arguments. SCMP_ACT_ALLOW and SCMP_ACT_LOG run it; SCMP_ACT_NOTIFY
// leaves it to a process outside, SCMP_ACT_TRACE to a tracer, which may
// be another process of the container; a name not here (a later action,
// a misspelling) counts as letting it run.
var refusing = []string{"SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_TRAP"}

// keyCallsLetThrough says, for each key call the profile does not refuse
// for every argument, why; nil: it refuses all three. A call is refused
// when no rule naming it lets it run (with conditions or without: which
// of two rules for one call wins differs between runtimes) and either a
// rule refuses it without conditions or the default action refuses it.
// The rules of an OCI spec apply to every architecture it lists, each
// name resolved in that architecture's table (the i386 and x32 numbers
// of keyctl included); an architecture it does not list gets libseccomp's
// bad-architecture action, which kills.
func (s *seccompOf) keyCallsLetThrough() []string {
	if s == nil {
		return []string{"it has no seccomp profile (linux.seccomp)"}
	}
	var why []string
	for _, call := range KeyCalls {
		if w := s.letsThrough(call); w != "" {
			why = append(why, call+": "+w)
		}
	}
	return why
}

// letsThrough says why the profile may let call run, or "".
func (s *seccompOf) letsThrough(call string) string {
	unconditional, conditional := false, false
	for i, r := range s.Syscalls {
		if !slices.Contains(r.Names, call) {
			continue
		}
		if !slices.Contains(refusing, r.Action) {
			cond := ""
			if len(r.Args) > 0 {
				cond = " for some arguments"
			}
			return fmt.Sprintf("rule %d (%s) lets it run%s", i, r.Action, cond)
		}
		unconditional = unconditional || len(r.Args) == 0
		conditional = conditional || len(r.Args) > 0
	}
	switch {
	case unconditional || slices.Contains(refusing, s.DefaultAction):
		return ""
	case conditional:
		return fmt.Sprintf("refused only for some arguments, and the default action %s lets it run for the others", orNone(s.DefaultAction))
	}
	return fmt.Sprintf("the default action %s lets it run", orNone(s.DefaultAction))
}

func orNone(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// seccompAnnotations are the config's annotations that make crun load
// another filter than linux.seccomp, or answer its notifications: any
// key of crun's run.oci.seccomp family (compared without case, which
// refuses more than crun reads) but run.oci.seccomp_fail_unknown_syscall,
// which only makes crun refuse a profile it cannot read. crun 1.8's
// run.oci.seccomp_bpf_data holds a compiled filter that crun loads in
// place of linux.seccomp: a profile the hook judged refusing, and the
// container runs with a filter that allows everything. The hook cannot
// read a compiled filter, and a later crun's key of this family may
// change the filter too.
func (c *config) seccompAnnotations() []string {
	var out []string
	for k := range c.Annotations {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "run.oci.seccomp") && lk != "run.oci.seccomp_fail_unknown_syscall" {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// seccompAnnotationsAdvice is what the operator of a container refused
// for seccompAnnotations does.
func seccompAnnotationsAdvice(keys []string) string {
	return "its annotations " + strings.Join(keys, ", ") + " make crun run it with another seccomp filter than its linux.seccomp (run.oci.seccomp_bpf_data: a compiled filter in its place) or answer the filter's notifications, which the hook cannot judge: " +
		"leave them out and give the container a linux.seccomp that refuses what a Trial's container must not do (docs/containers.md, \"The kernel's keyrings\")"
}

// KeyCallsErrno is what a refused key call returns: ENOSYS, as from
// trialnet's own filter, so that a program takes the kernel for one
// without the key service and goes on without it.
const KeyCallsErrno = 38

// keyRule is the rule that refuses the key calls.
func keyRule() map[string]any {
	return map[string]any{"names": toAny(KeyCalls), "action": "SCMP_ACT_ERRNO", "errnoRet": json.Number(fmt.Sprint(KeyCallsErrno))}
}

// NativeArchitectures are the seccomp architectures of the host's
// processes: its own and those it runs through compatibility (i386 and
// x32 on x86-64, 32-bit ARM on arm64), so that a 32-bit program in the
// container gets ENOSYS from a key call, not the bad-architecture kill.
func NativeArchitectures(goarch string) []string {
	switch goarch {
	case "amd64":
		return []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"}
	case "arm64":
		return []string{"SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"}
	}
	return nil
}

// ContainerProfile is the least profile for a container in a Trial: it
// keeps the key calls from it, and AF_VSOCK and io_uring (RefuseVsock), and lets every
// other call run, as with no profile at all. It is valid both as an OCI
// linux.seccomp and as a podman or Docker profile file.
func ContainerProfile(goarch string) map[string]any {
	p := map[string]any{"defaultAction": "SCMP_ACT_ALLOW", "architectures": toAny(NativeArchitectures(goarch))}
	if err := RefuseVsock(p); err != nil {
		panic(err) // the profile above is well formed
	}
	p["syscalls"] = append(p["syscalls"].([]any), keyRule())
	return p
}

// RefuseKeyCalls changes a seccomp profile, decoded as generic JSON (an
// OCI linux.seccomp, or a podman or Docker profile file), so that it
// refuses the key calls for every argument and leaves the rest as it
// was: it takes their names out of every rule (a rule left with none
// goes) and adds one rule that refuses them. A profile in the old Docker
// form with a rule's single "name" is handled too.
func RefuseKeyCalls(profile map[string]any) error {
	kept, err := withoutCalls(profile, KeyCalls)
	if err != nil {
		return err
	}
	profile["syscalls"] = append(kept, keyRule())
	return nil
}

// withoutCalls is the profile's rules with calls taken out of each (a
// rule left with no name goes), for a rule the caller adds to refuse
// them.
func withoutCalls(profile map[string]any, calls []string) ([]any, error) {
	rules, ok := profile["syscalls"].([]any)
	if !ok && profile["syscalls"] != nil {
		return nil, fmt.Errorf("the seccomp profile's syscalls is not a list")
	}
	kept := make([]any, 0, len(rules)+1)
	for i, r := range rules {
		rule, ok := r.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("the seccomp profile's rule %d is not an object", i)
		}
		if name, ok := rule["name"].(string); ok && slices.Contains(calls, name) {
			continue
		}
		if rule["names"] != nil {
			names, ok := rule["names"].([]any)
			if !ok {
				return nil, fmt.Errorf("the seccomp profile's rule %d: names is not a list", i)
			}
			left := slices.DeleteFunc(slices.Clone(names), func(n any) bool {
				s, _ := n.(string)
				return slices.Contains(calls, s)
			})
			if len(left) == 0 && len(names) > 0 {
				continue
			}
			rule["names"] = left
		}
		kept = append(kept, rule)
	}
	return kept, nil
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// keyCallsAdvice is what a refused container's operator does.
func keyCallsAdvice(profile string) string {
	return strings.Join([]string{
		"a container in a Trial must not reach the kernel's keyrings: they belong to a uid, not to a container, so a container running as a uid a host process also uses reads that process's keys, and request_key makes the kernel run /sbin/request-key on the host as root",
		"give it a seccomp profile that refuses " + strings.Join(KeyCalls, ", ") + " with no rule letting them run: with podman, --security-opt seccomp=" + profile +
			" (written by 'trialnet oci-hook install': podman's default with these refused); on Kubernetes with CRI-O, a pod seccompProfile of type Localhost naming that file copied to /var/lib/kubelet/seccomp/; in a bundle, a linux.seccomp with a rule refusing them (SCMP_ACT_ERRNO); trialnet oci-runtime (Docker) and trialnet nri on containerd add the refusal themselves (docs/containers.md, \"The kernel's keyrings\")",
	}, "; ")
}
