//go:build linux

// Package nriplugin is trialnet's NRI plugin (trialnet-nri), which
// containerd 1.7+ and CRI-O run beside every container they create: for
// a pod annotated trialnet.io/profile=NAME it makes a Trial from that
// profile (the id from the pod's namespace, name and uid), and adjusts
// each of the pod's containers into it before the runtime writes its
// spec: its cgroup a child of the Trial's, its network namespace the
// Trial's, the proxy's environment, transparent mode's resolv.conf, its
// seccomp policy with the kernel's key calls and AF_VSOCK refused, and
// trialnet oci-hook at createRuntime with trialnet.io/trial=ID, so that
// the hook checks the container where the runtime put it. It refuses a
// container that would leave (the hook's rules on what NRI shows of its
// spec), and any annotated pod's container while the agent does not
// answer. The Trial is destroyed with the pod; at a restart the plugin
// destroys the Trials of pods that went meanwhile, and keeps the others.
//
// Pods without a trialnet.io/ annotation pass untouched, and every pod
// of an exempt namespace without a word to the agent (an annotated one
// there is refused), so that the agent's own pod never waits on the
// agent (cilium/tetragon#2402).
//
// It imports package client and ocihook's rules: it links no eBPF.
package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/ocicmd"
	"github.com/trialnet/trialnet/ocihook"
	"github.com/trialnet/trialnet/trial"
)

// Agent is what the plugin asks of the agent (client.Client serves it).
type Agent interface {
	Create(ctx context.Context, req trial.Request) (client.TrialInfo, error)
	Get(ctx context.Context, id string) (client.TrialInfo, error)
	List(ctx context.Context) ([]client.TrialInfo, error)
	Destroy(ctx context.Context, id string) (client.Stats, error)
}

// DefaultAgentTimeout bounds each call to the agent: a container's
// creation waits on it, and the runtime gives up on a plugin after its
// own request timeout (containerd and CRI-O: 2 s by default).
const DefaultAgentTimeout = 10 * time.Second

// Plugin serves NRI's events. The zero values of its optional fields
// are the node's defaults.
type Plugin struct {
	Agent Agent
	// HookPath is the hook's binary, trialnet-oci, as the runtime sees it
	// (on the node), which it runs as the createRuntime hook.
	HookPath string
	// HookBinary is the trialnet-oci binary Install copies to HookPath (the
	// plugin is a binary of its own: cmd/trialnet-nri).
	HookBinary string
	// Socket is the agent's control socket on the node ("":
	// client.DefaultSocket), passed to the hook.
	Socket string
	// ResolvConf is a file on the node holding trial.ResolvConf, bound
	// read-only over /etc/resolv.conf of a transparent Trial's
	// containers ("": they keep the runtime's).
	ResolvConf string
	// CgroupMount is the node's cgroup2 mount ("": /sys/fs/cgroup).
	CgroupMount string
	// Exempt are namespaces whose pods pass untouched (nil: DefaultExempt).
	Exempt []string
	// Protected are the node's paths no container in a Trial may bind
	// (nil: ocihook.DefaultProtected, runtimeDirs, and the directories of
	// HookPath and ResolvConf).
	Protected    []string
	AgentTimeout time.Duration
	Log          *slog.Logger

	mu sync.Mutex // one pod's Trial made once; live, pending
	// live are the Trials of the runtime's pods, as Synchronize found them
	// and the events since changed them.
	live map[string]bool
	// unplaced are the Trial ids of pods that Synchronize found with a
	// container running outside the Trial (made while the plugin was
	// away): their later containers are refused.
	unplaced map[string]bool
	// pending: Synchronize could not sweep the Trials of gone pods (the
	// agent did not answer); the next container's creation tries again.
	pending bool
}

// resolvPath is where resolvers read their configuration.
const resolvPath = "/etc/resolv.conf"

