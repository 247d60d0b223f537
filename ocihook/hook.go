//go:build linux

// Package ocihook is trialnet's OCI createRuntime hook (trialnet
// oci-hook): for a container annotated trialnet.io/trial=ID it checks,
// before the container's first instruction, that the runtime placed it
// in that Trial (its cgroup the Trial's or under it, its network
// namespace the Trial's) and that its bundle gives it nothing to leave
// by (a host namespace, a capability that reaches past the Trial, a
// bind mount of trialnet's own state, a seccomp profile that lets it use
// the kernel's keyrings); then it tells the agent, whose
// layers report the container. Anything else, a check it cannot make
// included, makes the runtime refuse the container. A container without
// the annotation passes without a word to the agent, so that the
// agent's own container, started through the same hook, never waits on
// the agent (cilium/tetragon#2402).
//
// It imports only package client of trialnet's: a hook links no eBPF.
package ocihook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/trialnet/trialnet/internal/agentwire"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"golang.org/x/sys/unix"
)

// Agent is what the hook asks of the agent (agentwire.Direct serves it).
type Agent interface {
	Get(ctx context.Context, id string) (agentwire.TrialInfo, error)
	AddContainer(ctx context.Context, id string, c agentwire.Container) (agentwire.TrialInfo, error)
	ContainerTrial(ctx context.Context, req agentwire.ContainerTrial) (agentwire.TrialInfo, error)
	EndContainer(ctx context.Context, id string) (agentwire.ContainerEnd, error)
	Destroy(ctx context.Context, id string) error
}

// Hook checks one container. The zero values of Proc, CgroupMount and
// Protected are the host's.
type Hook struct {
	// Agent returns the agent to ask; called only for a container that
	// claims a Trial.
	Agent func() Agent
	// Proc is where /proc is ("": /proc).
	Proc string
	// CgroupMount is the cgroup2 mount ("": found in mountinfo).
	CgroupMount string
	// Socket is the agent's control socket ("": agentwire.DefaultSocket),
	// whose directory is protected.
	Socket string
	// Protected are host paths no container in a Trial may bind, nor a
	// directory above them (nil: DefaultProtected).
	Protected []string
	// ContainerdShmDir is where containerd makes its pods' /dev/shm
	// ("": ContainerdShmDir).
	ContainerdShmDir string
	// StorageRoots are containers/storage's roots, whose per-container
	// runtime data a container may mount only of its own (nil:
	// DefaultStorageRoots).
	StorageRoots []string

	// TrialParent (a directory of the cgroup2 tree, as the agent's
	// paths.cgroup_parent) and NetnsDir are where the agent keeps its
	// Trials' cgroups and network namespaces ("": its defaults), where a
	// container that claims no Trial is looked for (Places).
	TrialParent, NetnsDir string

	// data is the container's runtime data rule, once its id is known.
	data *runtimeData
}

func (h *Hook) storageRoots() []string {
	if h.StorageRoots == nil {
		return DefaultStorageRoots
	}
	return h.StorageRoots
}

// DefaultProtected are trialnet's own paths: the control socket's
// directory (a root in the container that reached it could change its
// own Trial's allowlist), the data directory with the receipt key, the
// bpffs pins and the cgroup2 tree.
func DefaultProtected(socket, cgroupMount string) []string {
	p := []string{filepath.Dir(socket), "/var/lib/trialnet", "/sys/fs/bpf", "/proc"}
	// A container runtime's API socket starts containers as the host's
	// root: a privileged one on the host's network is out of the Trial.
	for _, s := range append(slices.Clone(runtimeSockets), runtimeState...) {
		p = append(p, s, "/var"+s)
	}
	p = append(p, stateSockets...)
	if cgroupMount != "" {
		p = append(p, cgroupMount)
	}
	return p
}

// runtimeState are the low-level runtimes' state directories (each
// container's state.json, pid, exec fifo, console socket) and podman's:
// no runtime binds anything from them into a container.
var runtimeState = []string{"/run/runc", "/run/crun", "/run/youki", "/run/libpod"}

