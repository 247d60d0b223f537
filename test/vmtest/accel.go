//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// accel is how QEMU runs the guests: KVM where it works, TCG otherwise.
type accel struct{ name, cpu string }

// arg is QEMU's -accel value. TCG runs each guest's vCPUs on one host
// thread: with a thread per vCPU (QEMU 7.2's default), code one vCPU
// patches while another runs it can trap, and did: the 6.12 guest's
// kernel died of an int3 Oops in __alloc_pages as a static key flipped
// ("Fatal exception in interrupt"), and the JVM's JIT-compiled code took
// SIGSEGVs. Two guests already share this machine's two cores, so it
// costs little.
func (a accel) arg() string {
	if a.name == "tcg" {
		return "tcg,thread=single"
	}
	return a.name
}

// probeTimeout bounds the KVM probe: a kernel with no root panics within
// a second or two under KVM.
const probeTimeout = 30 * time.Second

// chooseAccel takes KVM only when /dev/kvm opens and a guest really runs
// under it: a nested host (a VM guest itself) can offer /dev/kvm and
// still make QEMU abort at the first vCPU reset ("failed to set MSR").
// The probe boots vmlinuz with no root, which panics and powers off.
// TRIALNET_VM_ACCEL=tcg or kvm decides instead.
func chooseAccel(ctx context.Context, vmlinuz string) (accel, string) {
	tcg := accel{"tcg", "max"}
	switch v := os.Getenv("TRIALNET_VM_ACCEL"); v {
	case "tcg":
		return tcg, "TCG (TRIALNET_VM_ACCEL=tcg)"
	case "kvm":
		return accel{"kvm", "host"}, "KVM (TRIALNET_VM_ACCEL=kvm)"
	case "":
	default:
		return tcg, fmt.Sprintf("TCG (TRIALNET_VM_ACCEL=%q is neither kvm nor tcg)", v)
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return tcg, fmt.Sprintf("TCG (/dev/kvm: %v)", err)
	}
	_ = f.Close()
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(pctx, "qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-m", "256",
		"-nodefaults", "-display", "none", "-no-reboot", "-serial", "null",
		"-kernel", vmlinuz, "-append", "console=ttyS0 panic=-1 root=/dev/nonexistent")
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		return tcg, fmt.Sprintf("TCG (/dev/kvm opens, but a guest did not run under it: %v: %s)", err, msg[strings.LastIndexByte(msg, '\n')+1:])
	}
	return accel{"kvm", "host"}, "KVM"
}
