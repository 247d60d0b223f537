//go:build linux

package ocihook

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// config is what the hook reads of a bundle's config.json (the OCI
// runtime spec): the rest is the runtime's business.
type config struct {
	Process     *processOf        `json:"process"`
	Root        *rootOf           `json:"root"`
	Mounts      []mountOf         `json:"mounts"`
	Linux       *linuxOf          `json:"linux"`
	Annotations map[string]string `json:"annotations"`

	// podShm, when set, says whether a bind is the container's pod's
	// /dev/shm as its runtime made it, which passes though its source is
	// in a protected directory.
	podShm func(mountOf) bool
	// data says whose runtime data a mount's source is; nil: not
	// checked (a spec with no container id yet).
	data *runtimeData
}

type processOf struct {
	Capabilities *capsOf `json:"capabilities"`
}

type capsOf struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Inheritable []string `json:"inheritable"`
	Permitted   []string `json:"permitted"`
	Ambient     []string `json:"ambient"`
}

type mountOf struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options"`
}

type rootOf struct {
	Path string `json:"path"`
}

type linuxOf struct {
	Namespaces []namespaceOf `json:"namespaces"`
	Seccomp    *seccompOf    `json:"seccomp"`
	Devices    []deviceOf    `json:"devices"`
	Resources  *resourcesOf  `json:"resources"`
	// ReadonlyPaths and MaskedPaths are paths in the container.
	ReadonlyPaths []string `json:"readonlyPaths"`
	MaskedPaths   []string `json:"maskedPaths"`
	CgroupsPath   string   `json:"cgroupsPath"`
}