// runtimeSockets are where container runtimes serve their APIs (each
// also under /var/run, a link to /run that a bind source need not
// resolve through when the socket is absent), NRI's (a plugin adjusts
// other containers), and as the NRI plugin refuses them, systemd's and
// the system bus's: root on one runs a unit on the host (systemd-run)
// as surely as a runtime starts a container. So do the users' runtime
// directories (each user's systemd manager and session bus, rootless
// Docker's and podman's sockets: a process of that user's on the host's
// network, root's among them), snapd's (a snap installed as root) and
// libvirt's (a guest given the host's disk).
var runtimeSockets = []string{"/run/docker.sock", "/run/docker", "/run/containerd",
	"/run/podman", "/run/crio", "/run/dockershim.sock", "/run/buildkit",
	"/run/k3s", "/run/cri-dockerd.sock", "/run/nri", "/run/systemd", "/run/dbus",
	"/run/user", "/run/snapd.socket", "/run/libvirt"}

// stateSockets are sockets that start a process as root (a container, a
// guest) kept under /var, not /run: LXD's (snap and package) and Incus's.
var stateSockets = []string{"/var/snap/lxd/common/lxd", "/var/lib/lxd", "/var/lib/incus"}

// Refusal is a container the hook refuses, with every reason found.
type Refusal struct {
	Container, Trial string
	Reasons          []string
}

func (r *Refusal) Error() string {
	what := "container " + r.Container
	if r.Trial != "" {
		what += " (Trial " + r.Trial + ")"
	}
	return fmt.Sprintf("refused %s: %s", what, strings.Join(r.Reasons, "; "))
}

// Result says what the hook did with a container that it let start, or
// that ended.
type Result struct {
	Trial string // "": no claim, not looked at
	// Made: the Trial was made around the container (a profile).
	Made bool
	// Ended is what the agent did as the container ended (poststop).
	Ended *agentwire.ContainerEnd
}

// statusStopped is the state's status at poststop, the one stage at
// which the hook is run for a container that ended.
const statusStopped = "stopped"

// statusRunning is the state's status once the container's process has
// started: at poststart, never at createRuntime (runc says creating,
// crun created).
const statusRunning = "running"

// restoring: the runtime runs the hook for a container restored from a
// checkpoint, not for one that ended. runc runs prestart and
// createRuntime hooks for a restore (CRIU's setup-namespaces) with the
// status stopped, since no init of its own is recorded yet, and the
// restored process's pid; at poststop a runtime gives no pid (runc,
// crun), or the init's (youki), which has exited: gone, a zombie its
// parent has not reaped yet, or still exiting (youki delete kills a
// created container and runs poststop at once). A restore's process,
// which CRIU holds, is neither.
func (h *Hook) restoring(st State) bool {
	if st.Status != statusStopped || st.Pid <= 0 {
		return false
	}
	dir := filepath.Join(h.proc(), strconv.Itoa(st.Pid))
	if _, err := os.Stat(dir); err != nil {
		return false
	}
	return !exited(dir)
}

// pfExiting is the kernel's PF_EXITING: the task is in do_exit, which a
// fatal signal's delivery starts.
const pfExiting = 0x4

// exited: the process at dir (/proc/PID) is a zombie, dead or exiting,
// as its stat's state and flags say. One whose stat cannot be read is
// not known to have exited.
func exited(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return false
	}
	// The command name may hold spaces and parentheses: the state is
	// the first field after the last ')', the flags the seventh.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
		return true
	}
	if len(f) < 7 {
		return false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting != 0
}

