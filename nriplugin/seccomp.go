//go:build linux

package nriplugin

import (
	goruntime "runtime"
	"slices"

	"github.com/containerd/nri/pkg/api"
	"github.com/trialnet/trialnet/ocihook"
	"google.golang.org/protobuf/proto"
)

// keyCallsPolicy is the seccomp policy that the plugin gives a container
// of a Trial: the one the runtime made for it (its default, or the pod's
// Localhost profile) with the kernel's key calls refused and nothing else
// changed, or, for an Unconfined container, the least policy that
// refuses them. nil: NRI shows neither a policy nor that there is none
// (CRI-O shows neither, containerd before 2.2.1 no profile type, and no
// runtime the policy yet), and the plugin leaves the runtime's in place
// for the hook to judge at createRuntime: replacing a policy it cannot
// see would undo the runtime's other refusals.
func keyCallsPolicy(ctr *api.Container) *api.LinuxSeccomp {
	l := ctr.GetLinux()
	if pol := l.GetSeccompPolicy(); pol != nil {
		p := proto.Clone(pol).(*api.LinuxSeccomp)
		kept := p.Syscalls[:0]
		for _, r := range p.Syscalls {
			n := len(r.Names)
			r.Names = slices.DeleteFunc(r.Names, func(name string) bool { return slices.Contains(ocihook.KeyCalls, name) })
			if len(r.Names) > 0 || n == 0 {
				kept = append(kept, r)
			}
		}
		p.Syscalls = append(kept, keyRule())
		return p
	}
	if prof := l.GetSeccompProfile(); prof != nil && prof.GetProfileType() == api.SecurityProfile_UNCONFINED {
		return &api.LinuxSeccomp{DefaultAction: "SCMP_ACT_ALLOW", Architectures: ocihook.NativeArchitectures(goruntime.GOARCH),
			Syscalls: []*api.LinuxSyscall{keyRule()}}
	}
	return nil
}

func keyRule() *api.LinuxSyscall {
	return &api.LinuxSyscall{Names: slices.Clone(ocihook.KeyCalls), Action: "SCMP_ACT_ERRNO",
		ErrnoRet: api.UInt32(uint32(ocihook.KeyCallsErrno))}
}
