//go:build linux

package ocihook

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"golang.org/x/sys/unix"
)

// Defaults of Places: the agent's default cgroup parent of every Trial
// (sandbox.ParentName under the cgroup2 root) and namespace directory
// (netns.DefaultDir); the hook links neither package.
const (
	DefaultTrialParent = "/trialnet"
	DefaultNetnsDir    = "/run/trialnet/netns"
)

// Places are where a container that claims no Trial is looked for in
// one: the zero value is the host's, with the agent's defaults.
type Places struct {
	// Proc is where /proc is ("": /proc).
	Proc string
	// TrialParent is the cgroup of every Trial, from the cgroup2 root
	// ("": DefaultTrialParent).
	TrialParent string
	// NetnsDir holds the Trials' network namespace files, each named by
	// its Trial ("": DefaultNetnsDir).
	NetnsDir string
	// CgroupMount is where the cgroup2 tree is mounted ("": looked up
	// when a namespace path needs the Trials' threads).
	CgroupMount string
}

// AgentPlaces are the Places of an agent whose paths.cgroup_parent is
// parentDir, a directory of the cgroup2 tree mounted at mount ("": the
// default), and whose paths.netns_dir is netnsDir.
func AgentPlaces(parentDir, netnsDir, mount string) (Places, error) {
	p := Places{NetnsDir: netnsDir, CgroupMount: mount}
	if parentDir == "" {
		return p, nil
	}
	rel, ok := strings.CutPrefix(filepath.Clean(parentDir), filepath.Clean(mount)+"/")
	if !ok || mount == "" {
		return Places{}, fmt.Errorf("the Trials' cgroup parent %s (--cgroup-parent) is not under the cgroup2 mount %q: give the agent's paths.cgroup_parent", parentDir, mount)
	}
	p.TrialParent = rel
	return p, nil
}

func (p Places) proc() string {
	if p.Proc == "" {
		return "/proc"
	}
	return p.Proc
}

func (p Places) parent() string {
	if p.TrialParent == "" {
		return DefaultTrialParent
	}
	return filepath.Clean("/" + p.TrialParent)
}

func (p Places) netnsDir() string {
	if p.NetnsDir == "" {
		return DefaultNetnsDir
	}
	return p.NetnsDir
}

// unclaimedAdvice is what a container that shares a Trial's namespace
// or cgroup without claiming it is told to do.
const unclaimedAdvice = "annotate it " + AnnotationTrial + "=ID to join that Trial (the hook then checks it as the Trial's), or give it a namespace and a cgroup of its own"

// Unclaimed says why a container that claims no Trial (no trialnet.io/
// annotation) must not start as its spec has it: a namespace joined by
// path that is a Trial's (the /proc/PID/ns file of a process in a
// Trial's cgroup, podman's --pid container:X and Docker's alike, a
// Trial's network namespace file, or any other path that opens the
// namespace of a thread in a Trial's cgroup), or a cgroupsPath under
// the Trials' parent. No check of the hook's ran on it: a process of the Trial's
// would trace or signal it (a shared PID namespace), attach its shared
// memory (IPC), or reach it on a loopback outside the Trial's layers,
// and through it act outside the Trial. It asks nothing of the agent,
// as the agent's own container is such a container. A /proc file or a
// namespace directory it cannot read is let pass: the runtime then
// fails to join it, or it is no Trial's.
func (p Places) Unclaimed(namespaces map[string]string, cgroupsPath string) []string {
	var why []string
	for typ, path := range namespaces {
		if path == "" {
			continue
		}
		if pid, ok := procPID(p.proc(), path); ok {
			if trial, cg := p.trialOf(pid); trial != "" {
				why = append(why, fmt.Sprintf("it claims no Trial but joins the %s namespace of process %d (%s), which is in Trial %s (cgroup %s): a process of the Trial's could trace, signal or talk to it outside the Trial's layers; %s", typ, pid, path, trial, cg, unclaimedAdvice))
				continue
			}
		} else if trial := p.netnsOf(path); trial != "" {
			why = append(why, fmt.Sprintf("it claims no Trial but joins Trial %s's network namespace (%s): it would be in the Trial's network unchecked; %s", trial, path, unclaimedAdvice))
			continue
		}
		// Any other spelling (a symlink, /proc/1/root/proc/PID/ns/...,
		// a bind-mounted file), or a process outside the Trials that
		// shares the namespace with one of theirs (a pod's infra
		// container), is judged by the namespace it opens.
		if trial, tid := p.threadIn(typ, path); trial != "" {
			why = append(why, fmt.Sprintf("it claims no Trial but joins the %s namespace of thread %d (through %s), which is in Trial %s: a process of the Trial's could trace, signal or talk to it outside the Trial's layers; %s", typ, tid, path, trial, unclaimedAdvice))
		}
	}
	if cgroupsPath != "" && !strings.Contains(cgroupsPath, ":") { // systemd's slice:prefix:name is never under it
		if trial := p.trialIn(filepath.Clean("/" + cgroupsPath)); trial != "" {
			why = append(why, fmt.Sprintf("it claims no Trial but its cgroupsPath %s is in Trial %s's cgroup: %s", cgroupsPath, trial, unclaimedAdvice))
		}
	}
	return why
}

