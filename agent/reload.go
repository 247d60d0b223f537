//go:build linux

package agent

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

// proxySettings are what the proxy serves new Trials with under file
// (nil: none) and the agent's own settings.
func (a *Agent) proxySettings(file *config.File) (config.ProxySettings, error) {
	if file != nil {
		if err := sandbox.CheckMaxProcs(file.Limits.MaxProcesses); err != nil {
			return config.ProxySettings{}, fmt.Errorf("limits: max_processes: %w", err)
		}
	}
	return file.ProxySettings(a.cfg.AllowCIDRs, a.cfg.Resolvers, a.cfg.Resolver)
}

// reprofiled is one live Trial's new allowlist, ready to apply.
type reprofiled struct {
	lt       *trial
	old, new client.TrialInfo
	allow    *allow.List
}

// Reload reads the config file again and applies it whole or not at all:
// an unreadable or invalid file, changed paths, or (with Reprofile) a live
// Trial's profile missing from the new file change nothing, and the error
// says why. Profiles, resolvers, allowed CIDRs, limits and retention
// apply to Trials created afterwards; live Trials keep the policy they
// were created with unless Reprofile is set.
func (a *Agent) Reload(ctx context.Context, req client.ReloadRequest) (client.ReloadResult, error) {
	leave, err := a.enter()
	if err != nil {
		return client.ReloadResult{}, err
	}
	defer leave()
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	path := a.cfg.ConfigPath
	if path == "" {
		return client.ReloadResult{}, errf(client.CodeBadRequest, "this agent was started without --config: there is no file to reload")
	}
	read := path
	if a.cfg.TrustConfig != nil {
		if read, err = a.cfg.TrustConfig(path); err != nil {
			return client.ReloadResult{}, errf(client.CodeBadConfig, "reload refused, nothing changed: %s: %v", path, err)
		}
	}
	f, err := config.LoadFile(read)
	if err != nil {
		return client.ReloadResult{}, errf(client.CodeBadConfig, "reload refused, nothing changed: %v", err)
	}
	if err := samePaths(a.file.Load(), f); err != nil {
		return client.ReloadResult{}, errf(client.CodeBadConfig, "reload refused, nothing changed: %s: %v", path, err)
	}
	set, err := a.proxySettings(f)
	if err != nil {
		return client.ReloadResult{}, errf(client.CodeBadConfig, "reload refused, nothing changed: %s: %v", path, err)
	}
	var plan []reprofiled
	if req.Reprofile {
		var unlock func()
		plan, unlock, err = a.planReprofile(f)
		if err != nil {
			return client.ReloadResult{}, errf(client.CodeBadConfig, "reload refused, nothing changed: %s: %v", path, err)
		}
		defer unlock() // no allow/deny between the plan and the swap
	}
	// The one step that can fail: the Trials' records. Undone on failure.
	for i := range plan {
		if err := a.writeInfo(&plan[i], plan[i].new); err != nil {
			for j := range i {
				if uerr := a.writeInfo(&plan[j], plan[j].old); uerr != nil {
					a.log.Error("reload: restore a Trial's record", "trial", plan[j].new.ID, "error", uerr)
				}
			}
			return client.ReloadResult{}, errf(client.CodeInternal, "reload refused, nothing changed: record of Trial %s: %v", plan[i].new.ID, err)
		}
	}
	a.proxy.Reconfigure(set)
	a.file.Store(f)
	res := client.ReloadResult{Config: path, Profiles: f.ProfileNames(), Reprofiled: []string{}}
	for _, r := range plan {
		if _, err := a.proxy.SetAllow(r.new.ID, r.allow, nil); err != nil {
			continue // destroyed meanwhile
		}
		res.Reprofiled = append(res.Reprofiled, r.new.ID)
		a.recordReprofile(r)
		// A draining predecessor decides what it still reads (a request
		// head, a forwarded request) by the new list too.
		if _, note := a.allowOnPredecessor(ctx, r.new.ID, r.allow, nil); note != "" {
			res.Note = note
		}
	}
	a.ret.soon()    // the retention rule may have changed
	a.shells.kick() // and the number of shells to keep
	a.log.Info("config reloaded", "config", path, "profiles", len(res.Profiles), "reprofiled", len(res.Reprofiled))
	return res, nil
}

