//go:build linux

package containers

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
