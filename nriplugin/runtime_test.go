//go:build linux

package nriplugin

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	nri "github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	validator "github.com/containerd/nri/plugins/default-validator/builtin"
)

// runtime is the NRI library's own runtime side (pkg/adaptation), as
// containerd and CRI-O embed it, on a socket of the test's: the plugin
// talks to it over ttrpc exactly as to a node's runtime.
type runtime struct {
	t    testing.TB
	dir  string
	nri  *nri.Adaptation
	pods []*api.PodSandbox // what Synchronize tells a plugin that connects
	ctrs []*api.Container
}

func newRuntime(t testing.TB, opts ...nri.Option) *runtime {
	t.Helper()
	dir, err := os.MkdirTemp("", "nri") // short: a socket path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r := &runtime{t: t, dir: dir}
	opts = append([]nri.Option{
		nri.WithPluginPath(filepath.Join(dir, "plugins")),
		nri.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		nri.WithSocketPath(r.socket()),
	}, opts...)
	sync := func(ctx context.Context, cb nri.SyncCB) error {
		_, err := cb(ctx, r.pods, r.ctrs)
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	if r.nri, err = nri.New("test-runtime", "0.1", sync, update, opts...); err != nil {
		t.Fatal(err)
	}
	if err := r.nri.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.nri.Stop)
	return r
}

// withValidator is the runtime's default validator, which refuses a
// container whose pod names a required plugin that is not connected.
func withValidator() nri.Option {
	return nri.WithDefaultValidator(&validator.DefaultValidatorConfig{Enable: true})
}

func (r *runtime) socket() string { return filepath.Join(r.dir, "nri.sock") }

// syncing tells when the runtime synchronizes the plugin: while it
// does, the runtime's BlockPluginSync waits, and once it has, the plugin
// takes part in every event.
type syncing struct {
	*Plugin
	once sync.Once
	done chan struct{}
}

func (s *syncing) Synchronize(ctx context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	defer s.once.Do(func() { close(s.done) })
	return s.Plugin.Synchronize(ctx, pods, ctrs)
}

// connect registers p with the runtime and waits for its
// synchronization; it returns a function that disconnects it.
func (r *runtime) connect(p *Plugin) (stop func()) {
	r.t.Helper()
	w := &syncing{Plugin: p, done: make(chan struct{})}
	s, err := stub.New(w, stubOptions(r.socket(), DefaultIndex)...)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	<-w.done
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			s.Stop()
			s.Wait()
		}
	}
	r.t.Cleanup(stop)
	return stop
}

func (r *runtime) create(pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	b := r.nri.BlockPluginSync()
	defer b.Unblock()
	ctr.PodSandboxId = pod.Id
	resp, err := r.nri.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
	return resp.GetAdjust(), err
}

func (r *runtime) stopPod(pod *api.PodSandbox) error {
	return r.nri.StopPodSandbox(context.Background(), &api.StopPodSandboxRequest{Pod: pod})
}