// Run reads the runtime's state from stdin and checks the container.
// A nil error lets the runtime start it.
func (h *Hook) Run(ctx context.Context, stdin io.Reader) (Result, error) {
	st, err := ParseState(stdin)
	if err != nil {
		return Result{}, fmt.Errorf("refused a container: %w", err)
	}
	cfg, cfgErr := readConfig(st.Bundle)
	var cfgAnn map[string]string
	if cfgErr == nil {
		cfgAnn = cfg.Annotations
	}
	cl, err := claimOf(st.Annotations, cfgAnn)
	if err != nil {
		return Result{}, &Refusal{Container: st.ID, Reasons: []string{err.Error()}}
	}
	if !cl.any() {
		if cfgErr != nil && st.Annotations == nil {
			// Annotations may be only in config.json: unread, the claim
			// is unknown.
			return Result{}, &Refusal{Container: st.ID, Reasons: []string{cfgErr.Error()}}
		}
		if why := h.unclaimed(st, cfg); len(why) > 0 {
			return Result{}, &Refusal{Container: st.ID, Reasons: why}
		}
		return Result{}, nil
	}
	refuse := func(reasons ...string) (Result, error) {
		return Result{}, &Refusal{Container: st.ID, Trial: cl.trial, Reasons: reasons}
	}
	if h.restoring(st) {
		// Read as a poststop, it would pass unjudged, with the network
		// namespace and cgroup the checkpoint's and its bundle's.
		return refuse(fmt.Sprintf("the runtime is restoring it from a checkpoint (status %s, process %d): a restored container is not judged as a created one, and neither the hook nor trialnet oci-runtime places it in its Trial; start it anew instead", st.Status, st.Pid))
	}
	if st.Status == statusStopped {
		return h.ended(ctx, st)
	}
	h = h.resolved()
	switch {
	case cfgErr != nil:
		return refuse(cfgErr.Error())
	case len(cl.other) > 0:
		return refuse(fmt.Sprintf("annotations %s are not ones this trialnet knows (%s, %s)", strings.Join(cl.other, ", "), AnnotationTrial, AnnotationProfile))
	case cl.profile != "" && cl.trial != "":
		return refuse(fmt.Sprintf("it names both a Trial (%s) and a profile (%s): annotate one", AnnotationTrial, AnnotationProfile))
	case st.Pid <= 0:
		return refuse(fmt.Sprintf("the OCI state has no container process (pid %d): the hook must run at the createRuntime stage", st.Pid))
	case st.Status == statusRunning:
		// poststart (crun, runc's main branch): its process has run
		// unjudged, on whatever network its bundle gave it.
		return refuse("the OCI state says it is running: the hook ran after its process started (poststart), and must run at the createRuntime stage, before its first instruction")
	}
	cfg.podShm = h.podShm(cfg.Annotations[AnnotationSandboxID])
	h.data = &runtimeData{roots: h.storageRoots(), own: []string{st.ID}}
	if id := cfg.Annotations[AnnotationCRIOSandboxID]; id != "" {
		h.data.own = append(h.data.own, id)
	}
	cfg.data = h.data
	why := cfg.check(st.Bundle, h.protected())
	why = append(why, cfg.procKnobRefusals()...)
	if a := cfg.seccompAnnotations(); len(a) > 0 {
		why = append(why, seccompAnnotationsAdvice(a))
	}
	why = append(why, cfg.runtimeAnnotationRefusals()...)
	if keys := cfg.seccomp().keyCallsLetThrough(); len(keys) > 0 {
		why = append(why, "its seccomp profile lets it use the kernel's keyrings ("+strings.Join(keys, "; ")+"): "+keyCallsAdvice(DefaultSeccompProfile))
	}
	if len(why) > 0 {
		return refuse(why...)
	}
	c := agentwire.Container{ID: st.ID, PID: st.Pid, Bundle: st.Bundle, Seccomp: cfg.seccomp() != nil,
		Capabilities: cfg.boundingCaps()}
	_, c.UserNamespace = cfg.namespaces()["user"]
	// The scan of /proc for its PID namespace's other processes runs
	// while the agent makes or looks up its Trial; they are judged
	// against the Trial's cgroup after its answer.
	peers := h.scanPIDNS(st.Pid)
	if cl.profile != "" {
		return h.makeTrial(ctx, st, cl.profile, c, cfg, peers)
	}
	info, err := h.Agent().Get(ctx, cl.trial)
	if err != nil {
		return refuse(fmt.Sprintf("cannot look Trial %q up: %v", cl.trial, err))
	}
	if why := h.checkProcess(st, cfg, info, peers); len(why) > 0 {
		return refuse(why...)
	}
	if _, err := h.Agent().AddContainer(ctx, cl.trial, c); err != nil {
		return refuse(fmt.Sprintf("the agent did not record it: %v", err))
	}
	return Result{Trial: cl.trial}, nil
}

// unclaimed refuses a container that claims no Trial but is in one, or
// shares one's namespace (Places.Unclaimed): by its spec, and at
// createRuntime (or a restore's) by its process as the kernel has it.
// At poststop it ended: nothing to judge.
func (h *Hook) unclaimed(st State, cfg *config) []string {
	if st.Status == statusStopped && !h.restoring(st) {
		return nil
	}
	var mount string
	if h.TrialParent != "" { // only a moved parent costs the mount's lookup
		mount, _ = h.cgroupMount()
	}
	p, err := AgentPlaces(h.TrialParent, h.NetnsDir, mount)
	if err != nil {
		return []string{err.Error()}
	}
	p.Proc = h.Proc
	if p.CgroupMount == "" {
		p.CgroupMount = h.CgroupMount
	}
	var why []string
	if cfg != nil {
		var cgroupsPath string
		if cfg.Linux != nil {
			cgroupsPath = cfg.Linux.CgroupsPath
		}
		why = p.Unclaimed(cfg.namespaces(), cgroupsPath)
	}
	if st.Pid > 0 {
		why = append(why, p.process(st.Pid)...)
	}
	return why
}