// Refusal is a container the plugin refuses to create, with the reasons.
type Refusal struct {
	Pod, Container string
	Reasons        []string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("trialnet refused container %s of pod %s: %s", r.Container, r.Pod, strings.Join(r.Reasons, "; "))
}

func (p *Plugin) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Log
}

func (p *Plugin) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	d := p.AgentTimeout
	if d == 0 {
		d = DefaultAgentTimeout
	}
	return context.WithTimeout(ctx, d)
}

func (p *Plugin) cgroupMount() string {
	if p.CgroupMount == "" {
		return "/sys/fs/cgroup"
	}
	return p.CgroupMount
}

func (p *Plugin) socket() string {
	if p.Socket == "" {
		return client.DefaultSocket
	}
	return p.Socket
}

// protected are the node's paths no container in a Trial may bind: the
// hook's, the runtimes' (runtimeDirs), and the directories of the hook's
// binary and of resolv.conf, which the runtime runs and binds as root.
func (p *Plugin) protected() []string {
	if p.Protected != nil {
		return p.Protected
	}
	out := append(ocihook.DefaultProtected(p.socket(), p.cgroupMount()), runtimeDirs...)
	out = append(out, filepath.Dir(p.HookPath))
	if p.ResolvConf != "" {
		out = append(out, filepath.Dir(p.ResolvConf))
	}
	return out
}

// ownMount: m is the read-only resolv.conf bind that adjust adds.
func (p *Plugin) ownMount(m *api.Mount) bool {
	return p.ResolvConf != "" && m.GetSource() == p.ResolvConf && m.GetDestination() == resolvPath &&
		ocihook.ReadOnly(m.GetOptions())
}

// ours: the pod's containers are the plugin's business.
func (p *Plugin) ours(pod *api.PodSandbox) bool {
	return !p.exempt(pod) && claimOf(pod).any()
}

func (p *Plugin) exempt(pod *api.PodSandbox) bool {
	exempt := p.Exempt
	if exempt == nil {
		exempt = DefaultExempt()
	}
	return slices.Contains(exempt, pod.GetNamespace())
}

func podName(pod *api.PodSandbox) string { return pod.GetNamespace() + "/" + pod.GetName() }

// CreateContainer puts a container of an annotated pod in the pod's
// Trial, making the Trial for its first one, or refuses it.
func (p *Plugin) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	refuse := func(why ...string) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
		err := &Refusal{Pod: podName(pod), Container: ctr.GetName(), Reasons: why}
		p.log().Warn("refused a container", "pod", podName(pod), "container", ctr.GetName(), "error", err)
		return nil, nil, err
	}
	if !p.ours(pod) {
		// An exempt namespace's pod never waits on the agent; one that
		// asks for a Trial there is refused rather than run unconfined.
		if p.exempt(pod) && claimOf(pod).any() {
			return refuse(fmt.Sprintf("it asks for a Trial (trialnet.io/ annotations) in namespace %s, which the plugin exempts (--exempt): no Trial is made there; run it in another namespace", pod.GetNamespace()))
		}
		return nil, nil, nil
	}
	cl := claimOf(pod)
	if why := cl.problems(); len(why) > 0 {
		return refuse(why...)
	}
	if why := refusals(ctr, p.protected(), p.ownMount); len(why) > 0 {
		return refuse(why...)
	}
	info, err := p.ensureTrial(ctx, pod, cl.profiles)
	if err != nil {
		return refuse(err.Error())
	}
	adj, err := p.adjust(ctr, info)
	if err != nil {
		return refuse(err.Error())
	}
	return adj, nil, nil
}

