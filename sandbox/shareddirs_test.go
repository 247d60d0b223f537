//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// sharedDirsHere are the host's directories of sharedDirs, followed, each
// once. Where the host has none, /run/lock is made (1777, removed at
// cleanup), so that there is one to test.
func sharedDirsHere(t *testing.T) []string {
	t.Helper()
	var dirs []string
	for _, d := range sharedDirs {
		real, err := filepath.EvalSymlinks(d)
		if fi, serr := os.Stat(real); err == nil && serr == nil && fi.IsDir() && !slices.Contains(dirs, real) {
			dirs = append(dirs, real)
		}
	}
	if len(dirs) > 0 {
		return dirs
	}
	if err := os.Mkdir(sharedDirs[0], 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sharedDirs[0]) })
	if err := os.Chmod(sharedDirs[0], 0o1777); err != nil {
		t.Fatal(err)
	}
	return []string{sharedDirs[0]}
}

// A file a Trial leaves in the host's /run/lock (every user may write
// there) outlived it, and another Trial of another uid read it: a way
// out through a Trial with a wider allowlist, or to a host program that
// acts on what it finds there (whoopsie uploads /var/crash). Each Trial
// has an empty one of its own: a host file there is not the Trial's to
// read, and what the Trial writes there never reaches the host.
func TestPrivilegedSharedDirsAreTheTrialsOwn(t *testing.T) {
	h := newHost(t)
	dirs := sharedDirsHere(t)
	tr := newTrial(t, h, trial.Spec{})
	for _, dir := range dirs {
		name := "trialnet-test-" + randSuffix()
		host := filepath.Join(dir, name)
		if err := os.WriteFile(host, []byte("the host's"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(host) })
		if code, out := runProbeAs(t, tr, nobody, Command{}, "read", host); code == probeOK || !strings.Contains(out, "ENOENT") && !strings.Contains(out, "no such file") {
			t.Errorf("the Trial reading the host's %s: %d %q, want ENOENT (a directory of its own)", host, code, out)
		}
		left := filepath.Join(dir, name+"-left")
		t.Cleanup(func() { _ = os.Remove(left) })
		var st unix.Stat_t
		if err := unix.Stat(dir, &st); err != nil {
			t.Fatal(err)
		}
		code, out := runProbeAs(t, tr, nobody, Command{}, "write", left, "the Trial's")
		if st.Mode&0o002 != 0 && code != probeOK {
			t.Errorf("the Trial writing %s, which every user may write in: %d %q (its own must stay writable)", left, code, out)
		}
		if _, err := os.Lstat(left); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("what the Trial wrote to %s is on the host (%v): another Trial, of any uid, reads it there", left, err)
		}
	}
}

// The Go set-up's coverSharedDirs, run on a thread in a mount namespace
// of its own, as the init has: each shared directory is empty and what is
// written there stays off the host.
func TestPrivilegedGoCoverSharedDirs(t *testing.T) {
	privtest.Require(t)
	dirs := sharedDirsHere(t)
	name := "trialnet-test-" + randSuffix()
	for _, dir := range dirs {
		host := filepath.Join(dir, name)
		if err := os.WriteFile(host, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(host) })
		t.Cleanup(func() { _ = os.Remove(host + "-left") })
	}
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		if err := coverSharedDirs(); err != nil {
			return []string{err.Error()}
		}
		for _, dir := range dirs {
			if names, err := dirNames(dir); err != nil || names != "" {
				bad = append(bad, fmt.Sprintf("%s: %q %v, want it empty (covered)", dir, names, err))
			}
			if err := os.WriteFile(filepath.Join(dir, name+"-left"), nil, 0o644); err != nil {
				bad = append(bad, err.Error())
			}
		}
		return bad
	})
	for _, dir := range dirs {
		if _, err := os.Lstat(filepath.Join(dir, name+"-left")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("what was written to the covered %s is on the host (%v)", dir, err)
		}
	}
}

// An allowed unix socket under a shared directory, which every Trial has
// an empty one of, is refused at create, not silently out of reach.
func TestUnixAllowUnderSharedDirIsRefused(t *testing.T) {
	h := &Host{NetnsDir: t.TempDir()}
	for _, d := range sharedDirs {
		p := filepath.Join(d, "x.sock")
		if err := h.checkSpec(trial.Spec{ID: "u", UnixAllow: []string{p}, UnixOpen: true}); err == nil || !strings.Contains(err.Error(), "an empty one of its own") {
			t.Errorf("%s: %v, want a refusal naming the shared directory", p, err)
		}
	}
	if err := checkUnixPathsOffSharedDirs([]string{"/run/lockx/a.sock", "/tmp/a.sock"}); err != nil {
		t.Errorf("a path outside the shared directories: %v", err)
	}
}