// makeTrial asks the agent for a Trial made from profile around the
// container, then checks the container is in it as for a Trial it
// joins. A container that fails the check is refused, and its Trial
// destroyed: nothing is left half-made.
func (h *Hook) makeTrial(ctx context.Context, st State, profile string, c agentwire.Container, cfg *config, peers *pidNSScan) (Result, error) {
	info, err := h.Agent().ContainerTrial(ctx, agentwire.ContainerTrial{Profile: profile, Container: c})
	if err != nil {
		return Result{}, &Refusal{Container: st.ID, Reasons: []string{fmt.Sprintf("no Trial from profile %s could be made around it: %v", profile, err)}}
	}
	if why := h.checkProcess(st, cfg, info, peers); len(why) > 0 {
		if err := h.Agent().Destroy(ctx, info.ID); err != nil {
			why = append(why, fmt.Sprintf("and its Trial could not be destroyed (trialnet destroy %s): %v", info.ID, err))
		}
		return Result{}, &Refusal{Container: st.ID, Trial: info.ID, Reasons: why}
	}
	return Result{Trial: info.ID, Made: true}, nil
}

// ended tells the agent that a container that claimed a Trial ended
// (poststop): a Trial made around it is destroyed, one it joined no
// longer lists it. The runtime only logs a poststop hook's failure; the
// agent also sees a container Trial's init exit by itself.
func (h *Hook) ended(ctx context.Context, st State) (Result, error) {
	end, err := h.Agent().EndContainer(ctx, st.ID)
	if err != nil {
		return Result{}, fmt.Errorf("container %s ended, and the agent was not told: %w", st.ID, err)
	}
	return Result{Trial: end.Trial, Ended: &end}, nil
}

// podShm accepts the bind of the /dev/shm that containerd made for
// the container's pod, named by the pod's sandbox id: its shape, and a
// tmpfs of its own there.
func (h *Hook) podShm(sandbox string) func(mountOf) bool {
	dir := h.ContainerdShmDir
	if dir == "" {
		dir = ContainerdShmDir
	}
	return func(m mountOf) bool { return m.podShm(dir, sandbox) && ownTmpfs(m.Source) }
}

// resolved is h with the cgroup2 mount and the protected paths found
// once for the checks of one container, each of which would otherwise
// read the host's mountinfo again (six times a container). A mount not
// found stays unknown, and checkCgroup refuses the container.
func (h *Hook) resolved() *Hook {
	r := *h
	if r.CgroupMount == "" {
		r.CgroupMount, _ = cgroup2.Mount()
	}
	r.Protected = r.protected()
	return &r
}

func (h *Hook) proc() string {
	if h.Proc == "" {
		return "/proc"
	}
	return h.Proc
}

func (h *Hook) protected() []string {
	if h.Protected != nil {
		return h.Protected
	}
	sock := h.Socket
	if sock == "" {
		sock = agentwire.DefaultSocket
	}
	mount, _ := h.cgroupMount() // unknown: checkCgroup refuses the container
	return DefaultProtected(sock, mount)
}

func (h *Hook) cgroupMount() (string, error) {
	if h.CgroupMount != "" {
		return h.CgroupMount, nil
	}
	return cgroup2.Mount()
}

