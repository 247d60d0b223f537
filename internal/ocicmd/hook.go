//go:build linux

// Package ocicmd is trialnet's OCI commands: oci-hook, the hook a
// runtime runs for each container with a trialnet.io/ annotation, and
// oci-runtime, the runtime Docker runs in place of runc for each of its
// calls, with their install commands. trialnet-oci runs them; trialnet
// runs them too, for the entries written before trialnet-oci was. It is a
// package of its own so that trialnet-oci links nothing else: a
// container's start waits on each of these processes' start.
package ocicmd

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/syslog"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/trialnet/trialnet/internal/agentwire"
	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/ocihook"
)

// hookAgentTimeout bounds the hook's calls to the agent: a container
// start waits on them, and an agent that does not answer refuses it.
const hookAgentTimeout = 20 * time.Second

// Hook is oci-hook, run by an OCI runtime at createRuntime with the
// state on stdin; "install" writes its hooks.d entries, which run bin.
// Its exit status is the verdict: non-zero makes the runtime refuse the
// container.
func Hook(ctx context.Context, args []string, stdout, stderr io.Writer, bin Binary) int {
	if len(args) > 0 && args[0] == "install" {
		return hookInstall(args[1:], stdout, stderr, bin)
	}
	fs := cli.NewFlags("oci-hook", "oci-hook [--socket S] [--cgroup-parent DIR] [--netns-dir DIR]   (run by an OCI runtime at createRuntime; reads the state on stdin)\n       trialnet oci-hook install [--hooks-dir DIR] [--force] [--print]",
		"podman run --annotation trialnet.io/trial=eval-42 ...   (after: sudo trialnet oci-hook install)", stderr)
	socket := cli.SocketFlag(fs)
	parent, netnsDir := placesFlags(fs)
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return cli.ExitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, hookAgentTimeout)
	defer cancel()
	h := &ocihook.Hook{
		Agent:       func() ocihook.Agent { return agentwire.NewDirect(*socket) },
		Socket:      *socket,
		TrialParent: *parent,
		NetnsDir:    *netnsDir,
	}
	in, err := io.ReadAll(io.LimitReader(os.Stdin, maxHookInput+1))
	if err == nil && ocihook.IsConfig(in) {
		err = ocihook.Precreate(ctx, agentwire.NewDirect(*socket), in, stdout)
	} else if err == nil {
		_, err = h.Run(ctx, bytes.NewReader(in))
	}
	if err != nil {
		fmt.Fprintf(stderr, "trialnet oci-hook: %v\n", err)
		logRefusal(err)
		return cli.ExitFailure
	}
	return cli.ExitOK
}

// placesFlags are where the agent keeps its Trials, as its config's
// paths say, for the hook to find a container that claims no Trial in
// one.
func placesFlags(fs *flag.FlagSet) (parent, netnsDir *string) {
	return fs.String("cgroup-parent", "", "the agent's paths.cgroup_parent, if moved (default: trialnet under the cgroup2 mount)"),
		fs.String("netns-dir", "", "the agent's paths.netns_dir, if moved (default "+ocihook.DefaultNetnsDir+")")
}

// placesArgs are the places flags' arguments for a command line: none
// for the defaults.
func placesArgs(parent, netnsDir string) []string {
	var a []string
	if parent != "" {
		a = append(a, "--cgroup-parent", parent)
	}
	if netnsDir != "" {
		a = append(a, "--netns-dir", netnsDir)
	}
	return a
}

// maxHookInput bounds the hook's standard input: a state, or podman's
// config at precreate (each bounded again where it is read).
const maxHookInput = 16 << 20

// logRefusal writes a refusal to syslog and to the kernel's log too:
// runc shows a hook's standard error, but crun reports only that the
// hook failed (journalctl -t trialnet-oci-hook shows why, and dmesg or
// the console, where no syslog runs). Either may be missing: the
// standard error is then all there is.
func logRefusal(err error) {
	_ = ocihook.WriteKmsg(ocihook.Kmsg, err.Error())
	w, serr := syslog.New(syslog.LOG_WARNING|syslog.LOG_DAEMON, "trialnet-oci-hook")
	if serr != nil {
		return
	}
	_ = w.Warning(err.Error())
	_ = w.Close()
}

