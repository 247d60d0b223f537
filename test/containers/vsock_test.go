//go:build linux

package containers

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/ocihook"
)

// vsockOpen is a profile that keeps the key calls from a container and
// lets it make AF_VSOCK sockets: every call allowed but those.
func vsockOpen() map[string]any {
	return map[string]any{"defaultAction": "SCMP_ACT_ALLOW", "architectures": ocihook.NativeArchitectures(runtime.GOARCH),
		"syscalls": []any{map[string]any{"names": ocihook.KeyCalls, "action": "SCMP_ACT_ERRNO", "errnoRet": ocihook.KeyCallsErrno}}}
}

// vsockResults are escapee's vsock attempts in a container's output.
func vsockResults(t *testing.T, out string) map[string]escapeResult {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "{") {
			lines = append(lines, l)
		}
	}
	res := parseEscapee(t, strings.NewReader(strings.Join(lines, "\n")))
	if len(res) != 3 {
		t.Fatalf("escapee -mode vsock printed %d results, want 3:\n%s", len(res), out)
	}
	return res
}

// checkVsockRefused wants every attempt refused (or, the i386 one, not
// possible on this kernel).
func checkVsockRefused(t *testing.T, how string, res map[string]escapeResult) {
	t.Helper()
	for name, r := range res {
		switch {
		case r.Result == "skipped" && name == "socketcall-vsock-i386":
			t.Logf("%s, %s: %s", how, name, r.Reason)
		case r.Result != "blocked":
			t.Errorf("%s, %s: %+v, want refused", how, name, r)
		case !strings.Contains(r.Reason, "address family not supported") && !strings.Contains(r.Reason, "killed"):
			t.Errorf("%s, %s: %+v, want refused by the profile (EAFNOSUPPORT) or the bad-architecture kill", how, name, r)
		default:
			t.Logf("%s, %s: refused: %s", how, name, r.Reason)
		}
	}
}

