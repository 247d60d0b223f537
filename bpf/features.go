//go:build linux

package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
)

// Check is one kernel capability trialnet relies on.
type Check struct {
	Name string
	Err  error // nil: present
	// Required means trialnet cannot enforce without it.
	Required bool
}

// haveUnixHooks probes for cgroup/connect_unix and cgroup/sendmsg_unix
// (Linux 6.7). The features package has no probe for attach types, so this
// loads a minimal program with that expected attach type: older kernels
// refuse the attach type at load time.
func haveUnixHooks() error {
	for _, at := range []ebpf.AttachType{ebpf.AttachCgroupUnixConnect, ebpf.AttachCgroupUnixSendmsg} {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:       ebpf.CGroupSockAddr,
			AttachType: at,
			License:    "GPL",
			Instructions: asm.Instructions{
				asm.Mov.Imm(asm.R0, 1),
				asm.Return(),
			},
		})
		if err != nil {
			return fmt.Errorf("no cgroup connect_unix/sendmsg_unix hook (Linux 6.7+; without it only the BPF LSM layer confines unix sockets): %w", err)
		}
		_ = prog.Close()
	}
	return nil
}

// Probe lists what this kernel offers the eBPF layer.
func Probe() []Check {
	var checks []Check
	add := func(name string, required bool, err error) {
		checks = append(checks, Check{Name: name, Err: err, Required: required})
	}
	add("bpf syscall and cgroup_sock_addr programs", true, features.HaveProgramType(ebpf.CGroupSockAddr))
	add("cgroup_sock programs (sock_create)", true, features.HaveProgramType(ebpf.CGroupSock))
	add("cgroup_skb programs (egress)", true, features.HaveProgramType(ebpf.CGroupSKB))
	add("per-CPU hash maps", true, features.HaveMapType(ebpf.PerCPUHash))
	add("bpf_get_netns_cookie in sock_addr programs", true, features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetNetnsCookie))
	add("bpf_get_current_ancestor_cgroup_id", true, features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetCurrentAncestorCgroupId))
	add("bpf_skb_ancestor_cgroup_id", true, features.HaveProgramHelper(ebpf.CGroupSKB, asm.FnSkbAncestorCgroupId))
	add("bounded loops", false, features.HaveBoundedLoops())
	add("connect_unix/sendmsg_unix hooks (Linux 6.7+)", false, haveUnixHooks())
	add("BPF LSM (bpf in the active LSM list)", false, HaveLSM())
	add("sk_lookup programs (transparent mode: connections to a Trial's name pool reach the agent; Linux 5.9+, else --no-transparent)", false, features.HaveProgramType(ebpf.SkLookup))
	return checks
}

// CanEnforce is nil when every required check passed.
func CanEnforce(checks []Check) error {
	var errs []error
	for _, c := range checks {
		if c.Required && c.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.Name, c.Err))
		}
	}
	return errors.Join(errs...)
}