// samePaths refuses a file whose paths differ from the running agent's:
// they name what the agent holds open (socket, pins, state), so moving
// them takes a restart.
func samePaths(old, new *config.File) error {
	var o, n config.Paths
	if old != nil {
		o = old.Paths
	}
	if new != nil {
		n = new.Paths
	}
	if o != n {
		return fmt.Errorf("paths cannot change on reload (running with %+v, the file says %+v): restart the agent to move them", o, n)
	}
	return nil
}

// planReprofile computes the new allowlist of every live Trial made from
// profiles: the profiles' entries from f, plus the Trial's explicit ones.
func (a *Agent) planReprofile(f *config.File) (_ []reprofiled, unlock func(), err error) {
	a.mu.Lock()
	var lts []*trial
	for _, lt := range a.trials {
		if lt.state == stateLive && len(lt.info.Profiles) > 0 {
			lts = append(lts, lt)
		}
	}
	a.mu.Unlock()
	// Each Trial's allow/deny waits until the reload is done (in id
	// order, as any taker of several of these locks must).
	slices.SortFunc(lts, func(x, y *trial) int { return strings.Compare(x.info.ID, y.info.ID) })
	for _, lt := range lts {
		lt.policy.Lock()
	}
	unlockAll := func() {
		for _, lt := range lts {
			lt.policy.Unlock()
		}
	}
	defer func() {
		if err != nil {
			unlockAll()
		}
	}()
	var plan []reprofiled
	for _, lt := range lts {
		a.mu.Lock()
		old := lt.info
		a.mu.Unlock()
		fromProfiles, err := f.Allowlist(old.Profiles, nil, false)
		if err != nil {
			return nil, nil, fmt.Errorf("live Trial %s: %w", old.ID, err)
		}
		explicit, err := parseEntries(old.Allow, func(e trialspec.AllowEntry) bool { return e.Profile == "" })
		if err != nil {
			return nil, nil, fmt.Errorf("live Trial %s: %w", old.ID, err)
		}
		var kept []allow.Entry
		for _, e := range fromProfiles.Entries() {
			if !slices.Contains(old.Denied, e.String()) {
				kept = append(kept, e)
			}
		}
		allow := allow.New(append(kept, explicit...)...)
		nw := old
		nw.Allow = config.AllowEntries(allow)
		plan = append(plan, reprofiled{lt: lt, old: old, new: nw, allow: allow})
	}
	return plan, unlockAll, nil
}

// recordReprofile logs a reprofiled Trial's new allowlist as a policy
// change (uid -1: the agent's own reload), so that its audit shows the
// list every later decision was made under.
func (a *Agent) recordReprofile(r reprofiled) {
	var was, is []string
	for _, e := range r.old.Allow {
		was = append(was, e.Entry)
	}
	for _, e := range r.new.Allow {
		is = append(is, e.Entry)
	}
	pc := &record.PolicyChange{UID: -1}
	for _, e := range is {
		if !slices.Contains(was, e) {
			pc.Added = append(pc.Added, e)
		}
	}
	for _, e := range was {
		if !slices.Contains(is, e) {
			pc.Removed = append(pc.Removed, e)
		}
	}
	a.record(&record.Event{Schema: record.PolicyChangeSchema, ID: rand.Text(), Time: time.Now(), Trial: r.new.ID,
		Decision: record.DecisionPolicyChange, Learning: r.new.Learning, Detail: "reload --reprofile: " + describe(pc), PolicyChange: pc}, nil)
}

// parseEntries parses a Trial's stored entries that keep says to keep
// (nil: all).
func parseEntries(list []trialspec.AllowEntry, keep func(trialspec.AllowEntry) bool) ([]allow.Entry, error) {
	var out []allow.Entry
	for _, e := range list {
		if keep != nil && !keep(e) {
			continue
		}
		pe, err := allow.ParseEntry(e.Entry)
		if err != nil {
			return nil, err
		}
		pe.RequireTLS, pe.Profile = e.RequireTLS, e.Profile
		out = append(out, pe)
	}
	return out, nil
}

// writeInfo writes the allowlist of info (r's new or previous
// description) to the Trial's record and its description in memory,
// under a.mu so that a destroy cannot remove the record in between and
// have it written back. Only the allowlist: the rest of the description,
// which a reprofile does not change, is read without a.mu (trial.info).
// A Trial destroyed meanwhile is skipped.
func (a *Agent) writeInfo(r *reprofiled, info client.TrialInfo) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.lt.state != stateLive {
		return nil
	}
	spec := r.lt.info.Spec
	spec.Allow = info.Allow
	if err := r.lt.tr.SetSpec(spec); err != nil {
		return err
	}
	r.lt.info.Allow = info.Allow
	return nil
}