func hookInstall(args []string, stdout, stderr io.Writer, bin Binary) int {
	fs := cli.NewFlags("oci-hook install", "oci-hook install [--hooks-dir DIR] [--precreate=false] [--seccomp-profile FILE] [--seccomp-base FILE] [--force] [--print|--print-seccomp] [--socket S] [--cgroup-parent DIR] [--netns-dir DIR]",
		"sudo trialnet oci-hook install   # podman and CRI-O then run the hook for every container: those annotated trialnet.io/... join a Trial", stderr)
	dir := fs.String("hooks-dir", ocihook.DefaultHooksDir, "the runtime's hooks directory (podman --hooks-dir, CRI-O hooks_dir)")
	profilePath := fs.String("seccomp-profile", ocihook.DefaultSeccompProfile, "where to write the seccomp profile for containers in a Trial (podman --security-opt seccomp=FILE)")
	base := fs.String("seccomp-base", ocihook.DefaultSeccompBase, "the runtime's default profile that the written one starts from (absent at the default path: a profile that refuses the key calls only)")
	force := fs.Bool("force", false, "replace a different "+ocihook.HookFile+", "+ocihook.PoststopFile+" or seccomp profile")
	printOnly := fs.Bool("print", false, "print the entries instead of writing them")
	printSeccomp := fs.Bool("print-seccomp", false, "print the seccomp profile instead of writing it")
	precreate := fs.Bool("precreate", true, "run the hook at podman's precreate stage too, which profile containers need where the BPF LSM layer is active; false for CRI-O or a podman before 4.3, whose hooks library refuses an entry with it")
	socket := cli.SocketFlag(fs)
	parent, netnsDir := placesFlags(fs)
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return cli.ExitUsage
	}
	self, err := bin()
	if err != nil {
		return cli.Fail(stdout, stderr, false, cli.ExitFailure, fmt.Errorf("oci-hook install: %w", err))
	}
	hookArgs := []string{"trialnet", "oci-hook"}
	if *socket != agentwire.DefaultSocket {
		hookArgs = append(hookArgs, "--socket", *socket)
	}
	hookArgs = append(hookArgs, placesArgs(*parent, *netnsDir)...)
	if *precreate && !flagSet(fs, "precreate") {
		if err := precreateRefused(); err != nil {
			return cli.Fail(stdout, stderr, false, cli.ExitFailure, fmt.Errorf("oci-hook install: %w", err))
		}
	}
	entries, err := ocihook.Entries(self, hookArgs)
	if err == nil && *precreate {
		entries[ocihook.HookFile], err = ocihook.WithPrecreate(entries[ocihook.HookFile])
	}
	if err != nil {
		return cli.Fail(stdout, stderr, false, cli.ExitFailure, err)
	}
	profile, from, err := seccompProfile(*base, *base != ocihook.DefaultSeccompBase)
	if err != nil {
		return cli.Fail(stdout, stderr, false, cli.ExitFailure, fmt.Errorf("oci-hook install: %w", err))
	}
	switch {
	case *printOnly:
		for _, name := range slices.Sorted(maps.Keys(entries)) {
			fmt.Fprintf(stdout, "==> %s <==\n%s", name, entries[name])
		}
		return cli.ExitOK
	case *printSeccomp:
		_, _ = stdout.Write(profile)
		return cli.ExitOK
	}
	paths, changed, err := ocihook.Install(*dir, entries, *force)
	if err != nil {
		return cli.Fail(stdout, stderr, false, cli.ExitFailure, fmt.Errorf("oci-hook install: %w", err))
	}
	if changed {
		fmt.Fprintf(stdout, "wrote %s: containers annotated trialnet.io/trial=ID are checked by %s oci-hook before they start, those annotated trialnet.io/profile=NAME get a Trial that ends with them\n", strings.Join(paths, " and "), self)
	} else {
		fmt.Fprintf(stdout, "%s are already these entries\n", strings.Join(paths, " and "))
	}
	changed, err = ocihook.InstallSeccompProfile(*profilePath, profile, *force)
	if err != nil {
		return cli.Fail(stdout, stderr, false, cli.ExitFailure, fmt.Errorf("oci-hook install: %w", err))
	}
	if changed {
		fmt.Fprintf(stdout, "wrote %s (%s): run podman's containers in a Trial with --security-opt seccomp=%s; the hook refuses a container whose profile lets it use the kernel's keyrings\n", *profilePath, from, *profilePath)
	} else {
		fmt.Fprintf(stdout, "%s is already this profile\n", *profilePath)
	}
	return cli.ExitOK
}

// flagSet says whether name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) (set bool) {
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// precreateRefused says why the default entry, with podman's precreate
// stage, would break a runtime installed here: CRI-O's hooks library and
// podman's before 4.3 know no such stage, and refuse every container
// while an entry names it. An operator's explicit --precreate is kept.
func precreateRefused() error {
	const choose = "pass --precreate=false (profile containers under the BPF LSM layer then need trialnet oci-runtime, the NRI plugin, " +
		"or a Trial made first and trialnet.io/trial=ID), or --precreate with --hooks-dir a directory only a podman 4.3 or later reads"
	if crio, err := exec.LookPath("crio"); err == nil {
		return fmt.Errorf("CRI-O is installed here (%s): its hooks library refuses an entry with podman's precreate stage, "+
			"which the default entry has, and would run no container while it is there: %s", crio, choose)
	}
	podman, err := exec.LookPath("podman")
	if err != nil {
		return nil
	}
	out, err := exec.Command(podman, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %v: the default entry has podman's precreate stage, which a podman before 4.3 refuses; %s", podman, err, choose)
	}
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "podman version %d.%d", &major, &minor); err != nil {
		return fmt.Errorf("%s --version said %q: the default entry has podman's precreate stage, which a podman before 4.3 refuses; %s", podman, out, choose)
	}
	if major < 4 || major == 4 && minor < 3 {
		return fmt.Errorf("this podman is %d.%d (%s): the default entry has podman's precreate stage, which a podman before 4.3 refuses, "+
			"and would run no container while it is there: %s", major, minor, podman, choose)
	}
	return nil
}

// seccompProfile is the profile install writes, and what it was made
// from: base with the key calls refused, or the least profile refusing
// them where base is absent and was not asked for by name.
func seccompProfile(base string, named bool) ([]byte, string, error) {
	b, err := os.ReadFile(base)
	switch {
	case errors.Is(err, os.ErrNotExist) && !named:
		p, err := ocihook.SeccompProfile(nil, runtime.GOARCH)
		return p, "no " + base + " here: it refuses the key calls and lets every other call run; pass --seccomp-base with your runtime's default profile to keep its other refusals", err
	case err != nil:
		return nil, "", fmt.Errorf("the seccomp profile to start from: %w", err)
	}
	p, err := ocihook.SeccompProfile(b, runtime.GOARCH)
	if err != nil {
		return nil, "", fmt.Errorf("the seccomp profile to start from, %s: %w", base, err)
	}
	return p, base + " with " + strings.Join(ocihook.KeyCalls, ", ") + " refused", nil
}
