//go:build linux

// Package ociruntime is trialnet oci-runtime, an OCI runtime that
// container engines without a hooks directory (Docker) are given in
// place of runc: for a container that names a Trial it puts the
// container in the Trial (its network namespace, a cgroup under its,
// the proxy's environment) and trialnet oci-hook at createRuntime into
// the bundle, then runs runc; every other command line reaches runc as
// it came. The hook, not the wrapper, judges the container: whatever
// the wrapper rewrote or left, the hook checks as the kernel has it,
// and refuses a privileged container, one on the host's network or one
// outside its Trial.
//
// It imports only package client and package ocihook of trialnet's.
package ociruntime

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/trialnet/trialnet/internal/agentwire"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/ocihook"
)

// DefaultRunc is the runtime the wrapper runs: Debian's runc, the one
// Docker runs by default.
const DefaultRunc = "/usr/sbin/runc"

// Agent is what the wrapper asks of the agent (agentwire.Client serves it).
type Agent interface {
	Get(ctx context.Context, id string) (agentwire.TrialInfo, error)
	PrepareContainer(ctx context.Context, req agentwire.ContainerPrepare) (agentwire.PreparedContainer, error)
}

// Wrapper prepares one runc command line.
type Wrapper struct {
	// Agent returns the agent to ask; called only for a container that
	// names a Trial.
	Agent func() Agent
	// Hook and HookArgs are what the bundle's createRuntime hook runs:
	// trialnet's binary and ["trialnet", "oci-hook", ...].
	Hook     string
	HookArgs []string
	// CgroupMount is the cgroup2 mount ("": found in mountinfo).
	CgroupMount string
	// Trials are where a container that names no Trial is looked for in
	// one (the zero value: the host's, with the agent's defaults).
	Trials ocihook.Places
}

// Prepare returns the command line to run runc with. For a create (or
// run) of a container that names a Trial it has rewritten the bundle
// first; a restore of one it refuses. An error refuses the command,
// which must then not run.
func (w *Wrapper) Prepare(ctx context.Context, args []string) ([]string, error) {
	inv, err := parseArgs(args)
	if err != nil {
		return nil, err
	}
	if inv.command == "exec" {
		return args, inv.checkExec()
	}
	if !inv.creates() && !inv.restores() {
		return args, nil
	}
	dir := inv.bundle
	if dir == "" {
		if dir, err = os.Getwd(); err != nil {
			return nil, err
		}
	}
	b, err := readBundle(dir)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", inv.id, err)
	}
	c, err := b.claim()
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", inv.id, err)
	}
	if !c.any(b) {
		// No hook runs for it: the wrapper judges its spec itself.
		if why := w.Trials.Unclaimed(b.namespaces(), b.cgroupsPath()); len(why) > 0 {
			return nil, &ocihook.Refusal{Container: inv.id, Reasons: why}
		}
		return args, nil
	}
	if inv.restores() {
		// Passed on, runc would restore it as its engine wrote the bundle
		// (Docker's network, a cgroup outside the Trial), with no hook.
		return nil, &ocihook.Refusal{Container: inv.id, Trial: c.trial, Reasons: []string{
			"it claims a Trial and is being restored from a checkpoint (runc restore, docker start --checkpoint): a restored container is not placed in its Trial nor judged by the hook; start it anew instead"}}
	}
	out := args
	if c.trial != "" {
		info, err := w.Agent().Get(ctx, c.trial)
		if err != nil {
			return nil, fmt.Errorf("container %s: cannot look Trial %q up: %w", inv.id, c.trial, err)
		}
		mount := w.CgroupMount
		if mount == "" {
			if mount, err = cgroup2.Mount(); err != nil {
				return nil, fmt.Errorf("container %s: %w", inv.id, err)
			}
		}
		rel, ok := strings.CutPrefix(info.Cgroup, mount)
		if !ok || !strings.HasPrefix(rel, "/") {
			return nil, fmt.Errorf("container %s: Trial %s's cgroup %s is not under the cgroup2 mount %s", inv.id, c.trial, info.Cgroup, mount)
		}
		if err := b.place(c.trial, info.Netns, rel, inv.id, info.ProxyURL); err != nil {
			return nil, fmt.Errorf("container %s: %w", inv.id, err)
		}
		out = inv.withoutSystemd()
	}
	if err := b.dropConsoleRule(); err != nil {
		return nil, fmt.Errorf("container %s: %w", inv.id, err)
	}
	if err := b.refuseKeyCalls(); err != nil {
		return nil, fmt.Errorf("container %s: %w", inv.id, err)
	}
	if err := b.addHook(w.Hook, w.HookArgs, c.poststop(b)); err != nil {
		return nil, fmt.Errorf("container %s: %w", inv.id, err)
	}
	if err := b.write(); err != nil {
		return nil, fmt.Errorf("container %s: rewrite its bundle: %w", inv.id, err)
	}
	if c.profile != "" && c.trial == "" {
		// Last: the entry lives while this process (runc, once exec'd)
		// does, and goes with a create that fails.
		if err := w.prepare(ctx, inv.id, c.profile, b); err != nil {
			return nil, fmt.Errorf("container %s: %w", inv.id, err)
		}
	}
	return out, nil
}

