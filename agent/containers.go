//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// maxContainerField bounds each string of a client.Container: the
// record is kept on disk for the Trial's life, its fields are the
// runtime's names.
const maxContainerField = 1024

// AddContainer records a container that trialnet oci-hook let into a
// live Trial, so that its layers say whose process boundary holds it.
// With a data directory the record is a line of
// <data_dir>/<id>/containers.jsonl, which a restarted or succeeding
// agent reads as it is; without one, the count lives with the Trial.
func (a *Agent) AddContainer(_ context.Context, id string, c client.Container) (client.TrialInfo, error) {
	leave, err := a.enter()
	if err != nil {
		return client.TrialInfo{}, err
	}
	defer leave()
	lt, err := a.lookup(id)
	if err != nil {
		return client.TrialInfo{}, err
	}
	if err := checkContainer(c); err != nil {
		return client.TrialInfo{}, errf(client.CodeBadRequest, "container of Trial %s: %v", id, err)
	}
	if err := lt.tr.BoundContainerPools(c.PID); err != nil {
		return client.TrialInfo{}, errf(client.CodeInternal, "container %s of Trial %s: %v", c.ID, id, err)
	}
	if err := a.keepContainer(lt, id, c); err != nil {
		return client.TrialInfo{}, errf(client.CodeInternal, "record container %s of %s: %v", c.ID, id, err)
	}
	a.log.Info("container joined trial", "trial", id, "container", c.ID, "pid", c.PID, "seccomp", c.Seccomp, "user_namespace", c.UserNamespace)
	a.watchContainer(lt, c)
	return a.info(lt), nil
}

// watchContainer moves container c of lt to its ended ones when c's
// init exits, as the hook's poststop does, so that a runtime that skips
// poststop leaves no container listed live. It is this process's watch:
// an agent that takes over leaves the containers then live to poststop.
func (a *Agent) watchContainer(lt *trial, c client.Container) {
	if a.cfg.DataDir == "" || a.closed.Load() {
		return
	}
	fd, err := unix.PidfdOpen(c.PID, 0)
	if err != nil {
		a.log.Warn("cannot watch a container's init: its end is seen at poststop only", "trial", lt.info.ID, "container", c.ID, "pid", c.PID, "error", err)
		return
	}
	pf := pidFile(fd)
	lt.mu.Lock()
	lt.joined = append(lt.joined, pf)
	lt.mu.Unlock()
	a.owners.Add(1)
	go func() {
		defer a.owners.Done()
		rc, err := pf.SyscallConn()
		if err == nil {
			err = rc.Read(func(fd uintptr) bool { return exited(int(fd)) })
		}
		lt.mu.Lock()
		watched := slices.Contains(lt.joined, pf)
		lt.mu.Unlock()
		if err != nil || !watched || a.closed.Load() {
			return // dropped: the Trial ended, or this agent stops
		}
		if err := a.endContainer(lt, c.ID); err != nil {
			a.log.Error("move an ended container to the ended ones", "trial", lt.info.ID, "container", c.ID, "error", err)
			return
		}
		a.log.Info("container left trial", "trial", lt.info.ID, "container", c.ID, "pid", c.PID)
	}()
}

// dropJoined stops watching the containers that joined lt.
func (lt *trial) dropJoined() {
	lt.mu.Lock()
	joined := lt.joined
	lt.joined = nil
	lt.mu.Unlock()
	for _, pf := range joined {
		_ = pf.Close()
	}
}