type deviceOf struct {
	Path  string `json:"path"`
	Type  string `json:"type"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
}

type resourcesOf struct {
	Devices []deviceRuleOf `json:"devices"`
}

type deviceRuleOf struct {
	Allow  bool   `json:"allow"`
	Type   string `json:"type"`
	Major  *int64 `json:"major"` // nil: every major
	Minor  *int64 `json:"minor"` // nil: every minor
	Access string `json:"access"`
}

type namespaceOf struct {
	Type string `json:"type"`
	Path string `json:"path"`
}

func readConfig(bundle string) (*config, error) {
	f, err := os.Open(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read the bundle's config: %w", err)
	}
	defer f.Close()
	b, err := readBounded(f, maxConfig, "the bundle's config.json")
	if err != nil {
		return nil, err
	}
	var c config
	if err := decodeSpec(b, &c); err != nil {
		return nil, fmt.Errorf("the bundle's config.json: %w", err)
	}
	return &c, nil
}

// refusedCaps are the capabilities that let a container in a Trial
// leave it or undo it: in the host's user namespace (or granted to a
// root that the hook does not see mapped) they reach past the Trial's
// network namespace and cgroup. CAP_NET_RAW is not among them: the
// Trial's sock_create hook refuses raw and ICMP sockets, and a packet
// socket sees only the Trial namespace's loopback (Docker grants it by
// default; refusing it would refuse every default container). Built at
// its first use: a package-level map is built by every start of the
// binary, and trialnet's run and exec never read this one.
var refusedCaps = sync.OnceValue(func() map[string]string {
	return map[string]string{
		"CAP_SYS_ADMIN":          "mounts, setns into other namespaces, and most of the rest",
		"CAP_NET_ADMIN":          "reconfigures the Trial's network namespace (addresses, routes, the proxy's loopback)",
		"CAP_SYS_PTRACE":         "traces and reads processes outside the container",
		"CAP_BPF":                "loads eBPF programs and reads maps, trialnet's among them",
		"CAP_PERFMON":            "attaches tracing programs and reads kernel memory through them",
		"CAP_SYS_MODULE":         "loads kernel modules",
		"CAP_SYS_RAWIO":          "raw device and I/O port access",
		"CAP_DAC_READ_SEARCH":    "opens host files by handle (open_by_handle_at), past the container's root",
		"CAP_MAC_ADMIN":          "changes the LSM policy",
		"CAP_MAC_OVERRIDE":       "overrides the LSM policy",
		"CAP_SYS_BOOT":           "kexec and reboot",
		"CAP_CHECKPOINT_RESTORE": "checkpoint/restore powers over other processes",
		"CAP_SYS_TIME":           "sets the host's clock, which no namespace holds (the receipts', logs' and certificates' time)",
		"CAP_SYSLOG":             "reads and clears the host's kernel log, and kernel addresses",
		"CAP_SYS_TTY_CONFIG":     "rebinds the host console's keys (KDSKBSENT: a key the host's root presses types its command) and hangs up terminals",
	}
})

// isCapName says whether n is shaped as a capability's name: CAP_, then
// one or more of A-Z and _. A function, not a regexp: trialnet compiles
// nothing at start (every run, exec and hook would pay for it).
func isCapName(n string) bool {
	rest, ok := strings.CutPrefix(n, "CAP_")
	return ok && rest != "" && strings.Trim(rest, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_") == ""
}

// refusedCapsOf lists the refused capabilities in any of the sets (an
// ambient or inheritable one can become effective), named as the
// runtimes name them; a name that is not a capability is refused too,
// since runtimes differ on whether they ignore it or upper-case it.
func (c *config) refusedCapsOf() []string {
	if c.Process == nil || c.Process.Capabilities == nil {
		return nil
	}
	cp := c.Process.Capabilities
	var out []string
	for _, set := range [][]string{cp.Bounding, cp.Effective, cp.Inheritable, cp.Permitted, cp.Ambient} {
		for _, name := range set {
			n := strings.ToUpper(strings.TrimSpace(name))
			if !strings.HasPrefix(n, "CAP_") {
				n = "CAP_" + n
			}
			bad := ""
			if !isCapName(n) {
				bad = fmt.Sprintf("%q (not a capability name)", name)
			} else if why, ok := refusedCaps()[n]; ok {
				bad = n + ": " + why
			}
			if bad != "" && !slices.Contains(out, bad) {
				out = append(out, bad)
			}
		}
	}
	slices.Sort(out)
	return out
}

// boundingCaps are the capabilities the container may hold, for the
// agent's record.
func (c *config) boundingCaps() []string {
	if c.Process == nil || c.Process.Capabilities == nil {
		return []string{}
	}
	return append([]string{}, c.Process.Capabilities.Bounding...)
}

func (c *config) seccomp() *seccompOf {
	if c.Linux == nil {
		return nil
	}
	return c.Linux.Seccomp
}

// namespaces maps each namespace type the container gets to its path
// ("" for a new one); a type missing is one shared with the runtime.
func (c *config) namespaces() map[string]string {
	out := map[string]string{}
	if c.Linux != nil {
		for _, ns := range c.Linux.Namespaces {
			out[ns.Type] = ns.Path
		}
	}
	return out
}

// hostNamespaces are the namespace types a container in a Trial must
// not share with the host: its network is the Trial's, its PID
// namespace keeps it from the host's processes, its cgroup namespace
// from the cgroups outside the Trial's, its mount namespace from the
// host's file system, its IPC namespace from the host's processes'
// shared memory and queues (as a Trial's own init has one).
var hostNamespaces = []struct{ typ, why string }{
	{"network", "it would use the host's network (host networking), not its Trial's"},
	{"pid", "it would see and signal the host's processes (a host PID namespace)"},
	{"cgroup", "it would see the host's cgroups and could move out of its Trial's (a host cgroup namespace)"},
	{"mount", "it would share the host's mounts"},
	{"ipc", "it would share System V IPC and POSIX message queues with the host's processes (host IPC), a channel out: root in it attaches the host root's shared memory"},
}

// checkConfig refuses a config that would let the container leave its
// Trial: a namespace shared with the host, a refused capability, a
// writable cgroup file system, or a root or bind mount that holds
// trialnet's own state.
// protected are the host paths no container may mount (nor any
// directory above them).
func (c *config) check(bundle string, protected []string) []string {
	var why []string
	ns := c.namespaces()
	for _, h := range hostNamespaces {
		if _, ok := ns[h.typ]; !ok {
			why = append(why, fmt.Sprintf("it has no %s namespace of its own: %s", h.typ, h.why))
		}
	}
	why = append(why, c.blockDevices()...)
	why = append(why, c.deviceNumbers()...)
	classes := hostCharClasses()
	why = append(why, c.hostCharDevices(classes)...)
	why = append(why, c.devicesBound()...)
	if caps := c.refusedCapsOf(); len(caps) > 0 {
		why = append(why, "it would hold capabilities that let it leave its Trial: "+strings.Join(caps, "; "))
	}
	// The root is a host directory as a bind mount's source is: "/" (podman
	// --rootfs /) would show the container the control socket and the
	// receipt key as surely as binding them.
	if c.Root != nil && c.Root.Path != "" {
		if p := holds(bundle, c.Root.Path, protected); p != "" {
			why = append(why, fmt.Sprintf("its root file system %s holds or is inside %s (trialnet's own: its control socket, keys, pins or cgroups)", c.Root.Path, p))
		}
	}
	for _, m := range c.Mounts {
		if c.podShm != nil && c.podShm(m) {
			continue
		}
		why = append(why, m.refusals(bundle, protected)...)
		why = append(why, m.deviceBindRefusals(bundle, classes)...)
		if c.data != nil {
			why = append(why, c.data.refusals(bundle, m)...)
		}
	}
	return why
}

// mountRefusals are check's refusals of the root and the mounts alone,
// against protected.
func (c *config) mountRefusals(bundle string, protected []string) []string {
	var why []string
	if c.Root != nil && c.Root.Path != "" {
		if p := holds(bundle, c.Root.Path, protected); p != "" {
			why = append(why, fmt.Sprintf("its root file system %s holds or is inside %s (trialnet's own: its state, data, keys or pins)", c.Root.Path, p))
		}
	}
	for _, m := range c.Mounts {
		if c.podShm == nil || !c.podShm(m) {
			why = append(why, m.refusals(bundle, protected)...)
		}
	}
	return why
}

// virtualFS are the file system types a container may have mounted
// that show it nothing of the host's disk nor a kernel knob: the
// runtimes' own (bind and overlay are checked for their sources, sysfs
// and cgroups for ro). Any other type is the runtime, as root, mounting
// what the container could not: a disk, tracefs, debugfs.
var virtualFS = []string{"proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "ramfs"}

// refusals says why mount m would let the container leave its Trial.
func (m mountOf) refusals(bundle string, protected []string) []string {
	var why []string
	ro := ReadOnly(m.Options)
	bind := m.isBind()
	if slices.Contains(m.Options, "remount") {
		// runc and crun pass it to mount(2): it changes the mount already
		// on the destination, whatever this one's type and source say.
		why = append(why, fmt.Sprintf("it remounts what is on %s (option remount): a read-only sysfs, cgroup or bind mounted before it would be made writable; drop the option", m.Destination))
	}
	switch {
	case bind:
		if p := holds(bundle, m.Source, protected); p != "" {
			why = append(why, fmt.Sprintf("it binds %s on %s, which holds or is inside %s (trialnet's own: its control socket, keys, pins or cgroups)", m.Source, m.Destination, p))
		} else if !ro && within(resolve(bundle, m.Source), "/sys") {
			// The host's sysfs, bound in part (/sys/kernel), is as
			// writable as a sysfs mount: its uevent helper with it.
			why = append(why, fmt.Sprintf("it binds %s, of the host's sysfs, writable on %s: root in it could set the kernel's uevent helper, run as the host's root (bind it ro)", m.Source, m.Destination))
		}
	case m.Type == "overlay":
		for _, o := range m.Options {
			for _, d := range overlayDirs(o) {
				if p := holds(bundle, d, protected); d != "" && p != "" {
					why = append(why, fmt.Sprintf("its overlay on %s is made of %s, which holds or is inside %s (trialnet's own)", m.Destination, d, p))
				} else if d != "" && !filepath.IsAbs(d) {
					// The kernel resolves it from the runtime's working
					// directory (runc's: the root file system, whose links
					// the image makes), not from the bundle.
					why = append(why, fmt.Sprintf("its overlay on %s names %s by a relative path, which the runtime resolves from its working directory, through the image's links: give its layers as absolute paths", m.Destination, d))
				}
			}
		}
	case !slices.Contains(virtualFS, m.Type):
		why = append(why, fmt.Sprintf("it mounts a file system of type %q (%s) on %s: the runtime would mount, as the host's root, what the container could not (a disk, tracefs); bind a host directory instead", m.Type, m.Source, m.Destination))
	case (m.Type == "cgroup" || m.Type == "cgroup2") && !ro:
		why = append(why, fmt.Sprintf("it mounts a writable cgroup file system on %s (mount it ro)", m.Destination))
	case m.Type == "sysfs" && !ro:
		// /sys/kernel/uevent_helper is a program the kernel runs as
		// the host's root; root writes it with no capability.
		why = append(why, fmt.Sprintf("it mounts sysfs writable on %s: root in it could set the kernel's uevent helper, run as the host's root (mount it ro)", m.Destination))
	}
	return why
}

func (m mountOf) isBind() bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// deviceBindRefusals refuses a bind of the host's devices, as a device
// entry of the same numbers is refused: the device cgroup judges a bound
// node as a made one (runc 1.1.5 here, no user namespace: a bind of
// /dev/pts, with runc's own default rules, wrote to a host terminal). A
// directory of the host's devices (/dev and under it, or a devpts
// wherever mounted) is refused whole: its terminals are the host's, and
// the rule c 136:* that every runtime allows opens them.
func (m mountOf) deviceBindRefusals(bundle string, classes []hostChar) []string {
	if !m.isBind() {
		return nil
	}
	src := resolve(bundle, m.Source)
	var st unix.Stat_t
	if unix.Stat(src, &st) != nil {
		return nil // nothing to bind: the runtime fails
	}
	maj, min := int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	var why []string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		why = append(why, fmt.Sprintf("it binds the host's block device %s (%d:%d) on %s: it could read the host's disk, and trialnet's state on it", m.Source, maj, min, m.Destination))
	case unix.S_IFCHR:
		if maj >= 136 && maj <= 143 {
			why = append(why, fmt.Sprintf("it binds %s (%d:%d), a host terminal, on %s: it could read and type into it; leave it out", m.Source, maj, min, m.Destination))
		}
		for _, h := range classes {
			if h.matches(maj, min) {
				why = append(why, fmt.Sprintf("it binds %s (%d:%d) on %s, %s (%s): %s; leave it out", m.Source, maj, min, m.Destination, h.does, h.name, h.reach))
			}
		}
	case unix.S_IFDIR:
		var fs unix.Statfs_t
		if within(src, "/dev") || unix.Statfs(src, &fs) == nil && fs.Type == unix.DEVPTS_SUPER_MAGIC {
			why = append(why, fmt.Sprintf("it binds the host's device directory %s on %s: the host's terminals are in it (or under it), opened by the rule c 136:* that every runtime allows, with the host's console and shared memory; give it the devices it needs as devices (--device), not their directory", m.Source, m.Destination))
		}
	}
	return why
}

// overlayDirs are the directories an overlay mount option names, as the
// kernel reads them: lowerdir's layers split at each colon that no
// backslash escapes ("::" before data-only layers), a backslash taking
// the character after it as it is, so that /tmp/l\:/x is one path
// through /tmp/l:; upperdir and workdir unescaped the same way; the
// one path of lowerdir+ and datadir+ (Linux 6.8 up, mount(2)'s data
// among them) as written. Any other option names none.
func overlayDirs(o string) []string {
	key, val, _ := strings.Cut(o, "=")
	switch key {
	case "lowerdir+", "datadir+":
		return []string{val}
	case "upperdir", "workdir", "lowerdir":
	default:
		return nil
	}
	var dirs []string
	var d strings.Builder
	for i := 0; i < len(val); i++ {
		switch c := val[i]; {
		case c == '\\': // a last one is dropped, as the kernel drops it
			if i++; i < len(val) {
				d.WriteByte(val[i])
			}
		case c == ':' && key == "lowerdir":
			dirs = append(dirs, d.String())
			d.Reset()
		default:
			d.WriteByte(c)
		}
	}
	return append(dirs, d.String())
}

// ReadOnly says whether a mount with these options is read-only as runc
// and crun read them: in order, "rw" clearing what an "ro" before it set,
// so that ["ro", "rw"] is writable; and the recursive "rro" or "rrw"
// (the last of them), set on the mount after it is made, over both.
func ReadOnly(options []string) bool {
	ro, rec := false, ""
	for _, o := range options {
		switch o {
		case "ro":
			ro = true
		case "rw":
			ro = false
		case "rro", "rrw":
			rec = o
		}
	}
	if rec != "" {
		return rec == "rro"
	}
	return ro
}

// procKnobs are the parts of proc whose files root writes with no
// capability, each the host's, not a namespace's: what it is in every
// runtime's default linux.readonlyPaths for.
var procKnobs = []struct{ name, why string }{
	{"sys", "root in it could have the kernel run a program as the host's root (kernel.core_pattern)"},
	{"sysrq-trigger", "root in it could reboot or crash the host"},
	{"irq", "root in it could steer the host's interrupts (smp_affinity)"},
	{"bus", "root in it could write the host's PCI devices' configuration space (/proc/bus/pci)"},
	{"fs", "root in it could set the host's file systems' knobs"},
}

// procKnobRefusals refuses a proc mount whose kernel knobs are writable: root
// needs no capability to set kernel.core_pattern ("|/path": a program
// the kernel runs as the host's root at the next core dump), to write
// /proc/sysrq-trigger, an interrupt's affinity or a PCI device's
// configuration. The runtime makes linux.readonlyPaths and maskedPaths
// read-only or hidden; they name paths, so a proc mounted elsewhere
// than /proc is not covered by "/proc/sys".
func (c *config) procKnobRefusals() []string {
	var why []string
	var covered []string
	if c.Linux != nil {
		covered = append(slices.Clone(c.Linux.ReadonlyPaths), c.Linux.MaskedPaths...)
	}
	for _, m := range c.Mounts {
		if m.Type != "proc" || ReadOnly(m.Options) {
			continue
		}
		for _, knob := range procKnobs {
			p := filepath.Join("/", m.Destination, knob.name)
			if !slices.ContainsFunc(covered, func(dir string) bool { return within(p, filepath.Join("/", dir)) }) {
				why = append(why, fmt.Sprintf("%s is writable (in neither linux.readonlyPaths nor maskedPaths): %s; keep the runtime's default paths (no systempaths=unconfined)", p, knob.why))
			}
		}
	}
	return why
}

// blockDevices refuses a host block device given to the container, and a
// device cgroup rule that would let it read or write one (of type b, or
// a: all; Docker's default rule "b *:* m" lets it make nodes only): a
// container reads the host's disk through it, trialnet's receipt key and
// the agent's state with it, whatever its mounts. A rule opening every
// character device is refused too: it opens each of hostChars.
func (c *config) blockDevices() []string {
	var why []string
	if c.Linux == nil {
		return nil
	}
	for _, d := range c.Linux.Devices {
		if d.Type == "b" {
			why = append(why, fmt.Sprintf("it is given the block device %s (%d:%d): it could read the host's disk, and trialnet's state on it", d.Path, d.Major, d.Minor))
		}
	}
	if c.Linux.Resources == nil {
		return why
	}
	for _, r := range c.Linux.Resources.Devices {
		switch {
		case !r.opens():
		case r.Type == "" || r.Type == "a" || r.Type == "b":
			why = append(why, fmt.Sprintf("its device cgroup lets it open block devices (a rule of type %q, access %q): with a node of the host's disk it could read it", r.Type, r.Access))
		case r.Major == nil || *r.Major < 0: // runc and crun: -1 is any major
			why = append(why, fmt.Sprintf("its device cgroup lets it open every character device (a rule of type %q, access %q): with a node of a SCSI or NVMe generic device it could read the host's disk, with the console's the host's terminal; allow the majors it needs", r.Type, r.Access))
		}
	}
	return why
}

// The widest device numbers the kernel has: a major of 12 bits, a minor
// of 20.
const maxMajor, maxMinor = 1<<12 - 1, 1<<20 - 1

// deviceNumbers refuses a device entry, or a rule that allows, whose
// numbers no device has: the runtime cuts them before the kernel sees
// them (runc's cgroup v2 filter compares int32(major), so a rule
// c 4294967301:1 opens the console, 5:1; mknod keeps a major's low 12
// bits, so an entry 4101:1 is a node of 5:1), while the checks of
// hostChars compare them whole and see no device of the host's.
func (c *config) deviceNumbers() []string {
	if c.Linux == nil {
		return nil
	}
	var why []string
	past := func(maj, min int64) bool { return maj > maxMajor || min > maxMinor }
	for _, d := range c.Linux.Devices {
		if past(d.Major, d.Minor) || d.Major < 0 || d.Minor < 0 {
			why = append(why, fmt.Sprintf("its device %s (%d:%d) has numbers no device has (majors 0-%d, minors 0-%d): the runtime would cut them to another device's; give the device's own numbers", d.Path, d.Major, d.Minor, maxMajor, maxMinor))
		}
	}
	if c.Linux.Resources == nil {
		return why
	}
	for _, r := range c.Linux.Resources.Devices {
		if r.Allow && past(deref(r.Major), deref(r.Minor)) {
			why = append(why, fmt.Sprintf("its device cgroup rule %s %d:%d has numbers no device has (majors 0-%d, minors 0-%d): the runtime would cut them to another device's; allow the devices it needs by their own numbers", r.Type, deref(r.Major), deref(r.Minor), maxMajor, maxMinor))
		}
	}
	return why
}

// opens: the rule allows reading or writing a device, not only making
// its node ("": rwm).
func (r deviceRuleOf) opens() bool {
	return r.Allow && (r.Access == "" || strings.ContainsAny(r.Access, "rw"))
}

// hostChar is a class of the host's character devices that reach past
// the container: minor -1 is every minor of the major.
type hostChar struct {
	major, minor int64
	name, does   string
	reach        string
}

// matches: device maj:min (-1: any, a rule's) may be one of class h.
func (h hostChar) matches(maj, min int64) bool {
	return maj == h.major && (h.minor < 0 || min < 0 || min == h.minor)
}

const (
	toDisk     = "passes commands through to a disk"
	diskWhy    = "it could read the host's disk, and trialnet's state on it"
	toLink     = "sends and takes frames on a host interface's link"
	linkWhy    = "it would reach that network, not its Trial's"
	consoleWhy = "it could read the keys typed there and show the host's console a login prompt of its own"
)

// hostChars are the character devices a container in a Trial is neither
// given nor let open by a rule, by fixed numbers; reachingNames adds
// those whose major is given out at boot. A node of one reaches the
// host whoever made it: root with CAP_MKNOD, or the image (runc 1.1.5
// here: a node 5:1 in the root file system, no CAP_MKNOD, and a rule
// "c 5:1 rwm" wrote to the host's console, ttyS0). Each is the host's,
// not a namespace's:
//   - consoles and terminals: a virtual console or serial port (4), the
//     console (5:1; the container's own terminal is a pty its runtime
//     binds on /dev/console, which 136:* opens), a console's screen
//     (vcs, 7), input devices (13), uinput and uhid (a keyboard of its
//     own), USB serial ports and modems (166, 188);
//   - another network or the host's hardware: raw USB (189, usbfs: a USB
//     network adapter or disk driven directly), VFIO (a PCI device, a
//     NIC among them, and DMA), vhost-vsock (a VM's end of AF_VSOCK,
//     which no network namespace holds: the host's vsock services);
//   - the host's life: the hardware watchdog, which reboots the host
//     once opened and left.
//
// Not among them: /dev/kvm (a guest's network is what its VMM, in the
// Trial, gives it), vhost-net (it moves frames of a tap the container
// holds: one in the Trial's namespace), tun (10:200: a device in the
// Trial's namespace), ptys (a pty node made outside a devpts opens
// nothing).
var hostChars = []hostChar{
	{4, -1, "tty", "a virtual console or serial port of the host's", "it could take it as its terminal, read the keys typed there and show the host's console a login prompt of its own"},
	{5, 1, "console", "the host's console (/dev/console)", consoleWhy + "; its own terminal is a pty, bound there by its runtime, which the rule c 136:* opens"},
	{7, -1, "vcs", "a screen of the host's consoles", "it could read what is shown there, and write it"},
	{13, -1, "input", "the host's input devices", "it could read the keys typed there, or type its own"},
	{10, 223, "uinput", "a keyboard of its own", "it could type into the host's console"},
	{10, 239, "uhid", "a keyboard of its own", "it could type into the host's console"},
	{10, 130, "watchdog", "the host's hardware watchdog", "once opened and left, it reboots the host"},
	{10, 196, "vfio", "VFIO's container device", "with a group's it drives a host PCI device: a NIC's network, not its Trial's, and DMA to the host's memory"},
	{10, 241, "vhost-vsock", "a VM's end of vsock", "it could talk to the host's vsock services, which no network namespace holds"},
	{21, -1, "sg", "a device that " + toDisk, diskWhy},
	{166, -1, "ttyACM", "a USB modem or serial port of the host's", "it could dial another network or reach the host's console"},
	{188, -1, "ttyUSB", "a USB serial port of the host's", "it could dial another network or reach the host's console"},
	{189, -1, "usb_device", "a raw USB device of the host's (/dev/bus/usb)", "it could drive any USB device, a network adapter's link or a disk among them"},
}

// reachingNames are the drivers given a major at boot, as /proc/devices
// names them: the disks' pass-through devices; macvtap's and ipvtap's
// (/dev/tapN), which send and take frames on a host interface's link,
// whatever network namespace the opener is in (runc 1.1.5 here: a
// container with only lo wrote frames that a macvtap in another
// namespace put on its link); VFIO's groups and device files; the
// watchdog's numbered devices; usbmon, every USB bus's traffic; hidraw.
// Built at its first use, as refusedCaps.
var reachingNames = sync.OnceValue(func() map[string]hostChar {
	return map[string]hostChar{
		"sg": {name: "sg", does: "a device that " + toDisk, reach: diskWhy}, "bsg": {name: "bsg", does: "a device that " + toDisk, reach: diskWhy},
		"nvme-generic": {name: "nvme-generic", does: "a device that " + toDisk, reach: diskWhy},
		"dax":          {name: "dax", does: "a device that " + toDisk, reach: diskWhy}, "mtd": {name: "mtd", does: "a device that " + toDisk, reach: diskWhy},
		"ubi": {name: "ubi", does: "a device that " + toDisk, reach: diskWhy},
		// An NVMe controller's (/dev/nvme0): NVME_IOCTL_IO_CMD there runs on
		// its first namespace, and a READ wants no capability (Linux 6.2 up).
		"nvme":     {name: "nvme", does: "a device that " + toDisk, reach: diskWhy},
		"macvtap":  {name: "macvtap", does: "a device that " + toLink, reach: linkWhy},
		"ipvtap":   {name: "ipvtap", does: "a device that " + toLink, reach: linkWhy},
		"vfio":     {name: "vfio", does: "a VFIO group of the host's", reach: "it drives a host PCI device: a NIC's network, not its Trial's, and DMA to the host's memory"},
		"vfio-dev": {name: "vfio-dev", does: "a VFIO device of the host's", reach: "it drives a host PCI device: a NIC's network, not its Trial's, and DMA to the host's memory"},
		"watchdog": {name: "watchdog", does: "the host's hardware watchdog", reach: "once opened and left, it reboots the host"},
		// A keyboard's raw reports are its keys, as the input devices' are.
		"hidraw": {name: "hidraw", does: "a raw HID device of the host's", reach: "it could read the keys typed on the host's keyboards, or send reports to its devices"},
		"usbmon": {name: "usbmon", does: "a device that captures every USB bus's traffic", reach: "it could read the keys typed on the host's keyboards, and a USB network adapter's frames"},
	}
})

// procDevices lists the kernel's device majors (a test's copy in tests).
var procDevices = "/proc/devices"

// hostCharClasses are hostChars and the majors /proc/devices gives the
// drivers of reachingNames.
func hostCharClasses() []hostChar {
	out := slices.Clone(hostChars)
	b, err := os.ReadFile(procDevices)
	if err != nil {
		return out
	}
	chars, _, _ := strings.Cut(string(b), "Block devices:")
	for line := range strings.Lines(chars) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if h, ok := reachingNames()[f[1]]; ok {
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err == nil && !slices.ContainsFunc(out, func(o hostChar) bool { return o.major == n && o.minor < 0 }) {
				h.major, h.minor = n, -1
				out = append(out, h)
			}
		}
	}
	return out
}

// hostCharDevices refuses the host's character devices of classes
// (hostCharClasses), given (linux.devices: the runtime makes the node) or
// opened by a device cgroup rule (a node from the image, or made with
// CAP_MKNOD, then opens); a rule of type a, b or every major is
// blockDevices' to refuse.
func (c *config) hostCharDevices(classes []hostChar) []string {
	if c.Linux == nil {
		return nil
	}
	var why []string
	for _, d := range c.Linux.Devices {
		if d.Type != "c" && d.Type != "u" {
			continue
		}
		for _, h := range classes {
			if h.matches(d.Major, d.Minor) {
				why = append(why, fmt.Sprintf("it is given the device %s (%d:%d), %s (%s): %s; leave it out", d.Path, d.Major, d.Minor, h.does, h.name, h.reach))
			}
		}
	}
	if c.Linux.Resources == nil {
		return why
	}
	for _, r := range c.Linux.Resources.Devices {
		if !r.opens() || r.Type != "c" || deref(r.Major) < 0 {
			continue
		}
		minor := "*"
		if deref(r.Minor) >= 0 {
			minor = strconv.FormatInt(*r.Minor, 10)
		}
		for _, h := range classes {
			if h.matches(*r.Major, deref(r.Minor)) {
				why = append(why, fmt.Sprintf("its device cgroup lets it open character devices %d:%s, among them %s (%s): %s; allow only the devices it needs", *r.Major, minor, h.does, h.name, h.reach))
			}
		}
	}
	return why
}

// devicesBound refuses, in a container with a user namespace, a device
// that is not, on the host, the node its entry names: there runc makes
// no node but binds the host's file at the entry's path (runc 1.1.5
// here: a path to a host file showed its contents; /dev/pts/0, named as
// c 136:0, was the host's terminal, written from the container). So a
// file, a socket, a FIFO, another device or a host terminal would come
// in under a device's name, which the mount rules never see. Without a
// user namespace the runtime makes a node of the entry's numbers, which
// hostCharDevices judges; a host path bound in by a mount is
// deviceBindRefusals'.
func (c *config) devicesBound() []string {
	if _, userns := c.namespaces()["user"]; !userns || c.Linux == nil {
		return nil
	}
	kinds := map[string]uint32{"c": unix.S_IFCHR, "u": unix.S_IFCHR, "b": unix.S_IFBLK}
	var why []string
	for _, d := range c.Linux.Devices {
		var st unix.Stat_t
		if unix.Stat(d.Path, &st) != nil {
			continue // nothing there: the runtime has nothing to bind
		}
		kind, ok := kinds[d.Type]
		switch {
		case !ok || st.Mode&unix.S_IFMT != kind || int64(unix.Major(st.Rdev)) != d.Major || int64(unix.Minor(st.Rdev)) != d.Minor:
			why = append(why, fmt.Sprintf("its device %s (%s %d:%d) is something else on the host, which the runtime would bind in its place (a user namespace makes no nodes): name the device by its host path", d.Path, d.Type, d.Major, d.Minor))
		case d.Major >= 136 && d.Major <= 143:
			why = append(why, fmt.Sprintf("its device %s (%d:%d) is a host terminal, which the runtime would bind in (a user namespace makes no nodes): it could read and type into it", d.Path, d.Major, d.Minor))
		}
	}
	return why
}

func deref(p *int64) int64 {
	if p == nil {
		return -1
	}
	return *p
}

// rootfs is the host directory of the container's root file system,
// resolved as the runtime resolves it, or "" when the config names none.
func (c *config) rootfs(bundle string) string {
	if c.Root == nil || c.Root.Path == "" {
		return ""
	}
	return resolve(bundle, c.Root.Path)
}

// holds is the protected path that the host directory src (relative to
// the bundle if not absolute) holds or is inside, or "".
func holds(bundle, src string, protected []string) string {
	src = resolve(bundle, src)
	for _, p := range protected {
		if within(p, src) || within(src, p) {
			return p
		}
	}
	return ""
}

// within: path is dir or under it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}
