//go:build linux

package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/trialnet/trialnet/trial"
)

// Record is a Trial's state on disk: its description, and what the
// sandbox made of it.
type Record struct {
	Phase string     `json:"phase"` // PhaseCreating, then PhaseLive
	Trial trial.Spec `json:"trial"`
	// Proxy are its proxy endpoints (Host.Proxy when it was made), which
	// its policy entry allows.
	Proxy    []netip.AddrPort `json:"proxy,omitempty"`
	Cgroup   string           `json:"cgroup,omitempty"`
	CgroupID uint64           `json:"cgroup_id,omitempty"`
	Netns    string           `json:"netns,omitempty"`
	// Adopted: Cgroup and Netns are a container runtime's, made into a
	// Trial (Host.Adopt); the teardown removes neither.
	Adopted bool `json:"adopted,omitempty"`
}

// Record phases.
const (
	PhaseCreating = "creating" // written before anything is made
	PhaseLive     = "live"     // written once the Trial is whole
)

// diskRecord is a record as any build wrote it: Record, or the record of
// a build before trial.Spec (its schema 0), which kept the sandbox's part
// of the description in keys of its own and the agent's description,
// with the same keys as Spec, under "meta".
type diskRecord struct {
	Record
	Current *trial.Spec `json:"trial"`

	ID        string           `json:"id"`
	Meta      *trial.Spec      `json:"meta"`
	Strict    bool             `json:"strict"`
	UnixPaths []string         `json:"unix_paths"`
	UnixOpen  bool             `json:"unix_open"`
	Nested    bool             `json:"nested"`
	Pools     trial.PoolLimits `json:"pools"`
}

// decodeRecord reads a record of any build, refusing one of a newer
// schema than this build's (trial.Schema has the rule).
func decodeRecord(b []byte) (Record, error) {
	var d diskRecord
	if err := json.Unmarshal(b, &d); err != nil {
		return Record{}, err
	}
	rec := d.Record
	if d.Current != nil {
		rec.Trial = *d.Current
	} else {
		rec.Trial = d.schema0()
	}
	if err := rec.Trial.Upgrade(); err != nil {
		return Record{}, err
	}
	return rec, nil
}

// schema0 is the description in a record of a build before trial.Spec:
// the agent's, with what the sandbox enforced from the sandbox's keys.
func (d *diskRecord) schema0() trial.Spec {
	var s trial.Spec
	if d.Meta != nil {
		s = *d.Meta
	}
	s.ID, s.Strict, s.UnixAllow, s.UnixOpen, s.Nested = d.ID, d.Strict, d.UnixPaths, d.UnixOpen, d.Nested
	if d.Pools.MaxPids != 0 || d.Pools.MaxMemory != 0 {
		if s.Limits == nil {
			s.Limits = &trial.Limits{}
		}
		s.Limits.MaxPids, s.Limits.MaxMemory = d.Pools.MaxPids, d.Pools.MaxMemory
	}
	return s
}

func (h *Host) recordPath(id string) string { return filepath.Join(h.StateDir, id+".json") }

func (h *Host) readRecord(id string) (Record, error) {
	if h.StateDir == "" {
		return Record{}, errors.New("no state directory")
	}
	b, err := os.ReadFile(h.recordPath(id))
	var rec Record
	if err == nil {
		rec, err = decodeRecord(b)
	}
	if err == nil && rec.Trial.ID != id {
		err = fmt.Errorf("the record names Trial %q", rec.Trial.ID)
	}
	if err != nil {
		return rec, fmt.Errorf("unreadable state record: %w", err)
	}
	return rec, nil
}

// writeRecord replaces the record atomically; first refuses an id that
// already has one.
func (t *Trial) writeRecord(phase string, first bool) error {
	h := t.host
	if h.StateDir == "" {
		return nil
	}
	if err := os.MkdirAll(h.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	path := h.recordPath(t.ID)
	if first {
		if _, err := os.Lstat(path); err == nil {
			return fmt.Errorf("create Trial %s: a state record %s %w (a live Trial has this id, or a crashed one left it)", t.ID, path, ErrExists)
		}
	}
	rec := Record{Phase: phase, Trial: t.recorded, Proxy: t.proxy, Cgroup: t.Cgroup, CgroupID: t.CgroupID, Adopted: t.adopted}
	if t.Netns != nil {
		rec.Netns = t.Netns.Path
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write state record: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write state record: %w", err)
	}
	return nil
}

// SweepPartialRecords removes the new records an agent killed while
// writing them left unrenamed: the record each was to replace, or none,
// is whole. Only with no other agent at work in StateDir: one may be
// writing its own.
func (h *Host) SweepPartialRecords() {
	if h.StateDir == "" {
		return
	}
	left, _ := filepath.Glob(filepath.Join(h.StateDir, "*.json.tmp"))
	for _, f := range left {
		h.log().Warn("removing a state record an earlier agent did not finish writing", "file", f)
		_ = os.Remove(f)
	}
}

func (t *Trial) removeRecord() {
	if t.host.StateDir != "" {
		_ = os.Remove(t.host.recordPath(t.ID))
	}
}
