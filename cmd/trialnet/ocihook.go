//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"log/syslog"
	"os"
	"path/filepath"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/ocihook"
)

// hookAgentTimeout bounds the hook's calls to the agent: a container
// start waits on them, and an agent that does not answer refuses it.
const hookAgentTimeout = 20 * time.Second

// cmdOCIHook is run by an OCI runtime at createRuntime with the state
// on stdin; "install" writes its hooks.d entry. Its exit status is the
// verdict: non-zero makes the runtime refuse the container.
func cmdOCIHook(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "install" {
		return cmdOCIHookInstall(args[1:], stdout, stderr)
	}
	fs := newFlags("oci-hook", "oci-hook [--socket S]   (run by an OCI runtime at createRuntime; reads the state on stdin)\n       trialnet oci-hook install [--hooks-dir DIR] [--force] [--print]",
		"podman run --annotation trialnet.io/trial=eval-42 ...   (after: sudo trialnet oci-hook install)", stderr)
	socket := socketFlag(fs)
	if err := parseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, hookAgentTimeout)
	defer cancel()
	h := &ocihook.Hook{
		Agent:  func() ocihook.Agent { return client.NewClient(*socket) },
		Socket: *socket,
	}
	if _, err := h.Run(ctx, os.Stdin); err != nil {
		fmt.Fprintf(stderr, "trialnet oci-hook: %v\n", err)
		logRefusal(err)
		return exitFailure
	}
	return exitOK
}

// logRefusal writes a refusal to syslog too: runc shows a hook's
// standard error, but crun under podman reports only that the hook
// failed (journalctl -t trialnet-oci-hook shows why). No syslog: the
// standard error is all there is.
func logRefusal(err error) {
	w, serr := syslog.New(syslog.LOG_WARNING|syslog.LOG_DAEMON, "trialnet-oci-hook")
	if serr != nil {
		return
	}
	_ = w.Warning(err.Error())
	_ = w.Close()
}

func cmdOCIHookInstall(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("oci-hook install", "oci-hook install [--hooks-dir DIR] [--force] [--print] [--socket S]",
		"sudo trialnet oci-hook install   # podman and CRI-O then run the hook for containers annotated trialnet.io/...", stderr)
	dir := fs.String("hooks-dir", ocihook.DefaultHooksDir, "the runtime's hooks directory (podman --hooks-dir, CRI-O hooks_dir)")
	force := fs.Bool("force", false, "replace a different "+ocihook.HookFile+" in it")
	printOnly := fs.Bool("print", false, "print the entry instead of writing it")
	socket := socketFlag(fs)
	if err := parseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		return fail(stdout, stderr, false, exitFailure, fmt.Errorf("oci-hook install: where is this trialnet: %w", err))
	}
	hookArgs := []string{"trialnet", "oci-hook"}
	if *socket != client.DefaultSocket {
		hookArgs = append(hookArgs, "--socket", *socket)
	}
	entry, err := ocihook.Entry(self, hookArgs)
	if err != nil {
		return fail(stdout, stderr, false, exitFailure, err)
	}
	if *printOnly {
		_, _ = stdout.Write(entry)
		return exitOK
	}
	path, changed, err := ocihook.Install(*dir, entry, *force)
	if err != nil {
		return fail(stdout, stderr, false, exitFailure, fmt.Errorf("oci-hook install: %w", err))
	}
	if changed {
		fmt.Fprintf(stdout, "wrote %s: containers annotated trialnet.io/trial=ID are checked by %s oci-hook before they start, those annotated trialnet.io/profile=NAME get a Trial that ends with them\n", path, self)
	} else {
		fmt.Fprintf(stdout, "%s is already this entry\n", path)
	}
	return exitOK
}
