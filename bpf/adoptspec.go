package bpf

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
)

// adoptSpec is what an adopting Load holds the pins to, taken from the
// embedded object when it was generated (adoptspec_gen.go, checked
// against the object by TestAdoptSpecMatchesObject): parsing the object
// at every start took 3 ms of CPU and 0.9 MB of allocations, for a few
// sizes, tags and bytes that only change with it.
type adoptSpec struct {
	object string              // sha256 of the embedded ELF
	maps   map[string]mapShape // the pinned maps, by name
	// tags are every program's tags as compiled, by name: the kernel's
	// sha-1 one (up to Linux 6.17) and its sha-256 one (since 6.18).
	tags map[string][2]string
	// rodata is the object's .rodata, in which trial_level (a uint32)
	// and parent_cgroup_id (a uint64) are set at levelAt and parentAt.
	rodata            []byte
	levelAt, parentAt int
}

// mapShape is what ebpf.MapSpec.Compatible compares a pinned map on.
type mapShape struct {
	typ                            ebpf.MapType
	keySize, valueSize, maxEntries uint32
	flags                          uint32
}

// compatible says how m differs from s, as ebpf.MapSpec.Compatible does.
func (s mapShape) compatible(m *ebpf.Map) error {
	var diffs []string
	if m.Type() != s.typ {
		diffs = append(diffs, fmt.Sprintf("Type: %s changed to %s", m.Type(), s.typ))
	}
	if m.KeySize() != s.keySize {
		diffs = append(diffs, fmt.Sprintf("KeySize: %d changed to %d", m.KeySize(), s.keySize))
	}
	if m.ValueSize() != s.valueSize {
		diffs = append(diffs, fmt.Sprintf("ValueSize: %d changed to %d", m.ValueSize(), s.valueSize))
	}
	if m.MaxEntries() != s.maxEntries {
		diffs = append(diffs, fmt.Sprintf("MaxEntries: %d changed to %d", m.MaxEntries(), s.maxEntries))
	}
	if m.Flags() != s.flags {
		diffs = append(diffs, fmt.Sprintf("Flags: %d changed to %d", m.Flags(), s.flags))
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%s: %w", strings.Join(diffs, ", "), ebpf.ErrMapIncompatible)
	}
	return nil
}

// rodataFor is the .rodata configuredSpec(level, parentID) loads.
func (s *adoptSpec) rodataFor(level int, parentID uint64) []byte {
	out := append([]byte(nil), s.rodata...)
	binary.NativeEndian.PutUint32(out[s.levelAt:], uint32(level+1))
	binary.NativeEndian.PutUint64(out[s.parentAt:], parentID)
	return out
}