// checkProcess looks at the container's process as the kernel has it:
// the runtime made its namespaces and placed it in its cgroup before
// this stage, and it runs nothing of the image yet. It also checks the
// config's mounts against the agent's own directories, which only the
// agent's answer names: an overlay made of one shows in the kernel's
// view as an overlay alone. peers is the scan for the processes that
// share its PID namespace.
func (h *Hook) checkProcess(st State, cfg *config, info agentwire.TrialInfo, peers *pidNSScan) []string {
	pid, rootfs := st.Pid, cfg.rootfs(st.Bundle)
	dirs := agentDirs(info)
	for _, d := range dirs {
		// A bind source or overlay layer is compared resolved.
		if real, err := filepath.EvalSymlinks(d); err == nil && real != d {
			dirs = append(dirs, real)
		}
	}
	why := cfg.mountRefusals(st.Bundle, dirs)
	if !info.BPFLSM {
		if v := cfg.seccomp().vsockLetThrough(runtime.GOARCH); len(v) > 0 {
			why = append(why, "its seccomp profile lets it open AF_VSOCK sockets ("+strings.Join(v, "; ")+"): "+vsockAdvice(DefaultSeccompProfile))
		}
	}
	p := filepath.Join(h.proc(), strconv.Itoa(pid))
	self := filepath.Join(h.proc(), "self", "ns")
	same, err := sameFile(filepath.Join(p, "ns", "net"), info.Netns)
	switch {
	case err != nil:
		why = append(why, fmt.Sprintf("cannot compare its network namespace with the Trial's: %v", err))
	case !same:
		// Docker's host network is a namespace joined by path, so the
		// config check does not see it: say so here.
		if host, _ := sameFile(filepath.Join(p, "ns", "net"), filepath.Join(self, "net")); host {
			why = append(why, "its network namespace is not the Trial's: it is the host's (host networking)")
		} else {
			why = append(why, fmt.Sprintf("its network namespace is not the Trial's (%s): give the runtime --network ns:%s (podman) or that path as the bundle's network namespace", info.Netns, info.Netns))
		}
	}
	if w := h.checkCgroup(p, info); w != "" {
		why = append(why, w)
	}
	// mnt and ipc: a namespace joined by path (/proc/1/ns/mnt) is not in
	// the config's view, and would show it the control socket and keys,
	// or the host's shared memory.
	for _, ns := range []string{"pid", "cgroup", "mnt", "ipc"} {
		same, err := sameFile(filepath.Join(p, "ns", ns), filepath.Join(self, ns))
		switch {
		case err != nil:
			why = append(why, fmt.Sprintf("cannot compare its %s namespace with the runtime's: %v", ns, err))
		case same:
			why = append(why, fmt.Sprintf("it shares the runtime's (the host's) %s namespace", ns))
		}
	}
	why = append(why, h.withTrialDirs(info).checkMounts(pid, rootfs, info.Cgroup)...)
	return append(why, h.outsiders(peers, info)...)
}

// withTrialDirs is h with the agent's own directories, wherever its
// config puts them, protected too: the ones its answer names (state,
// data, receipt key, namespace and bpffs pins) and the directory of the
// Trial's namespace pin, which an agent from before AgentDirs names
// alone. Through one a container would reach every Trial's network
// namespace, or the records and keys that hold them.
func (h *Hook) withTrialDirs(info agentwire.TrialInfo) *Hook {
	r := *h
	r.Protected = append(slices.Clone(h.protected()), agentDirs(info)...)
	return &r
}

// agentDirs are the agent's own directories that its answer info names.
func agentDirs(info agentwire.TrialInfo) []string {
	var out []string
	for _, d := range append(slices.Clone(info.AgentDirs), filepath.Dir(filepath.Clean(info.Netns))) {
		if filepath.IsAbs(d) && filepath.Clean(d) != "/" {
			out = append(out, filepath.Clean(d))
		}
	}
	return out
}

// pidNSScan is a scan of /proc, started by scanPIDNS, for the processes
// other than the container's init that share its PID namespace, and the
// reasons found while scanning (a namespace that cannot be read).
type pidNSScan struct {
	done  chan struct{}
	peers []int
	why   []string
}

// scanPIDNS starts the scan for the processes that share process pid's
// PID namespace.
func (h *Hook) scanPIDNS(pid int) *pidNSScan {
	s := &pidNSScan{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.peers, s.why = h.pidNSPeers(pid)
	}()
	return s
}

// outsiders refuses a PID namespace that the container shares with a
// process outside the Trial (podman --pid container:X, a bundle's pid
// path to another container's): root in the container could ptrace it,
// or signal it, and through it use another network namespace. It waits
// for scan, and says which of the processes it found is outside the
// Trial of info, or could not be placed.
func (h *Hook) outsiders(scan *pidNSScan, info agentwire.TrialInfo) []string {
	<-scan.done
	why := slices.Clone(scan.why)
	for _, n := range scan.peers {
		cg, err := h.cgroupOf(filepath.Join(h.proc(), strconv.Itoa(n)))
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH):
		case err != nil:
			why = append(why, fmt.Sprintf("its PID namespace holds process %d, whose cgroup is unknown: %v", n, err))
		case !within(cg, filepath.Clean(info.Cgroup)):
			why = append(why, fmt.Sprintf("its PID namespace holds process %d, which is not in the Trial (cgroup %s): it could trace or signal it, and reach its network; give it a PID namespace of its own", n, cg))
		}
	}
	return why
}