// process says why the process pid of a container that claims no Trial
// is in one as the kernel has it (its cgroup, its network namespace),
// whatever path its spec spelled.
func (p Places) process(pid int) []string {
	var why []string
	if trial, cg := p.trialOf(pid); trial != "" {
		why = append(why, fmt.Sprintf("it claims no Trial but its process is in Trial %s's cgroup (%s): %s", trial, cg, unclaimedAdvice))
	}
	if trial := p.netnsOf(filepath.Join(p.proc(), strconv.Itoa(pid), "ns", "net")); trial != "" {
		why = append(why, fmt.Sprintf("it claims no Trial but its process is in Trial %s's network namespace: %s", trial, unclaimedAdvice))
	}
	return why
}

// procPID is the process whose namespace file path names
// (/proc/PID/ns/TYPE, /proc/PID/task/TID/ns/TYPE), if it names one
// directly: /proc/PID/root/... or /proc/PID/cwd/... names another
// process's.
func procPID(proc, path string) (int, bool) {
	rest, ok := strings.CutPrefix(filepath.Clean(path), filepath.Clean(proc)+"/")
	if !ok {
		return 0, false
	}
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 3 && parts[1] == "ns":
	case len(parts) == 5 && parts[1] == "task" && parts[3] == "ns":
		if _, err := strconv.Atoi(parts[2]); err != nil {
			return 0, false
		}
	default:
		return 0, false
	}
	pid, err := strconv.Atoi(parts[0])
	return pid, err == nil && pid > 0
}

// nsFile is the /proc/PID/ns name of the OCI spec's namespace type.
func nsFile(typ string) string {
	switch typ {
	case "network":
		return "net"
	case "mount":
		return "mnt"
	}
	return typ
}

// threadIn is the Trial one of whose threads (tid) is in the namespace
// that path opens, of type typ; "" when none is, the namespace is the
// host's (pid 1's: a Trial that shares it shares it with every process),
// or either cannot be read. It reads every thread of the Trials' cgroups
// (cgroup.threads): it runs only for a namespace joined by path that
// the cheaper checks found in no Trial.
func (p Places) threadIn(typ, path string) (trial string, tid int) {
	var ns, host unix.Stat_t
	name := nsFile(typ)
	if unix.Stat(path, &ns) != nil {
		return "", 0
	}
	if unix.Stat(filepath.Join(p.proc(), "1", "ns", name), &host) == nil && host.Dev == ns.Dev && host.Ino == ns.Ino {
		return "", 0
	}
	mount := p.CgroupMount
	if mount == "" {
		var err error
		if mount, err = cgroup2.Mount(); err != nil {
			return "", 0
		}
	}
	root := filepath.Join(mount, p.parent())
	_ = filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || dir == root { // the parent holds no Trial's process
			return nil
		}
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.threads"))
		if err != nil {
			return nil
		}
		for line := range strings.Lines(string(b)) {
			t, err := strconv.Atoi(strings.TrimSpace(line))
			var st unix.Stat_t
			if err != nil || unix.Stat(filepath.Join(p.proc(), strconv.Itoa(t), "ns", name), &st) != nil || st.Dev != ns.Dev || st.Ino != ns.Ino {
				continue
			}
			rel, _ := filepath.Rel(root, dir)
			trial, _, _ = strings.Cut(rel, "/")
			tid = t
			return fs.SkipAll
		}
		return nil
	})
	return trial, tid
}

// trialOf is the Trial whose cgroup holds process pid, and its cgroup
// from the cgroup2 root; "" when it is in none or cannot be read.
func (p Places) trialOf(pid int) (trial, cgroup string) {
	b, err := os.ReadFile(filepath.Join(p.proc(), strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", ""
	}
	for line := range strings.Lines(string(b)) {
		if cg, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "0::"); ok {
			return p.trialIn(cg), cg
		}
	}
	return "", ""
}

// trialIn is the Trial whose cgroup holds cgroup cg (from the cgroup2
// root), or "".
func (p Places) trialIn(cg string) string {
	rest, ok := strings.CutPrefix(filepath.Clean(cg), p.parent()+"/")
	if !ok {
		return ""
	}
	trial, _, _ := strings.Cut(rest, "/")
	return trial
}

// netnsOf is the Trial whose network namespace file is the namespace at
// path (the same inode), or "".
func (p Places) netnsOf(path string) string {
	var ns unix.Stat_t
	if unix.Stat(path, &ns) != nil {
		return ""
	}
	ents, err := os.ReadDir(p.netnsDir())
	if err != nil {
		return ""
	}
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(p.netnsDir(), e.Name()), &st) == nil && st.Dev == ns.Dev && st.Ino == ns.Ino {
			return e.Name()
		}
	}
	return ""
}
