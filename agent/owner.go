//go:build linux

package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Owner names a process beyond pid reuse: its pid and its start time (in
// clock ticks since boot, /proc/PID/stat field 22).
type Owner struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

func self() *Owner {
	o := &Owner{PID: os.Getpid()}
	o.Start, _ = startTime(o.PID)
	return o
}

// ownerAlive reports whether the Trial whose description is meta has an
// owner that still runs.
func ownerAlive(meta json.RawMessage) bool {
	var info TrialInfo
	if json.Unmarshal(meta, &info) != nil || info.Owner == nil {
		return false
	}
	start, err := startTime(info.Owner.PID)
	return err == nil && start == info.Owner.Start
}

func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parentheses: fields count from
	// the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}
