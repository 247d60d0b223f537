//go:build linux

package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"

	"github.com/cilium/ebpf/link"
)

// NetnsScan lists the processes with a task in a network namespace with
// one read of a task iterator (netnsscan.bpf.c), where a walk of /proc
// stats every task's namespace file. It lives in the process that loads
// it and is not pinned: it enforces nothing, so nothing needs it after
// that process, and an agent's restart loads it again. One scan runs at a
// time: the namespace scanned for is the iterator's one map entry.
type NetnsScan struct {
	mu   sync.Mutex
	objs netnsscanObjects
	link *link.Iter
}

// OpenNetnsScan loads and attaches the iterator. The tgids it reads are
// the kernel's (the initial PID namespace's): it refuses to load in
// another PID namespace, where /proc names processes otherwise.
func OpenNetnsScan() (_ *NetnsScan, err error) {
	if nested, err := nestedPidns(); err != nil || nested {
		if err == nil {
			err = fmt.Errorf("this process is in a nested PID namespace, whose pids the kernel's tgids are not")
		}
		return nil, fmt.Errorf("load the network namespace scan: %w", err)
	}
	s := &NetnsScan{}
	if err := loadNetnsscanObjects(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("load the network namespace scan (a task iterator, Linux 5.8+, with BTF): %w", err)
	}
	defer func() {
		if err != nil {
			_ = s.objs.Close()
		}
	}()
	if s.link, err = link.AttachIter(link.IterOptions{Program: s.objs.NetnsTasks}); err != nil {
		return nil, fmt.Errorf("attach the network namespace scan's task iterator: %w", err)
	}
	return s, nil
}

// nestedPidns says whether this process is outside the initial PID
// namespace: its NSpid line in /proc/self/status names it in more than
// one.
func nestedPidns() (bool, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, err
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("NSpid:")); ok {
			return len(bytes.Fields(v)) != 1, nil
		}
	}
	return false, fmt.Errorf("/proc/self/status has no NSpid line")
}

// Pids are the processes (tgids, each once) with a task in the network
// namespace whose nsfs inode number is inum.
func (s *NetnsScan) Pids(inum uint32) ([]int, error) {
	if inum == 0 {
		return nil, fmt.Errorf("scan network namespace 0: no namespace has that inode number")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	zero := uint32(0)
	if err := s.objs.NetnsTarget.Put(zero, inum); err != nil {
		return nil, fmt.Errorf("set the network namespace scan's target: %w", err)
	}
	r, err := s.link.Open()
	if err != nil {
		return nil, fmt.Errorf("open the network namespace scan's task iterator: %w", err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read the network namespace scan's task iterator: %w", err)
	}
	var out []int
	for ; len(b) >= 4; b = b[4:] {
		out = append(out, int(binary.NativeEndian.Uint32(b)))
	}
	// The iterator visits tasks by thread id: a process's threads may be
	// anywhere in that order.
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Close detaches and unloads the iterator.
func (s *NetnsScan) Close() error {
	return errors.Join(s.link.Close(), s.objs.Close())
}
