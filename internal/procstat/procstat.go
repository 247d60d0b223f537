// Package procstat reads what /proc/PID/stat says of a process that the
// agent and the ledger both need: its start time, which with its pid
// names it beyond pid reuse.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// StartTime is when process pid started, in clock ticks since boot
// (/proc/PID/stat field 22).
func StartTime(pid int) (uint64, error) {
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