// pidNSPeers are the processes other than pid in pid's PID namespace,
// and why one could not be placed.
func (h *Hook) pidNSPeers(pid int) ([]int, []string) {
	// A process's own PID namespace is fixed for its life: read once,
	// not once per process on the host.
	var own unix.Stat_t
	if err := unix.Stat(filepath.Join(h.proc(), strconv.Itoa(pid), "ns", "pid"), &own); err != nil {
		return nil, []string{fmt.Sprintf("cannot read its PID namespace: %v", err)}
	}
	ents, err := os.ReadDir(h.proc())
	if err != nil {
		return nil, []string{fmt.Sprintf("cannot list the processes that share its PID namespace: %v", err)}
	}
	var peers []int
	var why []string
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n == pid {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(h.proc(), e.Name(), "ns", "pid"), &st); err != nil {
			if w := h.unreadablePIDNS(pid, n, err); w != "" {
				why = append(why, w)
			}
			continue
		}
		if st.Dev == own.Dev && st.Ino == own.Ino {
			peers = append(peers, n)
		}
	}
	return peers, why
}

// unreadablePIDNS says why process n, whose PID namespace file the hook
// could not read (err), may share container pid's PID namespace ("": it
// does not). Gone (ENOENT, ESRCH) is fine. The kernel shows that file
// only to whom may ptrace-read the process (EACCES: a hook run without
// CAP_SYS_PTRACE, an LSM): such a process is not skipped, which would
// let one made non-dumpable, or ptrace-attached, hide, but placed by the
// depth of its PID namespace, the number of pids status's NSpid lists,
// which any reader sees: one at another depth than the container's is
// in another namespace.
func (h *Hook) unreadablePIDNS(pid, n int, err error) string {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return ""
	}
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		own, oerr := h.pidNSDepth(pid)
		other, nerr := h.pidNSDepth(n)
		switch {
		case errors.Is(nerr, fs.ErrNotExist) || errors.Is(nerr, unix.ESRCH):
			return ""
		case oerr == nil && nerr == nil && own != other:
			return ""
		case oerr == nil && nerr == nil:
			err = fmt.Errorf("%w, and it is as deep in nested PID namespaces as the container (%d)", err, own)
		default:
			err = fmt.Errorf("%w (its PID namespace's depth: %w)", err, errors.Join(oerr, nerr))
		}
	}
	return fmt.Sprintf("cannot tell whether process %d shares its PID namespace: reading /proc/%d/ns/pid: %v; the hook needs CAP_SYS_PTRACE to see every process's namespaces (runtimes run hooks as root with it), and no LSM may hide processes from it", n, n, err)
}

// pidNSDepth is how many PID namespaces process pid is in: the pids its
// status's NSpid line lists, from the /proc mount's namespace down.
func (h *Hook) pidNSDepth(pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join(h.proc(), strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			return len(strings.Fields(rest)), nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no NSpid line (Linux 4.1+)", pid)
}

// cgroupOf is the cgroup v2 directory of the process at p.
func (h *Hook) cgroupOf(p string) (string, error) {
	mount, err := h.cgroupMount()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(p, "cgroup"))
	if err != nil {
		return "", fmt.Errorf("cannot read its cgroup: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if r, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "0::"); ok {
			return filepath.Join(mount, r), nil
		}
	}
	return "", errors.New("it has no cgroup v2 cgroup")
}

// checkCgroup: the process's cgroup is the Trial's or under it, and the
// Trial's cgroup directory is the one whose id the agent gave.
func (h *Hook) checkCgroup(p string, info agentwire.TrialInfo) string {
	cg, err := h.cgroupOf(p)
	if err != nil {
		return err.Error()
	}
	mount, _ := h.cgroupMount() // cgroupOf found it
	var fi unix.Stat_t
	if err := unix.Stat(info.Cgroup, &fi); err != nil || fi.Ino != info.CgroupID {
		return fmt.Sprintf("the Trial's cgroup %s is not the one the agent created (id %d): %v", info.Cgroup, info.CgroupID, err)
	}
	if !within(cg, filepath.Clean(info.Cgroup)) {
		return fmt.Sprintf("its cgroup %s is not the Trial's (%s) nor under it: give the runtime --cgroup-parent %s (podman, with --cgroup-manager cgroupfs) or a cgroupsPath under it in the bundle",
			cg, info.Cgroup, strings.TrimPrefix(info.Cgroup, mount))
	}
	return ""
}

// sameFile: a and b are the same inode on the same device (for
// namespaces: the same namespace).
func sameFile(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, fmt.Errorf("stat %s: %w", a, err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, fmt.Errorf("stat %s: %w", b, err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}
