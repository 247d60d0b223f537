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
249 watchdog
242 vfio
243 usbmon

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
			"the device /dev/tap1 (246:1), a device that sends and takes frames on a host interface's link (macvtap)"},
		{"opened by a rule", linuxOf{Resources: &resourcesOf{Devices: []deviceRuleOf{{Allow: true, Type: "c", Major: &tap, Access: "rw"}}}},
			"character devices 246:*, among them a device that sends"},
	} {
		c := config{Linux: &tc.l}
		if why := strings.Join(c.hostCharDevices(hostCharClasses()), "; "); !strings.Contains(why, tc.want) {
			t.Errorf("%s: refusals %q, want %q", tc.name, why, tc.want)
		}
	}
	// An NVMe controller's device reads its first namespace (not run
	// here: no NVMe on this host).
	nvme := int64(239)
	c := config{Linux: &linuxOf{Resources: &resourcesOf{Devices: []deviceRuleOf{{Allow: true, Type: "c", Major: &nvme, Access: "r"}}}}}
	if why := strings.Join(c.hostCharDevices(hostCharClasses()), "; "); !strings.Contains(why, "character devices 239:*, among them a device that passes commands through to a disk (nvme)") {
		t.Errorf("an NVMe controller's major: refusals %q", why)
	}
	// mei (247), beside them, is not among them.
	other := int64(247)
	c = config{Linux: &linuxOf{Resources: &resourcesOf{Devices: []deviceRuleOf{{Allow: true, Type: "c", Major: &other, Access: "rw"}}}}}
	if why := c.hostCharDevices(hostCharClasses()); len(why) != 0 {
		t.Errorf("mei's major refused: %q", why)
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

// The host's character devices, one list for a device given and one a
// rule opens: a node reaches the host whoever made it (runc 1.1.5 here:
// a node 5:1 made by the image, no CAP_MKNOD, and the rule c 5:1 rwm
// wrote to the host's console). What a container in a Trial uses
// passes: its own terminal (/dev/tty), ptys, tun, KVM, vhost-net.
func TestHostCharDevicesRefused(t *testing.T) {
	f := filepath.Join(t.TempDir(), "devices")
	if err := os.WriteFile(f, []byte(hostDevices), 0o644); err != nil {
		t.Fatal(err)
	}
	old := procDevices
	procDevices = f
	t.Cleanup(func() { procDevices = old })
	rule := func(maj, min int64) linuxOf {
		r := deviceRuleOf{Allow: true, Type: "c", Major: &maj, Access: "rw"}
		if min >= 0 {
			r.Minor = &min
		}
		return linuxOf{Resources: &resourcesOf{Devices: []deviceRuleOf{r}}}
	}
	given := func(path string, maj, min int64) linuxOf {
		return linuxOf{Devices: []deviceOf{{Path: path, Type: "c", Major: maj, Minor: min}}}
	}
	for _, tc := range []struct {
		name string
		l    linuxOf
		want string // "": passes
	}{
		{"Docker's console rule (c 5:1 rwm)", rule(5, 1), "character devices 5:1, among them the host's console (/dev/console) (console)"},
		{"every minor of major 5", rule(5, -1), "the host's console"},
		{"the console given", given("/dev/console", 5, 1), "the device /dev/console (5:1), the host's console"},
		{"vhost-vsock given", given("/dev/vhost-vsock", 10, 241), "a VM's end of vsock (vhost-vsock): it could talk to the host's vsock services"},
		{"the watchdog opened by a rule", rule(10, 130), "the host's hardware watchdog (watchdog): once opened and left, it reboots the host"},
		{"a numbered watchdog given", given("/dev/watchdog0", 249, 0), "the host's hardware watchdog (watchdog)"},
		{"VFIO's container device", given("/dev/vfio/vfio", 10, 196), "VFIO's container device (vfio)"},
		{"a VFIO group", given("/dev/vfio/12", 242, 0), "a VFIO group of the host's (vfio)"},
		{"raw USB opened by a rule", rule(189, -1), "a raw USB device of the host's (/dev/bus/usb) (usb_device)"},
		{"usbmon", given("/dev/usbmon0", 243, 0), "every USB bus's traffic (usbmon)"},
		{"a USB serial port", given("/dev/ttyUSB0", 188, 0), "a USB serial port of the host's (ttyUSB)"},
		{"a USB modem", rule(166, -1), "a USB modem or serial port of the host's (ttyACM)"},
		{"raw HID, a keyboard's reports", given("/dev/hidraw0", 245, 0), "a raw HID device of the host's (hidraw): it could read the keys typed on the host's keyboards"},
		{"/dev/tty, its own terminal", rule(5, 0), ""},
		{"/dev/ptmx", rule(5, 2), ""},
		{"ptys", rule(136, -1), ""},
		{"tun", given("/dev/net/tun", 10, 200), ""},
		{"KVM", given("/dev/kvm", 10, 232), ""},
		{"vhost-net", given("/dev/vhost-net", 10, 238), ""},
	} {
		c := config{Linux: &tc.l}
		why := strings.Join(c.hostCharDevices(hostCharClasses()), "; ")
		if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
			t.Errorf("%s: refusals %q, want %q", tc.name, why, tc.want)
		}
	}
}

// A bind of a host device node is judged as a device entry of its
// numbers, and a bind of a directory of the host's devices is refused:
// runc 1.1.5 here, no user namespace, a bind of /dev/pts with runc's
// own default rules (c 136:* rwm) wrote to a host terminal.
func TestDeviceBindsRefused(t *testing.T) {
	// A pty of the test's own stands for the operator's terminal.
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src, want string
	}{
		{"/dev/pts", "it binds the host's device directory /dev/pts on /x"},
		{"/dev", "it binds the host's device directory /dev on /x"},
		{fmt.Sprintf("/dev/pts/%d", n), "a host terminal"},
		{"/dev/console", "the host's console (/dev/console) (console)"},
		{"/dev/null", ""},
		{t.TempDir(), ""},
	} {
		for _, typ := range []string{"bind", "none"} {
			m := mountOf{Destination: "/x", Type: typ, Source: tc.src, Options: []string{"rbind"}}
			why := strings.Join(m.deviceBindRefusals("/", hostChars), "; ")
			if (tc.want == "") != (why == "") || !strings.Contains(why, tc.want) {
				t.Errorf("a %s of %s: refusals %q, want %q", typ, tc.src, why, tc.want)
			}
		}
	}
	// Through the hook's check: the same refusal.
	c := config{Mounts: []mountOf{{Destination: "/hostpts", Type: "bind", Source: "/dev/pts", Options: []string{"rbind"}}},
		Linux: &linuxOf{Namespaces: []namespaceOf{{Type: "pid"}, {Type: "network"}, {Type: "cgroup"}, {Type: "mount"}, {Type: "ipc"}}}}
	if why := strings.Join(c.check("/", nil), "; "); !strings.Contains(why, "device directory /dev/pts") {
		t.Errorf("check of a bind of /dev/pts: %q", why)
	}
}
