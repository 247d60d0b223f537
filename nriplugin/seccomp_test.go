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
// key calls refused and nothing else changed; for an Unconfined
// container the least that refuses them; none where NRI shows no policy
// it could keep (the hook judges the runtime's at createRuntime).
func TestKeyCallsPolicy(t *testing.T) {
	refuse := &api.LinuxSyscall{Names: ocihook.KeyCalls, Action: "SCMP_ACT_ERRNO", ErrnoRet: api.UInt32(uint32(38))}

	ctr := testContainer("c1")
	orig := proto.Clone(ctr.Linux.SeccompPolicy).(*api.LinuxSeccomp)
	got := keyCallsPolicy(ctr)
	want := proto.Clone(orig).(*api.LinuxSeccomp)
	want.Syscalls[0].Names = []string{"read", "write"}
	want.Syscalls = append(want.Syscalls, refuse)
	if !proto.Equal(got, want) {
		t.Errorf("the runtime's policy became\n%v\nwant\n%v", got, want)
	}
	if !proto.Equal(ctr.Linux.SeccompPolicy, orig) {
		t.Error("the container's own policy was changed in place")
	}

	ctr.Linux.SeccompPolicy.Syscalls = append(ctr.Linux.SeccompPolicy.Syscalls, &api.LinuxSyscall{Names: []string{"keyctl"}, Action: "SCMP_ACT_LOG"})
	if got := keyCallsPolicy(ctr).Syscalls; len(got) != 3 || !proto.Equal(got[2], refuse) {
		t.Errorf("a rule naming only a key call stays: %v", got)
	}

	ctr = testContainer("c2")
	ctr.Linux.SeccompPolicy = nil
	ctr.Linux.SeccompProfile = &api.SecurityProfile{ProfileType: api.SecurityProfile_UNCONFINED}
	got = keyCallsPolicy(ctr)
	if got.GetDefaultAction() != "SCMP_ACT_ALLOW" || len(got.GetSyscalls()) != 1 || !proto.Equal(got.Syscalls[0], refuse) || len(got.GetArchitectures()) == 0 {
		t.Errorf("an Unconfined container's policy: %v", got)
	}

	for _, prof := range []*api.SecurityProfile{nil, {ProfileType: api.SecurityProfile_RUNTIME_DEFAULT}, {ProfileType: api.SecurityProfile_LOCALHOST, LocalhostRef: "p.json"}} {
		ctr.Linux.SeccompProfile = prof
		if got := keyCallsPolicy(ctr); got != nil {
			t.Errorf("profile %v without a policy shown: replaced with %v", prof, got)
		}
	}

	info := client.TrialInfo{Netns: "/run/trialnet/netns/k8s-x", Cgroup: "/sys/fs/cgroup/trialnet/k8s-x", ProxyURL: "http://127.0.0.1:3128"}
	adj := testPlugin.adjust(testContainer("c3"), info)
	if rules := adj.GetLinux().GetSeccompPolicy().GetSyscalls(); len(rules) == 0 || !slices.Equal(rules[len(rules)-1].Names, ocihook.KeyCalls) {
		t.Errorf("the adjustment's policy %v", adj.GetLinux().GetSeccompPolicy())
	}
}
