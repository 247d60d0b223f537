//go:build linux

// Package cgroup2 finds the cgroup v2 hierarchy from mountinfo: the
// sandbox, which makes Trials' cgroups, and the OCI hook, which checks a
// container's, read it the same way (on hybrid hosts it is not
// /sys/fs/cgroup).
package cgroup2

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
)

// Mount is where the cgroup2 hierarchy is mounted, from
// /proc/self/mountinfo.
func Mount() (string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	return parseMount(b)
}

// cached is the first mount Cached found.
var cached atomic.Pointer[string]

// Cached is Mount's answer, found once per process: a long-lived agent
// would otherwise read the host's whole mountinfo (hundreds of lines on
// a busy host) for each container it adopts. Its Trial parent, a path
// under this mount, is fixed when it starts, so the mount can be too. A
// failure is not kept: the next call reads again.
func Cached() (string, error) {
	if m := cached.Load(); m != nil {
		return *m, nil
	}
	m, err := Mount()
	if err == nil {
		cached.Store(&m)
	}
	return m, err
}

func parseMount(mountinfo []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields := strings.Fields(pre)
		if len(fields) < 5 || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		return UnescapeMountPath(fields[4]), nil
	}
	return "", errors.New("no cgroup2 file system is mounted (trialnet needs the unified hierarchy; mount it with 'mount -t cgroup2 none /sys/fs/cgroup/unified')")
}

// UnescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func UnescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
