//go:build linux

package ocihook

import (
	"errors"
	"strings"
	"testing"
)

// A container in a Trial may bind its own runtime data (podman's and
// CRI-O's userdata: /dev/shm, hostname, resolv.conf) and its pod's
// sandbox's, and nothing of another container's, nor a directory that
// holds every container's, nor a low-level runtime's state.
func TestHookRuntimeData(t *testing.T) {
	const other = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	trial := map[string]string{AnnotationTrial: "eval-1"}
	for _, tc := range []struct {
		name, source, want string // want "": let in
		ann                map[string]string
	}{
		{"its own shm", "/run/containers/storage/overlay-containers/c1/userdata/shm", "", nil},
		{"its pod's shm (CRI-O)", "/run/containers/storage/overlay-containers/" + other + "/userdata/shm", "", map[string]string{AnnotationCRIOSandboxID: other}},
		{"an image layer", "/var/lib/containers/storage/overlay/abc/diff", "", nil},
		{"another container's shm", "/run/containers/storage/overlay-containers/" + other + "/userdata/shm", "is container " + other + "'s runtime data", nil},
		{"another container's userdata, graph root", "/var/lib/containers/storage/vfs-containers/" + other + "/userdata", "is container " + other + "'s runtime data", nil},
		{"every container's", "/run/containers/storage/overlay-containers", "holds every container's data", nil},
		{"the storage root's parent", "/var/lib/containers", "holds every container's data (/var/lib/containers/storage)", nil},
		{"a dotted way to another's", "/run/containers/storage/overlay-containers/c1/../" + other + "/userdata", "is container " + other + "'s runtime data", nil},
		{"runc's state", "/run/runc", "inside /run/runc", nil},
		{"crun's state of another container", "/var/run/crun/" + other, "inside /var/run/crun", nil},
		{"podman's state", "/run/libpod", "inside /run/libpod", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newContainerWorld(t)
			c := goodConfig()
			c["mounts"] = append(c["mounts"].([]map[string]any), map[string]any{"destination": "/mnt", "type": "bind", "source": tc.source, "options": []string{"rbind"}})
			if tc.ann != nil {
				c["annotations"] = tc.ann
			}
			w.writeConfig(c)
			_, err := w.run(w.state(trial))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("%s: %v", tc.source, err)
				}
				return
			}
			if r := (*Refusal)(nil); !errors.As(err, &r) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s: got %v, want refused with %q", tc.source, err, tc.want)
			}
		})
	}
}