// keepContainer appends c to lt's record, or counts it without one.
func (a *Agent) keepContainer(lt *trial, id string, c client.Container) error {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if a.cfg.DataDir == "" {
		lt.containers++
		return nil
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(a.containersFile(id), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func checkContainer(c client.Container) error {
	if c.ID == "" || c.PID <= 0 {
		return fmt.Errorf("needs an id and a pid (got %q, %d)", c.ID, c.PID)
	}
	for _, s := range append([]string{c.ID, c.Bundle}, c.Capabilities...) {
		if len(s) > maxContainerField || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			return fmt.Errorf("a field longer than %d bytes or not printable: %q", maxContainerField, s)
		}
	}
	return nil
}

func (a *Agent) containersFile(id string) string {
	return filepath.Join(a.cfg.DataDir, id, "containers.jsonl")
}

// containers is how many containers joined lt, live or ended: the lines
// of its records when there is a data directory (which outlives this
// process), else this process's count. Under lt.mu, as endContainer
// moves a line from one file to the other; a line in both (an agent
// stopped between the two writes) is one container.
func (a *Agent) containers(lt *trial, id string) int {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if a.cfg.DataDir == "" {
		return lt.containers
	}
	ended := map[string]bool{}
	n := 0
	if b, err := os.ReadFile(a.endedFile(id)); err == nil {
		for line := range bytes.Lines(b) {
			if bytes.HasSuffix(line, []byte{'\n'}) { // a whole record
				ended[string(line)] = true
				n++
			}
		}
	}
	if b, err := os.ReadFile(a.containersFile(id)); err == nil {
		for line := range bytes.Lines(b) {
			if bytes.HasSuffix(line, []byte{'\n'}) && !ended[string(line)] {
				n++
			}
		}
	}
	return n
}

// ContainerTrial makes a Trial from a profile around a container that
// trialnet oci-hook holds at its createRuntime stage: the container's own
// network namespace and cgroup become the Trial's (sandbox Host.Adopt
// says what it takes of them and what it refuses). The Trial is owned by
// the container's init process, so the agent destroys it when that
// exits (or at EndContainer, the hook's poststop), with its receipt.
func (a *Agent) ContainerTrial(_ context.Context, req client.ContainerTrial) (_ client.TrialInfo, err error) {
	leave, err := a.enter()
	if err != nil {
		return client.TrialInfo{}, err
	}
	defer leave()
	c := req.Container
	if err := checkContainer(c); err != nil {
		return client.TrialInfo{}, errf(client.CodeBadRequest, "container: %v", err)
	}
	if req.Profile == "" {
		return client.TrialInfo{}, errf(client.CodeBadRequest, "container %s: a Trial around a container needs a profile", c.ID)
	}
	a.adopts.Store(true)
	// A cgroup prepared for it is this call's from here: adopted, or
	// dropped with a failure.
	p := a.pend.take(c.ID)
	if p == nil {
		if cgid, err := initCgroupID(c.PID); err == nil {
			p = a.pend.takeCgroup(cgid)
		}
	}
	var prepared uint64
	if p != nil {
		prepared = p.cgid
		defer func() {
			if err != nil {
				a.removePending(p, "its hook's adoption failed")
				return
			}
			p.timer.Stop()
			if p.caller != nil {
				_ = p.caller.Close()
			}
		}()
		if p.profile != req.Profile {
			return client.TrialInfo{}, errf(client.CodeBadRequest, "container %s was prepared with profile %s, and its hook asks for %s", c.ID, p.profile, req.Profile)
		}
	}
	pidfd, err := unix.PidfdOpen(c.PID, 0)
	if err != nil {
		return client.TrialInfo{}, errf(client.CodeBadRequest, "container %s: its process %d: %v", c.ID, c.PID, err)
	}
	owner, err := pidfdOwner(pidfd)
	if err != nil {
		_ = unix.Close(pidfd)
		return client.TrialInfo{}, errf(client.CodeBadRequest, "container %s: its process %d: %v", c.ID, c.PID, err)
	}
	pf := pidFile(pidfd)
	lt, list, err := a.newTrial(trialspec.Request{ID: containerTrialID(c.ID), Profiles: []string{req.Profile}}, nil)
	if err != nil {
		_ = pf.Close()
		return client.TrialInfo{}, err
	}
	a.dropOwner(lt) // an ephemeral agent's own: this one is the container's
	a.mu.Lock()
	lt.owner = pf
	a.mu.Unlock()
	lt.info.Owner, lt.info.Container = owner, c.ID
	if l := lt.info.Limits; l != nil {
		nl := *l
		nl.PoolLimits = trialspec.PoolLimits{} // the runtime's (Host.Adopt)
		lt.info.Limits = &nl
	}
	err = a.build(lt, list, func(spec trialspec.Spec, ep sandbox.Endpoint) (*sandbox.Trial, error) {
		return a.host.Adopt(spec, ep, sandbox.Container{PID: c.PID, Pidfd: pf, Prepared: prepared})
	})
	if err != nil {
		return client.TrialInfo{}, err
	}
	if err := a.keepContainer(lt, lt.info.ID, c); err != nil {
		a.log.Error("record the container of its Trial", "trial", lt.info.ID, "container", c.ID, "error", err)
	}
	a.setState(lt, stateLive)
	a.watchOwner(lt)
	a.log.Info("trial created around a container", "trial", lt.info.ID, "container", c.ID, "pid", c.PID, "profile", req.Profile, "prepared", p != nil)
	return a.withDirs(a.info(lt)), nil
}

// containerTrialID is the id of the Trial made around container cid:
// cid itself, lower case and cut to an id's length, where that is a
// valid id (a podman or Docker id's first 63 hex digits); else a new one.
func containerTrialID(cid string) string {
	id := strings.ToLower(cid)
	if len(id) > 63 {
		id = id[:63]
	}
	if sandbox.ValidID(id) != nil {
		return NewID()
	}
	return id
}

// EndContainer is told that container cid ended (trialnet oci-hook at
// poststop). A Trial made around it is destroyed, once its init process
// is seen gone, as trialnet destroy would (receipt, final stats); a
// Trial it joined lives on and moves its record to the ended ones. A
// container no live Trial knows is not an error: the agent may have
// seen it end first.
func (a *Agent) EndContainer(ctx context.Context, cid string) (client.ContainerEnd, error) {
	leave, err := a.enter()
	if err != nil {
		return client.ContainerEnd{}, err
	}
	made, joined := a.containerTrials(cid)
	leave()
	if made != nil {
		if err := a.containerGone(made); err != nil {
			return client.ContainerEnd{}, err
		}
		st, err := a.Destroy(ctx, made.info.ID)
		var e *client.Error
		if errors.As(err, &e) && e.Code == client.CodeUnknownTrial {
			return client.ContainerEnd{Trial: made.info.ID, Destroyed: true}, nil
		}
		if err != nil {
			return client.ContainerEnd{}, err
		}
		return client.ContainerEnd{Trial: made.info.ID, Destroyed: true, Stats: &st}, nil
	}
	var end client.ContainerEnd
	for _, lt := range joined {
		if err := a.endContainer(lt, cid); err != nil {
			return end, errf(client.CodeInternal, "container %s of Trial %s: %v", cid, lt.info.ID, err)
		}
		end.Trial = lt.info.ID
		a.log.Info("container left trial", "trial", lt.info.ID, "container", cid)
	}
	return end, nil
}

// containerTrials are the live Trial made around container cid, and the
// live Trials it joined.
func (a *Agent) containerTrials(cid string) (made *trial, joined []*trial) {
	a.mu.Lock()
	var lts []*trial
	for _, lt := range a.trials {
		if lt.state == stateLive {
			lts = append(lts, lt)
		}
	}
	a.mu.Unlock()
	for _, lt := range lts {
		switch {
		case lt.info.Container == cid:
			made = lt
		case a.hasContainer(lt, cid):
			joined = append(joined, lt)
		}
	}
	return made, joined
}

// containerGone refuses to end a container Trial whose container's init
// still runs: a poststop call for another runtime's container of the
// same id must not end it.
func (a *Agent) containerGone(lt *trial) error {
	a.mu.Lock()
	pidfd := lt.owner
	a.mu.Unlock()
	if pidfd != nil && !pidfdExited(pidfd) {
		return errf(client.CodeBadRequest, "container %s of Trial %s still runs (pid %d): its Trial ends when it does", lt.info.Container, lt.info.ID, ownerPID(lt.info.Owner))
	}
	return nil
}

// pidfdExited reports whether a pidfd on Go's poller has exited.
func pidfdExited(pidfd *os.File) bool {
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return true
	}
	gone := true
	_ = rc.Control(func(fd uintptr) { gone = exited(int(fd)) })
	return gone
}

func (a *Agent) endedFile(id string) string {
	return filepath.Join(a.cfg.DataDir, id, "containers-ended.jsonl")
}

// hasContainer: container cid is among lt's live containers.
func (a *Agent) hasContainer(lt *trial, cid string) bool {
	if a.cfg.DataDir == "" {
		return false
	}
	lines, _ := containerLines(a.containersFile(lt.info.ID))
	for _, l := range lines {
		if l.c.ID == cid {
			return true
		}
	}
	return false
}

// endContainer moves container cid's record in lt from its live
// containers to its ended ones, which its layers still count: the
// receipt says every container that ran in the Trial.
func (a *Agent) endContainer(lt *trial, cid string) error {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	path := a.containersFile(lt.info.ID)
	lines, err := containerLines(path)
	if err != nil {
		return err
	}
	var keep, ended []byte
	for _, l := range lines {
		if l.c.ID == cid {
			ended = append(ended, l.raw...)
		} else {
			keep = append(keep, l.raw...)
		}
	}
	if len(ended) == 0 {
		return nil
	}
	f, err := os.OpenFile(a.endedFile(lt.info.ID), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(ended)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, keep, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

type containerLine struct {
	c   client.Container
	raw []byte // with its newline
}

// containerLines reads a containers file; a line that does not read is
// kept as it is, under no id.
func containerLines(path string) ([]containerLine, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []containerLine
	for line := range bytes.Lines(b) {
		var l containerLine
		l.raw = line
		_ = json.Unmarshal(line, &l.c)
		out = append(out, l)
	}
	return out, nil
}
