//go:build linux

package nriplugin

import (
	"slices"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/ocihook"
	"google.golang.org/protobuf/proto"
)

// The policy the plugin gives a pod's container: the runtime's with the
// key calls and AF_VSOCK refused (ocihook.RefuseVsock) and nothing else
// changed; for an Unconfined container the least that refuses them; none
// where NRI shows no policy it could keep (the hook judges the runtime's
// at createRuntime).
func TestContainerPolicy(t *testing.T) {
	refuse := &api.LinuxSyscall{Names: ocihook.KeyCalls, Action: "SCMP_ACT_ERRNO", ErrnoRet: api.UInt32(uint32(38))}
	vsock := []*api.LinuxSyscall{
		{Names: []string{"socket"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: api.UInt32(uint32(97)), Args: []*api.LinuxSeccompArg{{Index: 0, Value: 0xffffffff, ValueTwo: 40, Op: "SCMP_CMP_MASKED_EQ"}}},
		{Names: []string{"socketcall"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: api.UInt32(uint32(97)), Args: []*api.LinuxSeccompArg{{Index: 0, Value: 1, Op: "SCMP_CMP_EQ"}}},
		{Names: ocihook.UringCalls, Action: "SCMP_ACT_ERRNO", ErrnoRet: api.UInt32(uint32(38))},
	}
	policy := func(ctr *api.Container) *api.LinuxSeccomp {
		t.Helper()
		p, err := containerPolicy(ctr)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	ctr := testContainer("c1")
	orig := proto.Clone(ctr.Linux.SeccompPolicy).(*api.LinuxSeccomp)
	got := policy(ctr)
	want := proto.Clone(orig).(*api.LinuxSeccomp)
	want.Syscalls[0].Names = []string{"read", "write"}
	want.Syscalls = append(append(want.Syscalls, vsock...), refuse)
	if !proto.Equal(got, want) {
		t.Errorf("the runtime's policy became\n%v\nwant\n%v", got, want)
	}
	if !proto.Equal(ctr.Linux.SeccompPolicy, orig) {
		t.Error("the container's own policy was changed in place")
	}

	ctr.Linux.SeccompPolicy.Syscalls = append(ctr.Linux.SeccompPolicy.Syscalls, &api.LinuxSyscall{Names: []string{"keyctl"}, Action: "SCMP_ACT_LOG"})
	if got := policy(ctr).Syscalls; len(got) != 6 || !proto.Equal(got[5], refuse) {
		t.Errorf("a rule naming only a key call stays: %v", got)
	}

	// Docker 23's rule, which socket(0x1_00000028) passes: socket keeps
	// every family but 40 through low-32-bit masks, and i386, where the
	// rule would let socketcall(SYS_SOCKET) run, is dropped.
	ctr = testContainer("c1")
	ctr.Linux.SeccompPolicy.Syscalls = append(ctr.Linux.SeccompPolicy.Syscalls,
		&api.LinuxSyscall{Names: []string{"socket"}, Action: "SCMP_ACT_ALLOW", Args: []*api.LinuxSeccompArg{{Index: 0, Value: 40, Op: "SCMP_CMP_NE"}}})
	got = policy(ctr)
	if slices.Contains(got.Architectures, "SCMP_ARCH_X86") || !slices.Contains(got.Architectures, "SCMP_ARCH_X86_64") {
		t.Errorf("architectures %v, want i386 dropped", got.Architectures)
	}
	for _, r := range got.Syscalls {
		for _, a := range r.Args {
			if slices.Contains(r.Names, "socket") && r.Action == "SCMP_ACT_ALLOW" && (a.Op != "SCMP_CMP_MASKED_EQ" || a.Value > 0xffffffff || 40&a.Value == a.ValueTwo) {
				t.Errorf("a rule lets socket run for AF_VSOCK: %v", r)
			}
		}
	}

	// A value past 2^53 stays as the runtime gave it (read through
	// float64 it was rounded, 2^64-1 refused as out of range).
	ctr = testContainer("c1")
	big := &api.LinuxSyscall{Names: []string{"ioctl"}, Action: "SCMP_ACT_ERRNO",
		Args: []*api.LinuxSeccompArg{{Index: 1, Value: 1<<53 + 1, Op: "SCMP_CMP_EQ"}, {Index: 2, Value: 1<<64 - 1, ValueTwo: 1<<63 + 1, Op: "SCMP_CMP_MASKED_EQ"}}}
	ctr.Linux.SeccompPolicy.Syscalls = append(ctr.Linux.SeccompPolicy.Syscalls, big)
	if got := policy(ctr).Syscalls; !slices.ContainsFunc(got, func(r *api.LinuxSyscall) bool { return proto.Equal(r, big) }) {
		t.Errorf("a rule with values past 2^53 became %v", got)
	}

	ctr = testContainer("c2")
	ctr.Linux.SeccompPolicy = nil
	ctr.Linux.SeccompProfile = &api.SecurityProfile{ProfileType: api.SecurityProfile_UNCONFINED}
	got = policy(ctr)
	if got.GetDefaultAction() != "SCMP_ACT_ALLOW" || len(got.GetSyscalls()) < 2 || !proto.Equal(got.Syscalls[len(got.Syscalls)-1], refuse) ||
		!proto.Equal(got.Syscalls[0], vsock[0]) || len(got.GetArchitectures()) == 0 {
		t.Errorf("an Unconfined container's policy: %v", got)
	}

	for _, prof := range []*api.SecurityProfile{nil, {ProfileType: api.SecurityProfile_RUNTIME_DEFAULT}, {ProfileType: api.SecurityProfile_LOCALHOST, LocalhostRef: "p.json"}} {
		ctr.Linux.SeccompProfile = prof
		if got := policy(ctr); got != nil {
			t.Errorf("profile %v without a policy shown: replaced with %v", prof, got)
		}
	}

	info := client.TrialInfo{Netns: "/run/trialnet/netns/k8s-x", Cgroup: "/sys/fs/cgroup/trialnet/k8s-x", ProxyURL: "http://127.0.0.1:3128"}
	adj, err := testPlugin.adjust(testContainer("c3"), info)
	if err != nil {
		t.Fatal(err)
	}
	if rules := adj.GetLinux().GetSeccompPolicy().GetSyscalls(); len(rules) == 0 || !slices.Equal(rules[len(rules)-1].Names, ocihook.KeyCalls) {
		t.Errorf("the adjustment's policy %v", adj.GetLinux().GetSeccompPolicy())
	}
}
