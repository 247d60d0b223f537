//go:build linux

package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// under reports whether path is dir or lies below it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// guestKeeps are the directories of dirs (absolute, clean: the checkout
// and the output directory) that the guest's fresh tmpfs mounts would
// hide: a clone under /tmp is the common case. The guest binds each back,
// at its own path, from the read-only share (vmtest.keep= on its command
// line). One under a kernel filesystem the guest mounts (/proc, /sys,
// /dev) cannot be.
func guestKeeps(dirs ...string) ([]string, error) {
	var keeps []string
	for _, d := range dirs {
		if strings.ContainsAny(d, " \t\n") {
			return nil, fmt.Errorf("%s: the guest finds it through its kernel command line, which splits at spaces: use a path without any", d)
		}
		over := -1 // the guest's mount that d is under, the deepest
		for i, m := range guestMounts {
			if under(d, m.dst) && (over < 0 || len(m.dst) > len(guestMounts[over].dst)) {
				over = i
			}
		}
		switch {
		case over < 0 || slices.ContainsFunc(keeps, func(k string) bool { return under(d, k) }):
		case guestMounts[over].fs == "tmpfs":
			keeps = append(keeps, d)
		default:
			return nil, fmt.Errorf("%s: the guest mounts its own %s over the host's, so it cannot see this directory: clone the repository (or point -out) elsewhere", d, guestMounts[over].dst)
		}
	}
	return keeps, nil
}

// mountPoint is the mount point of the filesystem that holds path: the
// share is the host's root filesystem alone, so a directory on another
// one (a tmpfs /tmp) is bound into it from there.
func mountPoint(path string) (string, error) {
	id := func(p string) (uint64, error) {
		var st unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, p, 0, unix.STATX_MNT_ID, &st); err != nil {
			return 0, fmt.Errorf("statx %s: %w", p, err)
		}
		return st.Mnt_id, nil
	}
	want, err := id(path)
	if err != nil {
		return "", err
	}
	for path != "/" {
		parent := filepath.Dir(path)
		got, err := id(parent)
		if err != nil {
			return "", err
		}
		if got != want {
			return path, nil
		}
		path = parent
	}
	return "/", nil
}
