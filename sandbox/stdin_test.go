//go:build linux

package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// callerPipe is a blocking pipe, as a shell makes one, of uid nobody: the
// Trial's uid, as under sudo, where the caller's pipes are the Trial's.
func callerPipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	r, w = os.NewFile(uintptr(p[0]), "caller-r"), os.NewFile(uintptr(p[1]), "caller-w")
	t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
	if err := unix.Fchown(p[0], nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return r, w
}

// callerFile is a file of uid nobody holding content, open for reading
// at offset at, as a shell's `< file`.
func callerFile(t *testing.T, content string, at int64) *os.File {
	t.Helper()
	name := filepath.Join(t.TempDir(), "input")
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(name, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	if _, err := f.Seek(at, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	return f
}

func nonBlocking(t *testing.T, f *os.File) bool {
	t.Helper()
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fl&unix.O_NONBLOCK != 0
}

// The Trial never holds the caller's stdin. Handed in, a pipe or file of
// the Trial's uid could be opened again for writing through
// /proc/self/fd/0, and what the Trial wrote was read next by the caller
// (a shell reading its script from the pipe ran it outside the Trial, as
// root, in an attacker's review); a shared file's offset could be moved
// back (the shell ran its lines again) and the caller's reads made
// non-blocking. The command gets a pipe of trialnet's instead.
func TestPrivilegedStdinIsNotTheCallers(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	t.Run("pipe", func(t *testing.T) {
		r, w := callerPipe(t)
		if _, err := w.WriteString("first\nsecond\n"); err != nil {
			t.Fatal(err)
		}
		code, out := runProbeAs(t, tr, nobody, Command{Stdin: r}, "stdin-tamper")
		t.Logf("exit %d: %s", code, out)
		if nonBlocking(t, r) {
			t.Error("the caller's pipe was left non-blocking")
		}
		if _, err := w.WriteString("third\n"); err != nil {
			t.Fatal(err)
		}
		_ = w.Close()
		got, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != "first\nsecond\nthird\n" {
			t.Errorf("the caller's pipe then read %q, want its own lines alone (the probe: %s)", got, out)
		}
	})
	t.Run("file", func(t *testing.T) {
		const content = "first\nsecond\n"
		f := callerFile(t, content, 6)
		code, out := runProbeAs(t, tr, nobody, Command{Stdin: f}, "stdin-tamper")
		t.Logf("exit %d: %s", code, out)
		if nonBlocking(t, f) {
			t.Error("the caller's file was left non-blocking")
		}
		if at, err := f.Seek(0, io.SeekCurrent); err != nil || at != 6 {
			t.Errorf("the caller's offset is %d (%v), want 6: the command read nothing (the probe: %s)", at, err, out)
		}
		if b, err := os.ReadFile(f.Name()); err != nil || string(b) != content {
			t.Errorf("the caller's file now holds %q (%v) (the probe: %s)", b, err, out)
		}
	})
}

// What the command reads of its stdin is what the caller's input moves
// on by, as if it had been shared: a `while read` loop whose body runs a
// Trial keeps its next lines, from a pipe or a file, and a command that
// reads it all gets it all.
func TestPrivilegedStdinMovesOnByWhatTheCommandRead(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	readLine := func(t *testing.T, in *os.File) {
		t.Helper()
		var out bytes.Buffer
		code, err := tr.Exec(context.Background(), Command{Args: []string{"sh", "-c", `read -r x; echo "got $x"`},
			Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdin: in, Stdout: &out, Stderr: &out}, nil)
		if err != nil || code != 0 || out.String() != "got a\n" {
			t.Fatalf("exit %d, %v: %q", code, err, out.String())
		}
	}
	t.Run("pipe", func(t *testing.T) {
		r, w := callerPipe(t)
		if _, err := w.WriteString("a\nb\nc\n"); err != nil {
			t.Fatal(err)
		}
		_ = w.Close()
		readLine(t, r)
		if rest, _ := io.ReadAll(r); string(rest) != "b\nc\n" {
			t.Errorf("the caller's pipe holds %q after the command read one line, want %q", rest, "b\nc\n")
		}
	})
	t.Run("file", func(t *testing.T) {
		f := callerFile(t, "x\na\nb\nc\n", 2)
		readLine(t, f)
		if rest, _ := io.ReadAll(f); string(rest) != "b\nc\n" {
			t.Errorf("the caller's file reads %q after the command read one line, want %q", rest, "b\nc\n")
		}
	})
	t.Run("all", func(t *testing.T) {
		big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
		r, w := callerPipe(t)
		go func() { _, _ = w.WriteString(big); _ = w.Close() }()
		f := callerFile(t, big, 0)
		for _, in := range []*os.File{r, f} {
			var out bytes.Buffer
			code, err := tr.Exec(context.Background(), Command{Args: []string{"wc", "-c"},
				Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdin: in, Stdout: &out, Stderr: &out}, nil)
			if err != nil || code != 0 || strings.TrimSpace(out.String()) != "1048576" {
				t.Errorf("%s: exit %d, %v: %q, want 1048576", in.Name(), code, err, out.String())
			}
		}
	})
}

// The pipes a command gets for its stdio are its uid's, as a terminal's
// pty is: /dev/stdin, /dev/stdout and /dev/stderr open again, as scripts
// expect (`echo oops >/dev/stderr`).
func TestPrivilegedStdioPipesOpenAgain(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	in := callerFile(t, "input-line\n", 0)
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	errs := filepath.Join(t.TempDir(), "errors.log")
	errF, err := os.Create(errs)
	if err != nil {
		t.Fatal(err)
	}
	defer errF.Close()
	code, err := tr.Exec(context.Background(), Command{Args: []string{"sh", "-c",
		// /proc/self/fd/N, where /dev/std* lead: a guest without udev has none.
		"cat /proc/self/fd/0 >/proc/self/fd/1 && echo to-stderr >/proc/self/fd/2"},
		Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdin: in, Stdout: outW, Stderr: errF}, nil)
	_ = outW.Close()
	out, _ := io.ReadAll(outR)
	b, _ := os.ReadFile(errs)
	if err != nil || code != 0 || string(out) != "input-line\n" || string(b) != "to-stderr\n" {
		t.Fatalf("exit %d, %v: stdout %q, stderr %q; want /dev/stdin, /dev/stdout and /dev/stderr opened again", code, err, out, b)
	}
}

// A command may make its stdin pipe longer (F_SETPIPE_SZ needs only a
// descriptor of it): room in it then no longer means that it read all
// that was passed on, and the caller's pipe must still move on by what it
// read, not by what it was given.
func TestPrivilegedStdinPipeGrownByTheCommand(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	r, w := callerPipe(t)
	if _, err := w.WriteString("a\nb\nc\n"); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	if code, out := runProbeAs(t, tr, nobody, Command{Stdin: r}, "stdin-grow"); code != probeOK || out != "a" {
		t.Fatalf("the probe: exit %d, %q; want the first line", code, out)
	}
	if rest, _ := io.ReadAll(r); string(rest) != "b\nc\n" {
		t.Errorf("the caller's pipe holds %q after the command read one line of a pipe it made longer, want %q", rest, "b\nc\n")
	}
}

// A command that cannot start reads nothing of its stdin: a socket's
// bytes, copied as they come, are copied only once it runs, so the caller
// still has them after a refused start.
func TestPrivilegedSocketStdinKeptWhenTheCommandCannotStart(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	writer, reader := streamPair(t)
	if _, err := writer.Write([]byte("for-whoever-reads-next\n")); err != nil {
		t.Fatal(err)
	}
	_, err := tr.Start(Command{Args: []string{"/no/such/command"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdin: reader})
	var se *StartError
	if !errors.As(err, &se) {
		t.Fatalf("start: %v; want a StartError", err)
	}
	_ = writer.Close()
	if rest, _ := io.ReadAll(reader); string(rest) != "for-whoever-reads-next\n" {
		t.Errorf("the caller's socket holds %q after a start that failed, want its line", rest)
	}
}

// streamPair is a connected pair of unix stream sockets, closed when the
// test ends.
func streamPair(t *testing.T) (a, b *os.File) {
	t.Helper()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b = os.NewFile(uintptr(pair[0]), "a"), os.NewFile(uintptr(pair[1]), "b")
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return a, b
}