// ensureTrial returns the pod's Trial, made if it is not there yet.
func (p *Plugin) ensureTrial(ctx context.Context, pod *api.PodSandbox, profiles []string) (client.TrialInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := p.ctx(ctx)
	defer cancel()
	id := TrialID(pod)
	if p.unplaced[id] {
		return client.TrialInfo{}, fmt.Errorf("the pod was made while trialnet's NRI plugin was away, and another of its containers runs outside any Trial, on the pod network, sharing the pod's IPC namespace and volumes: delete and recreate the pod (and name %q in its required-plugins.noderesource.dev annotation)", Name)
	}
	if p.live == nil {
		p.live = map[string]bool{}
	}
	p.live[id] = true
	p.sweep(ctx)
	info, err := p.Agent.Get(ctx, id)
	if isCode(err, client.CodeUnknownTrial) {
		info, err = p.Agent.Create(ctx, trial.Request{ID: id, Profiles: profiles})
		switch {
		case isCode(err, client.CodeDuplicateID):
			info, err = p.Agent.Get(ctx, id) // made by another plugin instance meanwhile
		case err != nil:
			return info, fmt.Errorf("the agent could not make its Trial %s from profiles %s: %w", id, strings.Join(profiles, ","), err)
		default:
			p.log().Info("made a pod's Trial", "pod", podName(pod), "trial", id, "profiles", profiles)
		}
	}
	if err != nil {
		return info, fmt.Errorf("cannot ask trialnet's agent for its Trial %s (an annotated pod's containers wait for the agent; the kubelet retries): %w", id, err)
	}
	if !slices.Equal(info.Profiles, profiles) {
		return info, fmt.Errorf("its Trial %s was made from profiles %q, and the pod now asks for %q: a Trial's profiles do not change; recreate the pod", id, info.Profiles, profiles)
	}
	return info, nil
}

// adjust places the container in the Trial and has the hook check it.
func (p *Plugin) adjust(ctr *api.Container, info client.TrialInfo) (*api.ContainerAdjustment, error) {
	a := &api.ContainerAdjustment{}
	rel := "/" + strings.TrimPrefix(strings.TrimPrefix(info.Cgroup, p.cgroupMount()), "/")
	a.SetLinuxCgroupsPath(filepath.Join(rel, "ctr-"+ctr.GetId()))
	a.AddOrReplaceNamespace(&api.LinuxNamespace{Type: "network", Path: info.Netns})
	for _, kv := range trial.ProxyEnv(info.ProxyURL) {
		k, v, _ := strings.Cut(kv, "=")
		a.AddEnv(k, v)
	}
	pol, err := containerPolicy(ctr)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", ctr.GetName(), err)
	}
	if pol != nil {
		a.SetLinuxSeccompPolicy(pol)
	}
	if info.Transparent && p.ResolvConf != "" {
		a.AddMount(&api.Mount{Destination: resolvPath, Type: "bind", Source: p.ResolvConf,
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}})
	}
	args := []string{ocicmd.Name, "oci-hook"}
	if p.socket() != client.DefaultSocket {
		args = append(args, "--socket", p.socket())
	}
	a.AddHooks(&api.Hooks{CreateRuntime: []*api.Hook{{Path: p.HookPath, Args: args, Timeout: api.Int(30)}}})
	// The hook reads the claim from the container's annotations: this one
	// only, whatever a pass-through copied there from the pod.
	for k := range ctr.GetAnnotations() {
		if strings.HasPrefix(strings.ToLower(k), "trialnet.io/") && k != ocihook.AnnotationTrial {
			a.RemoveAnnotation(k)
		}
	}
	a.AddAnnotation(ocihook.AnnotationTrial, info.ID)
	return a, nil
}

// StopPodSandbox destroys the pod's Trial: its containers have stopped.
func (p *Plugin) StopPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	return p.destroy(ctx, pod)
}

// RemovePodSandbox destroys the pod's Trial if a stop did not.
func (p *Plugin) RemovePodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	return p.destroy(ctx, pod)
}