// prepare has the agent make the cgroup of a container that is to have
// a Trial made around it, with a pending entry, before runc puts its
// init there: where the BPF LSM layer is active, a task in a cgroup
// under the Trial parent without one is refused everything, runc's init
// with it. The hook adopts it as it adopts any; both refuse what they
// must.
func (w *Wrapper) prepare(ctx context.Context, id, profile string, b *bundle) error {
	l, err := b.linux()
	if err != nil {
		return err
	}
	cp, _ := l["cgroupsPath"].(string)
	if _, err := w.Agent().PrepareContainer(ctx, agentwire.ContainerPrepare{Container: id, Profile: profile, CgroupsPath: cp}); err != nil {
		return fmt.Errorf("the agent could not prepare a Trial from profile %s for it: %w", profile, err)
	}
	return nil
}

// any: the bundle asks something of trialnet, so the hook must see it
// (an annotation under trialnet.io/ that this build does not know
// included: the hook refuses it).
func (c claim) any(b *bundle) bool {
	if c.trial != "" || c.profile != "" {
		return true
	}
	ann, _ := b.annotations()
	for k := range ann {
		if strings.HasPrefix(strings.ToLower(k), "trialnet.io/") {
			return true
		}
	}
	return false
}

// poststop: the container claims more than a profile alone (a Trial it
// joins, or a key the hook refuses), so the hook runs at poststop too.
func (c claim) poststop(b *bundle) bool {
	if c.trial != "" {
		return true
	}
	ann, _ := b.annotations()
	for k := range ann {
		if strings.HasPrefix(strings.ToLower(k), "trialnet.io/") && k != ocihook.AnnotationProfile {
			return true
		}
	}
	return false
}

// LogRefusal appends err to the runtime's log file as runc writes its
// own errors (--log-format json): containerd's shim reports the last
// error there as the runtime's, which is what docker run prints. It
// writes nothing where the command line names no log.
func LogRefusal(args []string, err error) {
	inv, perr := parseArgs(args)
	if perr != nil {
		inv = &invocation{}
		for i := 0; i+1 < len(args); i++ { // the best reading of a line the parser refused
			if args[i] == "--log" {
				inv.log = args[i+1]
			}
		}
	}
	if inv.log == "" || !filepath.IsAbs(inv.log) {
		return
	}
	f, ferr := os.OpenFile(inv.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if ferr != nil {
		return
	}
	defer f.Close()
	line, _ := json.Marshal(map[string]string{"level": "error", "msg": "trialnet oci-runtime: " + err.Error(), "time": time.Now().UTC().Format(time.RFC3339)})
	_, _ = f.Write(append(line, '\n'))
}

// HookArgs are the hook's arguments for an agent at socket.
func HookArgs(socket string) []string {
	a := []string{"trialnet", "oci-hook"}
	if socket != agentwire.DefaultSocket {
		a = append(a, "--socket", socket)
	}
	return a
}
