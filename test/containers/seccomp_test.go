//go:build linux

package containers

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/ocihook"
)

// allowAll is a compiled seccomp filter of one instruction, BPF_RET|BPF_K
// SECCOMP_RET_ALLOW, in base64, as crun's run.oci.seccomp_bpf_data takes
// it.
const allowAll = "BgAAAAAA/38="

// crun loads the filter of its run.oci.seccomp_bpf_data annotation in
// place of linux.seccomp: a container run with the profile oci-hook
// install wrote and that annotation reaches the kernel's keyrings (and,
// without the BPF LSM layer, AF_VSOCK), though the profile the hook
// reads refuses them. The hook refuses such a container; without the
// hook it starts and its request_key reaches the key service, so the
// annotation is what the hook refuses.
func TestPrivilegedContainerCrunFilterAnnotation(t *testing.T) {
	requireRuntimes(t, true, "podman", "crun", "conmon")
	w := newContainerTrial(t, "ctr-crun-bpf")
	b, err := os.ReadFile(escapeeBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.rootfs, "bin", "escapee"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	p := newPodman(w)
	const script = "/bin/escapee -mode keys"
	annotated := append(p.trialFlags(), "--annotation", "run.oci.seccomp_bpf_data="+allowAll)

	out, err := p.run(w.noHooks, annotated, script)
	if err != nil {
		t.Fatalf("the annotated container without the hook: %v\n%s", err, out)
	}
	if r := parseEscapee(t, strings.NewReader(out))["request-key-upcall"]; r.Result != "escaped" {
		t.Fatalf("without the hook, the annotated container's request_key: %+v, want it to reach the key service (does crun take the annotation?)", r)
	}

	out, err = p.run(w.hooks, p.trialFlags(), script)
	if err != nil {
		t.Fatalf("with the hook, without the annotation: %v\n%s", err, out)
	}
	if r := parseEscapee(t, strings.NewReader(out))["request-key-upcall"]; r.Result != "blocked" {
		t.Errorf("with the hook, without the annotation, request_key: %+v, want refused by the profile", r)
	}

	out, err = p.run(w.hooks, annotated, script)
	if err == nil || strings.Contains(out, "request-key-upcall") {
		t.Fatalf("with the hook, the annotated container started (%v):\n%s", err, out)
	}
	// crun does not pass the hook's standard error on to podman: the
	// reason is checked in ocihook's tests.
	if !strings.Contains(out, "error executing hook") {
		t.Errorf("the refusal is not the hook's:\n%s", out)
	}
}

// miscompiled is a profile that refuses AF_VSOCK as the OCI spec reads
// it (socket(40, …) meets "arg0 > 10") and that libseccomp 2.5.4
// compiles into a filter that lets socket(40, SOCK_STREAM, 0) run: the
// other rule for socket compares argument 1, and the "> 10" test, where
// the chains meet, reads argument 1's value.
func miscompiled() map[string]any {
	return map[string]any{"defaultAction": "SCMP_ACT_ALLOW", "architectures": []string{"SCMP_ARCH_X86_64"}, "syscalls": []any{
		map[string]any{"names": []string{"socket"}, "action": "SCMP_ACT_ERRNO", "errnoRet": 13, "args": []any{map[string]any{"index": 0, "value": 10, "op": "SCMP_CMP_GT"}}},
		map[string]any{"names": []string{"socket"}, "action": "SCMP_ACT_ERRNO", "errnoRet": ocihook.VsockErrno, "args": []any{
			map[string]any{"index": 0, "value": 40, "op": "SCMP_CMP_LE"}, map[string]any{"index": 1, "value": 40, "op": "SCMP_CMP_GE"}}},
		map[string]any{"names": ocihook.UringCalls, "action": "SCMP_ACT_ERRNO", "errnoRet": ocihook.UringErrno},
		map[string]any{"names": ocihook.KeyCalls, "action": "SCMP_ACT_ERRNO", "errnoRet": ocihook.KeyCallsErrno}}}
}

// Without the BPF LSM layer, runc (Debian 12's libseccomp 2.5.4) runs a
// container with miscompiled's profile whose socket(AF_VSOCK) is made;
// the hook refuses the profile, saying why.
func TestPrivilegedContainerMiscompiledVsockProfile(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the profile is x86-64's")
	}
	requireRuntimes(t, true, "runc")
	w := newContainerTrial(t, "ctr-miscompiled")
	st, err := w.agent.Stats(context.Background(), w.info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.Layers.BPFLSM {
		t.Skip("the BPF LSM layer refuses AF_VSOCK here, and the hook does not judge the profile for it")
	}
	b, err := os.ReadFile(escapeeBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.rootfs, "bin", "escapee"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	o := bundleOpts{netns: w.info.Netns, cgroupsPath: w.cgroup + "/miscompiled-nohook", script: "/bin/escapee -mode vsock", seccomp: miscompiled(),
		annotations: map[string]string{"trialnet.io/trial": w.info.ID}}
	out, err := newRunc(w).run("miscompiled-nohook", o)
	if err != nil {
		t.Fatalf("without the hook: %v\n%s", err, out)
	}
	if r := vsockResults(t, out)["socket-vsock"]; r.Result != "escaped" {
		t.Fatalf("without the hook, socket-vsock %+v: want it made (is vsock_loopback loaded? does libseccomp compile the profile right?)", r)
	}
	o.hooks, o.cgroupsPath = []string{"createRuntime"}, w.cgroup+"/miscompiled"
	out, err = newRunc(w).run("miscompiled", o)
	if err == nil || strings.Contains(out, `"socket-vsock"`) {
		t.Fatalf("with the hook the container started (%v):\n%s", err, out)
	}
	if want := "a rule refuses it, and rule 1 compares argument 1"; !strings.Contains(out, want) {
		t.Errorf("the refusal lacks %q:\n%s", want, out)
	}
}