func (p *Plugin) destroy(ctx context.Context, pod *api.PodSandbox) error {
	if !p.ours(pod) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := p.ctx(ctx)
	defer cancel()
	id := TrialID(pod)
	_, err := p.Agent.Destroy(ctx, id)
	switch {
	case err == nil:
		p.log().Info("destroyed a pod's Trial", "pod", podName(pod), "trial", id)
	case isCode(err, client.CodeUnknownTrial):
		err = nil // never made, or destroyed by an earlier event
	default:
		// Still live for the sweep: the pod is gone, so the plugin's next
		// Synchronize destroys it.
		err = fmt.Errorf("destroy Trial %s of pod %s (the plugin's next start destroys it): %w", id, podName(pod), err)
		p.log().Error("a pod's Trial not destroyed", "error", err)
	}
	delete(p.live, id)
	delete(p.unplaced, id)
	return err
}

// Synchronize is the runtime's pods and containers as the plugin
// (re)connects: the plugin's Trials whose pod is not among them went
// while it was away, and are destroyed; the others are kept as they are.
// An annotated pod with a container running outside a Trial was made
// while it was away: its later containers are refused, since they would
// share the pod's IPC namespace and volumes with that one.
// The sweep runs after it returns: the runtime holds every container's
// creation while a plugin synchronizes, and the agent's own pod must not
// wait on the agent. Until the sweep has looked at every Trial, each
// container's creation tries it again.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live = map[string]bool{}
	byID := map[string]*api.PodSandbox{}
	for _, pod := range pods {
		if p.ours(pod) {
			p.live[TrialID(pod)] = true
			byID[pod.GetId()] = pod
		}
	}
	p.unplaced = map[string]bool{}
	for _, c := range ctrs {
		if pod := byID[c.GetPodSandboxId()]; pod != nil && c.GetState() != api.ContainerState_CONTAINER_STOPPED && inPodNetwork(pod, c) {
			p.unplaced[TrialID(pod)] = true
			p.log().Error("a Trial pod's container runs outside its Trial (made while the plugin was away); its later containers are refused: recreate the pod",
				"pod", podName(pod), "container", c.GetName())
		}
	}
	p.pending = true
	p.log().Info("synchronized", "pods", len(pods), "trials_of_pods", len(p.live), "pods_running_unplaced", len(p.unplaced))
	go func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		ctx, cancel := p.ctx(context.Background())
		defer cancel()
		p.sweep(ctx)
	}()
	return nil, nil
}

// inPodNetwork: container c is in its pod's network namespace or the
// node's, not a Trial's (the plugin's adjustment was not applied).
func inPodNetwork(pod *api.PodSandbox, c *api.Container) bool {
	podNet := ""
	for _, n := range pod.GetLinux().GetNamespaces() {
		if n.GetType() == "network" {
			podNet = n.GetPath()
		}
	}
	for _, n := range c.GetLinux().GetNamespaces() {
		if n.GetType() == "network" {
			return n.GetPath() == "" || n.GetPath() == podNet
		}
	}
	return true
}

// sweep destroys the plugin's Trials whose pod is not live, and clears
// pending once it could look at them all.
func (p *Plugin) sweep(ctx context.Context) {
	if !p.pending {
		return
	}
	trials, err := p.Agent.List(ctx)
	if err != nil {
		p.log().Error("cannot sweep the Trials of gone pods: the agent's list", "error", err)
		return
	}
	failed := false
	for _, t := range trials {
		if !strings.HasPrefix(t.ID, IDPrefix) || p.live[t.ID] {
			continue
		}
		if _, err := p.Agent.Destroy(ctx, t.ID); err != nil && !isCode(err, client.CodeUnknownTrial) {
			p.log().Error("cannot destroy the Trial of a gone pod", "trial", t.ID, "error", err)
			failed = true
			continue
		}
		p.log().Info("destroyed the Trial of a pod that went while the plugin was away", "trial", t.ID)
	}
	p.pending = failed
}

func isCode(err error, code string) bool {
	var e *client.Error
	return errors.As(err, &e) && e.Code == code
}
