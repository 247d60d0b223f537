//go:build linux

package ocihook

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// BenchmarkReadConfig is the hook's read of a bundle's config.json: a
// small bundle's (test/containers' benchmark: the least seccomp profile
// that keeps the key calls out) and one with a seccomp profile of
// podman's size (about 20 kB, 300 calls named).
func BenchmarkReadConfig(b *testing.B) {
	caps := []string{"CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_AUDIT_WRITE"}
	cfg := func(seccomp map[string]any) map[string]any {
		return map[string]any{
			"ociVersion": "1.0.2",
			"process": map[string]any{
				"user": map[string]int{"uid": 0, "gid": 0}, "cwd": "/", "args": []string{"sh", "-c", "true"}, "env": []string{"PATH=/bin"},
				"capabilities": map[string][]string{"bounding": caps, "effective": caps, "permitted": caps}, "noNewPrivileges": true,
			},
			"root": map[string]any{"path": "/rootfs", "readonly": true},
			"mounts": []map[string]any{
				{"destination": "/proc", "type": "proc", "source": "proc"},
				{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
				{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
				{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev"}},
			},
			"linux": map[string]any{
				"namespaces":    []map[string]string{{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}, {"type": "cgroup"}, {"type": "network"}},
				"cgroupsPath":   "/trialnet/c1",
				"readonlyPaths": []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
				"maskedPaths":   []string{"/proc/kcore", "/proc/keys", "/sys/firmware"},
				"seccomp":       seccomp,
			},
			"annotations": map[string]string{AnnotationProfile: "default"},
		}
	}
	large := ContainerProfile(runtime.GOARCH)
	var names []string
	for i := range 300 {
		names = append(names, fmt.Sprintf("syscall_%d", i))
	}
	large["syscalls"] = append(large["syscalls"].([]any), map[string]any{"names": names, "action": "SCMP_ACT_ALLOW"})
	for _, c := range []struct {
		name string
		cfg  map[string]any
	}{{"small", cfg(ContainerProfile(runtime.GOARCH))}, {"podman-size", cfg(large)}} {
		dir := b.TempDir()
		doc, err := json.MarshalIndent(c.cfg, "", "  ")
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.json"), doc, 0o644); err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				if _, err := readConfig(dir); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