// A container of a Trial may not make an AF_VSOCK socket, which no
// network namespace holds. Without the BPF LSM layer (6.12-nolsm), the
// hook refuses a container whose seccomp profile lets it make one,
// saying why and what to do, and trialnet oci-runtime rewrites the
// profile so that it cannot (Docker 20.10's default, which lets it, and
// the least one); podman run with the profile oci-hook install wrote is
// refused it by crun. With the layer (6.12), the hook lets the open
// profile in and the layer refuses the socket. The same bundle with no
// hook makes the socket: the attempts are real.
func TestPrivilegedContainerVsock(t *testing.T) {
	requireRuntimes(t, true, "runc", "podman", "crun", "conmon")
	w := newContainerTrial(t, "ctr-vsock")
	st, err := w.agent.Stats(context.Background(), w.info.ID)
	if err != nil {
		t.Fatal(err)
	}
	lsm := st.Layers.BPFLSM
	b, err := os.ReadFile(escapeeBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.rootfs, "bin", "escapee"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	const script = "/bin/escapee -mode vsock"
	open := bundleOpts{netns: w.info.Netns, cgroupsPath: w.cgroup + "/vsock-open", script: script, seccomp: vsockOpen(),
		annotations: map[string]string{"trialnet.io/trial": w.info.ID}, hooks: []string{"createRuntime"}}

	// The control: without the hook, nothing refuses the socket but the
	// BPF LSM layer.
	noHook := open
	noHook.hooks, noHook.cgroupsPath = nil, w.cgroup+"/vsock-nohook"
	out, err := newRunc(w).run("vsock-nohook", noHook)
	if err != nil {
		t.Fatalf("the open profile without the hook: %v\n%s", err, out)
	}
	if r := vsockResults(t, out)["socket-vsock"]; lsm != (r.Result == "blocked") {
		t.Fatalf("without the hook, BPF LSM layer %v: socket-vsock %+v (is vsock_loopback loaded?)", lsm, r)
	}

	// Docker 23's rule, socket let run for any family but 40, compares
	// all 64 bits: socket(0x1_00000028), family 40 to the kernel, passes,
	// and so does i386's socketcall, which Docker's profile lets run.
	docker23 := noHook
	docker23.seccomp, docker23.cgroupsPath = dockerProfile(t, true), w.cgroup+"/vsock-docker23"
	out, err = newRunc(w).run("vsock-docker23", docker23)
	if err != nil {
		t.Fatalf("Docker 23's profile without the hook: %v\n%s", err, out)
	}
	res := vsockResults(t, out)
	t.Logf("Docker 23's profile without the hook: %+v", res)
	if !lsm && (res["socket-vsock"].Result != "blocked" || res["socket-vsock-high-bits"].Result != "escaped" || res["socketcall-vsock-i386"].Result == "blocked") {
		t.Errorf("Docker 23's profile: socket(40) %+v, socket(0x1_00000028) %+v, i386 socketcall %+v; want the first refused, the others made",
			res["socket-vsock"], res["socket-vsock-high-bits"], res["socketcall-vsock-i386"])
	}

	out, err = newRunc(w).run("vsock-open", open)
	if lsm {
		if err != nil {
			t.Fatalf("with the BPF LSM layer, the open profile was refused: %v\n%s", err, out)
		}
		checkVsockRefused(t, "the BPF LSM layer", vsockResults(t, out))
	} else {
		if err == nil || strings.Contains(out, `"socket-vsock"`) {
			t.Errorf("without the BPF LSM layer, the open profile started (%v):\n%s", err, out)
		}
		for _, want := range []string{"its seccomp profile lets it open AF_VSOCK sockets", "SCMP_ARCH_X86_64: socket(AF_VSOCK)", "trialnet oci-runtime (Docker) adds the refusal"} {
			if !strings.Contains(out, want) {
				t.Errorf("the refusal lacks %q:\n%s", want, out)
			}
		}
		t.Logf("refused by the hook:\n%s", out)
	}

	// Through trialnet oci-runtime, the open profile and Docker 20.10's.
	for name, profile := range map[string]map[string]any{"vsock-wrapped": vsockOpen(), "vsock-docker": dockerProfile(t, false)} {
		r := newRunc(w)
		r.wrapped = true
		o := open
		o.seccomp, o.cgroupsPath = profile, w.cgroup+"/"+name
		out, err := r.run(name, o)
		if err != nil {
			t.Fatalf("%s through trialnet oci-runtime: %v\n%s", name, err, out)
		}
		checkVsockRefused(t, name+" through trialnet oci-runtime", vsockResults(t, out))
	}

	// podman (crun) with the profile oci-hook install wrote.
	p := newPodman(w)
	out, err = p.run(w.hooks, p.trialFlags(), script)
	if err != nil {
		t.Fatalf("podman run with %s: %v\n%s", w.seccomp, err, out)
	}
	checkVsockRefused(t, "podman with "+filepath.Base(w.seccomp), vsockResults(t, out))
}

// dockerProfile is Docker 20.10's default profile as it wrote it in a
// container's config.json, or with v23 as Docker 23 changed it: socket
// out of the calls let run, and let run for any family but 40.
func dockerProfile(t *testing.T, v23 bool) map[string]any {
	b, err := os.ReadFile("../../ocihook/testdata/docker-20.10.seccomp.json")
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if v23 {
		rules := p["syscalls"].([]any)
		r0 := rules[0].(map[string]any)
		r0["names"] = slices.DeleteFunc(r0["names"].([]any), func(n any) bool { return n == "socket" })
		p["syscalls"] = append(rules, map[string]any{"names": []any{"socket"}, "action": "SCMP_ACT_ALLOW",
			"args": []any{map[string]any{"index": 0, "value": 40, "valueTwo": 0, "op": "SCMP_CMP_NE"}}})
	}
	return p
}
