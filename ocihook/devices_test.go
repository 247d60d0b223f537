//go:build linux

package ocihook

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// This host's /proc/devices (a 6.18 guest), with macvtap loaded, and an
// NVMe controller's major as a host with one names it.
const hostDevices = `Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
 10 misc
 13 input
128 ptm
136 pts
245 hidraw
246 macvtap
247 mei
248 bsg
252 dax
253 dimmctl
239 nvme

Block devices:
  7 loop
254 virtblk
259 blkext
`

// A macvtap's character device sends frames on a host interface's link
// from any network namespace: runc 1.1.5 here, a container with only lo
// given /dev/tap1 (246:1) wrote frames that a capture on the link, in
// another namespace, saw. Given or opened by a rule, it is refused, as
// the disk pass-through devices are, by the major /proc/devices names.
func TestTapDevicesRefused(t *testing.T) {
	f := filepath.Join(t.TempDir(), "devices")
	if err := os.WriteFile(f, []byte(hostDevices), 0o644); err != nil {
		t.Fatal(err)
	}
	old := procDevices
	procDevices = f
	t.Cleanup(func() { procDevices = old })

	tap := int64(246)
	for _, tc := range []struct {
		name string
		l    linuxOf
		want string
	}{
		{"given", linuxOf{Devices: []deviceOf{{Path: "/dev/tap1", Type: "c", Major: 246, Minor: 1}}},
			"the device /dev/tap1 (246:1), which sends and takes frames on a host interface's link (macvtap)"},
		{"opened by a rule", linuxOf{Resources: &resourcesOf{Devices: []deviceRuleOf{{Allow: true, Type: "c", Major: &tap, Access: "rw"}}}},
			"character devices of major 246 (macvtap)"},
	} {
		c := config{Linux: &tc.l}
		if why := strings.Join(c.blockDevices(), "; "); !strings.Contains(why, tc.want) {
			t.Errorf("%s: refusals %q, want %q", tc.name, why, tc.want)
		}
	}
	// An NVMe controller's device reads its first namespace (not run
	// here: no NVMe on this host).
	nvme := int64(239)
	c := config{Linux: &linuxOf{Resources: &resourcesOf{Devices: []deviceRuleOf{{Allow: true, Type: "c", Major: &nvme, Access: "r"}}}}}
	if why := strings.Join(c.blockDevices(), "; "); !strings.Contains(why, "major 239 (nvme)") {
		t.Errorf("an NVMe controller's major: refusals %q", why)
	}
	// hidraw (245) and mei (247), beside them, are not among them.
	other := int64(245)
	c = config{Linux: &linuxOf{Resources: &resourcesOf{Devices: []deviceRuleOf{{Allow: true, Type: "c", Major: &other, Access: "rw"}}}}}
	if why := c.blockDevices(); len(why) != 0 {
		t.Errorf("hidraw's major refused: %q", why)
	}
}
