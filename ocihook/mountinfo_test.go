//go:build linux

package ocihook

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReadMountinfo(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mountinfo")
	lines := "25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n" +
		"40 25 8:1 /var/lib/trial\\040net /root\\040fs/mnt ro,nosuid master:2 propagate_from:1 - ext4 /dev/sda1 rw\n"
	if err := os.WriteFile(p, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readMountinfo(p)
	if err != nil {
		t.Fatal(err)
	}
	want := mountEntry{id: 40, dev: unix.Mkdev(8, 1), root: "/var/lib/trial net", point: "/root fs/mnt", fstype: "ext4"}
	if len(got) != 2 || got[1] != want {
		t.Fatalf("got %+v, want [1] = %+v", got, want)
	}
	if err := os.WriteFile(p, []byte("25 1 8:1 / / rw\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readMountinfo(p); err == nil {
		t.Fatal("a line with no separator was read")
	}
}

// A protected path is found on its mount by the mount's id, and takes
// the device mountinfo gives it: on btrfs that is not stat's st_dev
// (each subvolume has its own), which the devices below stand for.
func TestLocateByMountID(t *testing.T) {
	self, err := readMountinfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for i := range self {
		self[i].dev = unix.Mkdev(0, 1000+uint32(i))
	}
	dir := t.TempDir()
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, 0, unix.STATX_MNT_ID, &st); err != nil || st.Mask&unix.STATX_MNT_ID == 0 {
		t.Skipf("no STATX_MNT_ID: %v", err)
	}
	got := locate(self, []string{dir})
	if len(got) != 1 {
		t.Fatalf("%s was located on no mount (%+v): a mount of it would not be refused", dir, got)
	}
	for _, m := range self {
		if m.id == st.Mnt_id && got[0].dev != m.dev {
			t.Errorf("located on device %d, its mount's is %d", got[0].dev, m.dev)
		}
	}
}

// The rules on one mount as the kernel reports it: the device and path
// within its file system decide, not the name it was mounted by.
func TestMountRefusal(t *testing.T) {
	disk, other := unix.Mkdev(8, 1), unix.Mkdev(8, 2)
	run, podShm := unix.Mkdev(0, 25), unix.Mkdev(0, 77)
	prot := []protectedFile{{path: "/var/lib/trialnet", inFS: "/var/lib/trialnet", dev: disk},
		{path: "/run/containerd", inFS: "/containerd", dev: run}}
	const shm = "/containerd/io.containerd.grpc.v1.cri/sandboxes/6f1b3a0e9c4d2b7a8e5f0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f/shm"
	const trial = "/trialnet/eval-1"
	for _, tc := range []struct {
		name string
		m    mountEntry
		want string // "": let in
	}{
		{"the state dir by another name", mountEntry{dev: disk, root: "/var/lib/trialnet", fstype: "ext4"}, "inside /var/lib/trialnet"},
		{"a file in the state dir", mountEntry{dev: disk, root: "/var/lib/trialnet/receipt.key", fstype: "ext4"}, "inside /var/lib/trialnet"},
		{"the host's root disk", mountEntry{dev: disk, root: "/", fstype: "ext4"}, "holds or is inside /var/lib/trialnet"},
		{"a directory beside it", mountEntry{dev: disk, root: "/var/lib/trialnet-other", fstype: "ext4"}, ""},
		{"the same path on another disk", mountEntry{dev: other, root: "/var/lib/trialnet", fstype: "ext4"}, ""},
		{"bpffs", mountEntry{dev: unix.Mkdev(0, 30), root: "/", fstype: "bpf"}, "kernel's own state"},
		{"tracefs", mountEntry{dev: unix.Mkdev(0, 31), root: "/", fstype: "tracefs"}, "kernel's own state"},
		{"configfs, under an rbind of /sys/kernel", mountEntry{dev: unix.Mkdev(0, 32), root: "/", fstype: "configfs"}, "kernel's own state"},
		{"efivarfs, under an rbind of /sys/firmware", mountEntry{dev: unix.Mkdev(0, 33), root: "/", fstype: "efivarfs"}, "kernel's own state"},
		{"autofs, under an rbind of /net", mountEntry{dev: unix.Mkdev(0, 34), root: "/", fstype: "autofs"}, "automount daemon"},
		{"the cgroup2 root", mountEntry{root: "/", fstype: "cgroup2"}, "above its Trial's"},
		{"a sibling Trial's cgroup", mountEntry{root: "/trialnet/eval-10", fstype: "cgroup2"}, "above its Trial's"},
		{"its own cgroup", mountEntry{root: trial + "/ctr", fstype: "cgroup2"}, ""},
		// Read-only or not is the config's check: runtimes make mounts
		// read-only after createRuntime.
		{"sysfs", mountEntry{root: "/", fstype: "sysfs"}, ""},
		{"its own tmpfs", mountEntry{dev: unix.Mkdev(0, 99), root: "/", fstype: "tmpfs"}, ""},
		// containerd's pod /dev/shm is a tmpfs of its own, whatever path
		// it was mounted at; the same path as a directory of /run is the
		// runtime's state.
		{"containerd's pod shm tmpfs", mountEntry{dev: podShm, root: "/", fstype: "tmpfs"}, ""},
		{"a directory named shm in containerd's state", mountEntry{dev: run, root: shm, fstype: "tmpfs"}, "inside /run/containerd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.m.refusal(prot, trial)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
