//go:build linux

package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/handover"
	"github.com/trialnet/trialnet/record"
)

// uidUnknown is the uid recorded for a change whose caller's credentials
// could not be read (an embedded agent's own caller, for one).
const uidUnknown = -1

// ChangeAllow changes a live Trial's allowlist on behalf of the caller
// ctx names (its uid, see WithCallerUID; uidUnknown if none). In this
// order: the new list is made (a refusal changes nothing), the Trial's
// stored description is rewritten (so a restarted agent re-adopts the
// new list), the change is logged as a policy-change record, and the
// proxy switches to the list, cutting tunnels if asked. Changes of one
// Trial are serialised.
func (a *Agent) ChangeAllow(ctx context.Context, id string, ch client.AllowChange) (client.AllowChanged, error) {
	uid := callerUID(ctx)
	leave, err := a.enter()
	if err != nil {
		return client.AllowChanged{}, err
	}
	defer leave()
	lt, err := a.lookup(id)
	if err != nil {
		return client.AllowChanged{}, err
	}
	if len(ch.Add) == 0 && len(ch.Remove) == 0 {
		return client.AllowChanged{}, errf(client.CodeBadRequest, "an allowlist change needs entries to add or remove")
	}
	add, err := allow.Parse(ch.Add, ch.RequireTLS)
	if err != nil {
		return client.AllowChanged{}, errf(client.CodeBadAllowlist, "%v", err)
	}
	var remove []allow.Entry
	for _, s := range ch.Remove {
		e, err := allow.ParseEntry(s)
		if err != nil {
			return client.AllowChanged{}, errf(client.CodeBadAllowlist, "%v", err)
		}
		remove = append(remove, e)
	}
	lt.policy.Lock()
	defer lt.policy.Unlock()
	cur, ok := a.proxy.Allow(id)
	if !ok {
		return client.AllowChanged{}, errf(client.CodeUnknownTrial, "no live Trial %q", id)
	}
	next, err := cur.Change(add.Entries(), remove)
	if err != nil {
		return client.AllowChanged{}, errf(client.CodeBadAllowlist, "Trial %s: %v", id, err)
	}
	info := a.info(lt)
	info.Allow = config.AllowEntries(next)
	info.Denied = denied(info.Denied, allow.Strings(add.Entries()), allow.Strings(remove))
	if err := lt.tr.SetSpec(info.Spec); err != nil {
		return client.AllowChanged{}, errf(client.CodeInternal, "store the allowlist of %s: %v", id, err)
	}
	a.mu.Lock()
	lt.info.Allow, lt.info.Denied = info.Allow, info.Denied
	a.mu.Unlock()
	pc := &record.PolicyChange{UID: uid, Added: allow.Strings(add.Entries()), Removed: allow.Strings(remove), Cut: ch.Cut}
	// Logged before it applies: every decision made under the new list
	// follows it in the log.
	a.record(&record.Event{Schema: record.PolicyChangeSchema, ID: rand.Text(), Time: time.Now(), Trial: id,
		Decision: record.DecisionPolicyChange, Learning: info.Learning, Detail: describe(pc), PolicyChange: pc}, nil)
	var cut []allow.Entry
	if ch.Cut {
		cut = remove
	}
	n, err := a.proxy.SetAllow(id, next, cut)
	if err != nil {
		return client.AllowChanged{}, errf(client.CodeUnknownTrial, "%v", err)
	}
	pn, unconfirmed := a.allowOnPredecessor(ctx, id, next, cut)
	n += pn
	a.log.Info("allowlist changed", "trial", id, "uid", uid, "added", pc.Added, "removed", pc.Removed, "tunnels_cut", n)
	res := client.AllowChanged{Trial: info, TunnelsCut: n, Note: unconfirmed}
	if info.Learning && len(remove) > 0 {
		res.Note = strings.TrimPrefix(res.Note+"; this Trial is learning: names off its allowlist, the removed ones included, are still let through and recorded as would_deny", "; ")
	}
	return res, nil
}

// allowOnPredecessor applies Trial id's new allowlist, and the cut of
// the entries in cut, in the agent this one took over from: it may still
// serve tunnels and requests of the Trial. It returns how many it cut
// there, and a note for the caller when it did not confirm the change
// and may still serve them by the old list.
func (a *Agent) allowOnPredecessor(ctx context.Context, id string, list *allow.List, cut []allow.Entry) (int, string) {
	p := a.pred.Load()
	if p == nil {
		return 0, ""
	}
	var raw json.RawMessage
	if entries := config.AllowEntries(list); len(entries) > 0 {
		raw, _ = json.Marshal(entries) // strings and bools: it cannot fail
	}
	n, why, ok := p.Allow(ctx, id, raw, allow.Strings(cut))
	if ok {
		return n, ""
	}
	if p.State() == handover.StateDrained {
		// It drained meanwhile: it ended every tunnel and request of the
		// Trial itself, so none follows the old list.
		return 0, ""
	}
	a.log.Warn("allowlist change not confirmed by the draining agent", "trial", id, "pid", p.PID(), "error", why)
	return 0, fmt.Sprintf("the agent this one took over from (pid %d), which still drains, did not confirm the change: its open tunnels may follow the old allowlist until they end (at most its drain_timeout)", p.PID())
}

// denied is the Trial's list of entries removed with deny after a change
// that added added and removed removed.
func denied(cur, added, removed []string) []string {
	var out []string
	for _, e := range cur {
		if !slices.Contains(added, e) && !slices.Contains(removed, e) {
			out = append(out, e)
		}
	}
	return append(out, removed...)
}

// peerKey keys the control API caller's connection in a request's
// context; peerUIDKey its uid.
type (
	peerKey    struct{}
	peerUIDKey struct{}
)

// withPeer is the control server's ConnContext: it keeps the connection,
// whose peer owns the Trials it asks for owned, and reads the uid of the
// process at the other end of the unix socket (SO_PEERCRED) once, for the
// records of what that caller changed.
func withPeer(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	ctx = context.WithValue(ctx, peerKey{}, uc)
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return ctx
	}
	return context.WithValue(ctx, peerUIDKey{}, int64(cred.Uid))
}

// callerConn is the connection withPeer kept, or nil.
func callerConn(ctx context.Context) *net.UnixConn {
	c, _ := ctx.Value(peerKey{}).(*net.UnixConn)
	return c
}

// WithCallerUID names the caller of an in-process call by its uid, as
// the control server names a remote caller by its credentials: the
// records of what it changes carry it.
func WithCallerUID(ctx context.Context, uid int64) context.Context {
	return context.WithValue(ctx, peerUIDKey{}, uid)
}

// callerUID is the uid withPeer or WithCallerUID set, or uidUnknown.
func callerUID(ctx context.Context) int64 {
	if uid, ok := ctx.Value(peerUIDKey{}).(int64); ok {
		return uid
	}
	return uidUnknown
}

// describe is a policy change in words, for the record's detail.
func describe(pc *record.PolicyChange) string {
	var parts []string
	if len(pc.Added) > 0 {
		parts = append(parts, "added "+strings.Join(pc.Added, ","))
	}
	if len(pc.Removed) > 0 {
		parts = append(parts, "removed "+strings.Join(pc.Removed, ","))
	}
	cut := ""
	if pc.Cut {
		cut = ", open tunnels to removed entries cut"
	}
	return fmt.Sprintf("allowlist changed by uid %d: %s%s", pc.UID, strings.Join(parts, "; "), cut)
}
