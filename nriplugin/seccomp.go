//go:build linux

package nriplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	goruntime "runtime"
	"slices"

	"github.com/containerd/nri/pkg/api"
	"github.com/trialnet/trialnet/ocihook"
	"google.golang.org/protobuf/proto"
)

// containerPolicy is the seccomp policy that the plugin gives a container
// of a Trial: the one the runtime made for it (its default, or the pod's
// Localhost profile) with the kernel's key calls and AF_VSOCK refused
// (ocihook.RefuseVsock) and nothing else changed, or, for an Unconfined
// container, the least policy that refuses them. nil: NRI shows neither
// a policy nor that there is none (CRI-O shows neither, containerd
// before 2.2.1 no profile type, and no runtime the policy yet), and the
// plugin leaves the runtime's in place for the hook to judge at
// createRuntime: replacing a policy it cannot see would undo the
// runtime's other refusals.
func containerPolicy(ctr *api.Container) (*api.LinuxSeccomp, error) {
	l := ctr.GetLinux()
	var p *api.LinuxSeccomp
	if pol := l.GetSeccompPolicy(); pol != nil {
		p = proto.Clone(pol).(*api.LinuxSeccomp)
		kept := p.Syscalls[:0]
		for _, r := range p.Syscalls {
			n := len(r.Names)
			r.Names = slices.DeleteFunc(r.Names, func(name string) bool { return slices.Contains(ocihook.KeyCalls, name) })
			if len(r.Names) > 0 || n == 0 {
				kept = append(kept, r)
			}
		}
		p.Syscalls = kept
	} else if prof := l.GetSeccompProfile(); prof != nil && prof.GetProfileType() == api.SecurityProfile_UNCONFINED {
		p = &api.LinuxSeccomp{DefaultAction: "SCMP_ACT_ALLOW", Architectures: ocihook.NativeArchitectures(goruntime.GOARCH)}
	} else {
		return nil, nil
	}
	if err := refuseVsock(p); err != nil {
		return nil, err
	}
	p.Syscalls = append(p.Syscalls, keyRule())
	return p, nil
}

// refuseVsock applies ocihook.RefuseVsock to p through the OCI form of
// its rules and architectures, which it shares with the spec.
func refuseVsock(p *api.LinuxSeccomp) error {
	type arg struct {
		Index    uint32 `json:"index"`
		Value    uint64 `json:"value"`
		ValueTwo uint64 `json:"valueTwo"`
		Op       string `json:"op"`
	}
	type rule struct {
		Names    []string `json:"names"`
		Action   string   `json:"action"`
		ErrnoRet *uint32  `json:"errnoRet,omitempty"`
		Args     []arg    `json:"args,omitempty"`
	}
	rules := make([]rule, len(p.Syscalls))
	for i, r := range p.Syscalls {
		rules[i] = rule{Names: r.Names, Action: r.Action}
		if r.ErrnoRet != nil {
			rules[i].ErrnoRet = &r.ErrnoRet.Value
		}
		for _, a := range r.Args {
			rules[i].Args = append(rules[i].Args, arg{a.Index, a.Value, a.ValueTwo, a.Op})
		}
	}
	var generic []any
	b, err := json.Marshal(rules)
	if err == nil {
		// Numbers as written: through float64 a value past 2^53 would
		// be rounded, and 2^64-1 would not read back.
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		err = d.Decode(&generic)
	}
	if err != nil {
		return err
	}
	arches := make([]any, len(p.Architectures))
	for i, a := range p.Architectures {
		arches[i] = a
	}
	m := map[string]any{"syscalls": generic, "architectures": arches}
	if err := ocihook.RefuseVsock(m); err != nil {
		return err
	}
	if b, err = json.Marshal(m["syscalls"]); err == nil {
		rules = nil
		err = json.Unmarshal(b, &rules)
	}
	if err != nil {
		return fmt.Errorf("the container's seccomp policy: %w", err)
	}
	p.Architectures = p.Architectures[:0]
	for _, a := range m["architectures"].([]any) {
		p.Architectures = append(p.Architectures, a.(string))
	}
	p.Syscalls = make([]*api.LinuxSyscall, len(rules))
	for i, r := range rules {
		s := &api.LinuxSyscall{Names: r.Names, Action: r.Action}
		if r.ErrnoRet != nil {
			s.ErrnoRet = api.UInt32(*r.ErrnoRet)
		}
		for _, a := range r.Args {
			s.Args = append(s.Args, &api.LinuxSeccompArg{Index: a.Index, Value: a.Value, ValueTwo: a.ValueTwo, Op: a.Op})
		}
		p.Syscalls[i] = s
	}
	return nil
}

func keyRule() *api.LinuxSyscall {
	return &api.LinuxSyscall{Names: slices.Clone(ocihook.KeyCalls), Action: "SCMP_ACT_ERRNO",
		ErrnoRet: api.UInt32(uint32(ocihook.KeyCallsErrno))}
}
