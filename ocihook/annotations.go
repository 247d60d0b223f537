//go:build linux

package ocihook

import (
	"fmt"
	"slices"
	"strings"
)

// runtimeAnnotations are annotations the runtimes read as orders: with
// one, crun 1.8 or runc 1.1 runs the container otherwise than the spec
// the hook judged. A run.oci key (crun's family) is refused unless
// harmlessRunOCI holds it: one this trialnet does not know may be a later
// crun's, acting on what the hook judges. Each reason says why.
var runtimeAnnotations = map[string]string{
	"run.oci.handler":                 "crun runs the container's process with another handler (krun: in a microVM with a kernel of its own; wasm: in a WebAssembly runtime), so that the processes, capabilities and seccomp filter the hook judged are not what runs the workload",
	"module.wasm.image/variant":       "crun runs the container's process in a WebAssembly runtime, as with run.oci.handler, not the process the hook judged",
	"run.oci.hooks.stdout":            "crun, as the host's root, creates or appends to this host file with the hooks' output: a host path outside the container's mounts",
	"run.oci.hooks.stderr":            "crun, as the host's root, creates or appends to this host file with the hooks' output: a host path outside the container's mounts",
	"run.oci.keep_original_groups":    "crun leaves the container's process the supplementary groups of the runtime (root's, or the rootless user's) in place of process.user.additionalGids: file access the spec does not give",
	"run.oci.pidfd_receiver":          "crun, as the host's root, connects to this host unix socket and hands it a pidfd of the container's process",
	"run.oci.systemd.force_cgroup_v1": "crun mounts a cgroup v1 hierarchy (name=systemd, the host's) in place of the spec's mount at this path: a mount the hook did not judge",
	"run.oci.systemd.subgroup":        "crun moves the container's process into a cgroup below its systemd scope, not the one its spec names",
	"run.oci.delegate-cgroup":         "crun runs the container's process in a further cgroup delegated to it, not the one its spec names",
	"run.oci.mount_context_type":      "crun writes this value into the mount data of each labelled mount (the SELinux context option's name, unchecked): mount options the hook did not read",
	"org.criu.config":                 "runc hands this host file to CRIU at checkpoint and restore, whose options (external mounts, established connections) restore the container otherwise than its spec",
	systemdProperty:                   "crun's and runc's systemd cgroup managers set it as a property of the container's scope unit (BPFProgram= attaches a program to its cgroup, DeviceAllow=, Delegate=): the cgroup the hook judged, changed by systemd",
}

// harmlessRunOCI are crun's annotations that change nothing the hook
// judges: run.oci.seccomp_fail_unknown_syscall makes crun refuse a
// profile naming a call it does not know (a stricter filter, never a
// wider one); run.oci.timens_offset sets the clocks of the container's
// own time namespace, and crun reads it only when the spec gives one.
var harmlessRunOCI = []string{"run.oci.seccomp_fail_unknown_syscall", "run.oci.timens_offset"}

// systemdProperty is the prefix of the annotations crun's and runc's
// systemd cgroup managers pass to systemd, the rest of the key naming the
// unit property.
const systemdProperty = "org.systemd.property."

// runtimeAnnotationRefusals says, for each of the config's annotations
// that makes a runtime run the container otherwise than its spec, which
// and why. Keys are compared without case (crun and runc compare with
// case, so this refuses more than they read). The run.oci.seccomp family
// is left to seccompAnnotations, which says what to do about a filter.
func (c *config) runtimeAnnotationRefusals() []string {
	var out []string
	for k, v := range c.Annotations {
		lk := strings.ToLower(k)
		why, known := runtimeAnnotations[lk]
		switch {
		case lk == "run.oci.systemd.subgroup" && v == "":
			// No subgroup: the process stays in the scope the spec
			// names (CRI-O's default_annotations set it so).
			continue
		case known:
		case strings.HasPrefix(lk, systemdProperty):
			why = runtimeAnnotations[systemdProperty]
		case strings.HasPrefix(lk, "run.oci.seccomp"), slices.Contains(harmlessRunOCI, lk):
			continue
		case strings.HasPrefix(lk, "run.oci."):
			why = "crun reads the run.oci annotations as orders, and this trialnet does not know this one (a later crun's?): what it changes of the spec the hook judged is unknown"
		default:
			continue
		}
		out = append(out, fmt.Sprintf("its annotation %s: %s; the hook judges the spec, not what the runtime makes of it: remove the annotation (the ones let through: %s, and an empty run.oci.systemd.subgroup)", k, why, strings.Join(harmlessRunOCI, ", ")))
	}
	slices.Sort(out)
	return out
}
