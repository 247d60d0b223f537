//go:build linux

package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/trialnet/trialnet/trial"
)

// Plugin registration: the name a pod's required-plugins annotation
// names (required-plugins.noderesource.dev: '["trialnet"]'), and the
// index, which orders plugins: trialnet's adjustments come after
// those of plugins with a lower one, and conflict with any that sets the
// same annotation, cgroup path or network namespace (the runtime then
// refuses the container; so do two instances of this one, during a
// rolling update).
const (
	Name         = "trialnet"
	DefaultIndex = "50"
)

// Run registers the plugin with the runtime on nriSocket and serves it
// until ctx ends or the runtime closes the connection (it restarted:
// the plugin's container is restarted, and synchronizes again).
func (p *Plugin) Run(ctx context.Context, nriSocket, index string) error {
	s, err := stub.New(p, stubOptions(nriSocket, index)...)
	if err != nil {
		return fmt.Errorf("NRI plugin: %w", err)
	}
	err = s.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("the runtime closed the connection")
	}
	return fmt.Errorf("NRI plugin on %s: %w (is NRI enabled in containerd or CRI-O? docs/containers.md says how)", nriSocket, err)
}

// failClosed is the failure policy the plugin registers with: a request
// it does not answer in the runtime's time (an agent slow to make a
// Trial) fails the container's creation, and the plugin stays
// connected. NRI's default proceeds without the plugin and drops it:
// that container, and every later one until the plugin reconnects,
// would run unplaced on the pod network. A runtime whose NRI predates
// failure policies (v0.12) ignores it: docs/containers.md says so.
var failClosed = &api.FailurePolicy{FailRequest: true, KeepConnected: true}

// stubOptions are the plugin's registration with the runtime on
// nriSocket, at index.
func stubOptions(nriSocket, index string) []stub.Option {
	return []stub.Option{stub.WithPluginName(Name), stub.WithPluginIdx(index), stub.WithSocketPath(nriSocket),
		stub.WithFailurePolicy(failClosed)}
}

// Install puts what the runtime reads on the node: HookBinary at
// HookPath, which it runs as the hook, and trial.ResolvConf at
// ResolvConf. Each is replaced whole (a rename), never rewritten in
// place under a runtime that is running it.
func (p *Plugin) Install() error {
	if p.HookBinary == "" {
		return errors.New("install the hook: no trialnet-oci binary given to install (--hook-binary)")
	}
	hook, err := os.Open(p.HookBinary)
	if err != nil {
		return fmt.Errorf("install the hook: %w (the trialnet-oci binary, installed beside trialnet-nri, or named by --hook-binary)", err)
	}
	defer hook.Close()
	// The plugin's own binary is no hook: the runtime would run it as
	// trialnet-oci oci-hook and refuse every container placed in a Trial.
	if fi, err := hook.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("install the hook: %s is not a regular file (%v): give the trialnet-oci binary", p.HookBinary, err)
	} else if self, err := os.Stat("/proc/self/exe"); err == nil && os.SameFile(fi, self) {
		return fmt.Errorf("install the hook: %s is the plugin itself, not the hook: give the trialnet-oci binary", p.HookBinary)
	}
	if err := writeAtomic(p.HookPath, hook, 0o755); err != nil {
		return fmt.Errorf("install the hook at %s: %w", p.HookPath, err)
	}
	if p.ResolvConf == "" {
		return nil
	}
	if err := writeAtomic(p.ResolvConf, strings.NewReader(trial.ResolvConf), 0o644); err != nil {
		return fmt.Errorf("install transparent mode's resolv.conf at %s: %w", p.ResolvConf, err)
	}
	return nil
}

func writeAtomic(path string, r io.Reader, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // gone after the rename; left only by a failure
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
