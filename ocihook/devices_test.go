//go:build linux

package ocihook

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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

// In a user namespace runc binds the host's file at a device's path
// rather than make a node: a device entry must be, on the host, the node
// it names, and not a host terminal.
func TestDevicesBoundInAUserNamespace(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A pty of the test's own stands for the operator's terminal.
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts := fmt.Sprintf("/dev/pts/%d", n)
	var st unix.Stat_t
	if err := unix.Stat(pts, &st); err != nil {
		t.Fatal(err)
	}
	term := deviceOf{Path: pts, Type: "c", Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev))}
	for _, tc := range []struct {
		name   string
		dev    deviceOf
		userns bool
		want   string
	}{
		{"a host file named as /dev/null's numbers", deviceOf{Path: secret, Type: "c", Major: 1, Minor: 3}, true, "is something else on the host"},
		{"a FIFO's entry on a host file", deviceOf{Path: secret, Type: "p"}, true, "is something else on the host"},
		{"/dev/null as another device's numbers", deviceOf{Path: "/dev/null", Type: "c", Major: 4, Minor: 1}, true, "is something else on the host"},
		{"/dev/null as itself", deviceOf{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}, true, ""},
		{"a host file, no user namespace (runc makes a node)", deviceOf{Path: secret, Type: "c", Major: 1, Minor: 3}, false, ""},
		{"a path the host lacks", deviceOf{Path: "/dev/no-such-node", Type: "c", Major: 1, Minor: 3}, true, ""},
		{"a host terminal, named as itself", term, true, "is a host terminal"},
	} {
		c := config{Linux: &linuxOf{Devices: []deviceOf{tc.dev}}}
		if tc.userns {
			c.Linux.Namespaces = []namespaceOf{{Type: "user"}}
		}
		why := strings.Join(c.devicesBound(), "; ")
		if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
			t.Errorf("%s: refusals %q, want %q", tc.name, why, tc.want)
		}
	}
}
