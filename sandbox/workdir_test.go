//go:build linux

package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/trial"
)

// A command's working directory is reached as the command's uid: a
// symlink the Trial left where the operator points --workdir (its work
// directory, or one it shares with its uid's next Trial) must not take it
// through a directory that uid cannot search. The launcher's chdir ran as
// root, so the command started beneath root's 0700 directory and read a
// file there that its path kept from it.
func TestPrivilegedWorkdirIsReachedAsTheUid(t *testing.T) {
	h := newHost(t)
	top := privtest.SharedDir(t, "workdir-")
	pub := filepath.Join(top, "private", "pub")
	if err := os.MkdirAll(pub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(top, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pub, "secret"), []byte("root's only\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(top, "work")
	if err := os.Mkdir(work, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(work, 0o777); err != nil {
		t.Fatal(err)
	}
	// What the Trial would leave: a link in a directory it may write.
	if err := os.Symlink(pub, filepath.Join(work, "w")); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(work, "w"), nobody, nobody); err != nil {
		t.Fatal(err)
	}
	// A link to where the uid may go still leads there.
	if err := os.WriteFile(filepath.Join(top, "open"), []byte("anyone's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(top, filepath.Join(work, "up")); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join(work, "w"), pub, filepath.Join(work, "up")} {
		// Both a fresh Trial's first command and a later one.
		tr := newTrial(t, h, trial.Spec{UnixOpen: true})
		for i := range 2 {
			var out strings.Builder
			code, err := tr.Exec(context.Background(), Command{Args: []string{"/bin/cat", "open", "secret"}, Dir: dir,
				Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: &out, Stderr: &out}, nil)
			if strings.Contains(out.String(), "root's only") {
				t.Fatalf("command %d with its working directory %s: exit %d, %v, %q; the file read beneath root's 0700 directory", i, dir, code, err, out.String())
			}
			if dir == filepath.Join(work, "up") {
				if !strings.Contains(out.String(), "anyone's") {
					t.Fatalf("command %d with its working directory %s: exit %d, %v, %q; want the file the uid may read", i, dir, code, err, out.String())
				}
				continue
			}
			if err == nil || !strings.Contains(err.Error(), "not reachable as uid 65534") {
				t.Fatalf("command %d with its working directory %s: exit %d, %v, %q; want it refused naming the working directory", i, dir, code, err, out.String())
			}
		}
	}
}

// A working directory the Trial's own mounts cover (a host directory
// under /tmp, the Trial's own tmpfs) is not in its view. The init's walk
// to keep the file systems on the way there stopped at it and failed the
// whole start with a message about mounting; the command is refused
// instead, saying where its working directory must be, and the Trial
// goes on.
func TestPrivilegedWorkdirTheTrialCovers(t *testing.T) {
	h := newHost(t)
	dir, err := os.MkdirTemp("/tmp", "trialnet-covered-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	for i := range 2 {
		var out strings.Builder
		code, err := tr.Exec(context.Background(), Command{Args: []string{"/bin/pwd"}, Dir: dir,
			Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: &out, Stderr: &out}, nil)
		if err == nil || !strings.Contains(err.Error(), "a directory in the Trial's view of files") {
			t.Fatalf("command %d with its working directory %s under /tmp: exit %d, %v, %q; want it refused saying /tmp is the Trial's own", i, dir, code, err, out.String())
		}
	}
	var out strings.Builder
	code, err := tr.Exec(context.Background(), Command{Args: []string{"/bin/pwd"}, Dir: "/",
		Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: &out, Stderr: &out}, nil)
	if err != nil || code != 0 || out.String() != "/\n" {
		t.Fatalf("a command in / after the refusals: exit %d, %v, %q; want the Trial still running it", code, err, out.String())
	}
}
