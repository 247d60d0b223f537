//go:build linux

package rootdir

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// WriteFileAtomic syncs the new file's data before the rename, and the
// directory after it, which holds the new name: without the second, a
// crash may leave the old file, or none, under the name. Real files are
// written; the sync calls are watched, each noting what it syncs and
// what the name holds at that moment.
func TestWriteFileAtomicSyncsTheDirectoryAfterTheRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "receipt.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	var calls []string
	t.Cleanup(func() { fsync = (*os.File).Sync })
	fsync = func(f *os.File) error {
		st, err := f.Stat()
		if err != nil {
			return err
		}
		now, _ := os.ReadFile(path)
		what := "file"
		if st.IsDir() {
			what = "dir " + filepath.Base(f.Name())
		}
		calls = append(calls, fmt.Sprintf("%s: the name holds %q", what, now))
		return f.Sync()
	}
	if err := WriteFileAtomic(path, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := []string{`file: the name holds "old"`, `dir ` + filepath.Base(dir) + `: the name holds "new"`}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("syncs:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, []byte("new")) {
		t.Errorf("the file: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("a temporary file was left: %v", ents)
	}
}

// BenchmarkWriteFileAtomic is a receipt's write: a 2.5 KB file made in
// a directory of its own and synced.
func BenchmarkWriteFileAtomic(b *testing.B) {
	base := b.TempDir()
	data := bytes.Repeat([]byte("x"), 2500)
	for i := 0; b.Loop(); i++ {
		dir := filepath.Join(base, fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := WriteFileAtomic(filepath.Join(dir, "receipt.json"), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// ReplaceFile writes a temporary file that the rename makes visible: a
// reader running beside it sees the old file or the new one, never a
// part (os.WriteFile truncates the file in place, then writes it). Two
// contents of 1 MiB, of one byte each, are written in turn.
func TestReplaceFileIsNeverSeenInPart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stats.json")
	const size = 1 << 20
	contents := [][]byte{bytes.Repeat([]byte("a"), size), bytes.Repeat([]byte("b"), size)}
	if err := ReplaceFile(path, contents[0], 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	seen := make(chan string, 1)
	go func() {
		defer close(seen)
		for reads := 0; ; reads++ {
			select {
			case <-done:
				return
			default:
			}
			b, err := os.ReadFile(path)
			if err != nil || len(b) != size || bytes.Count(b, b[:1]) != size {
				seen <- fmt.Sprintf("read %d: %d bytes, %v", reads, len(b), err)
				return
			}
		}
	}()
	for i := range 200 {
		if err := ReplaceFile(path, contents[i%2], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	if part, ok := <-seen; ok {
		t.Fatalf("a reader saw part of the file: %s", part)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("a temporary file was left: %v", ents)
	}
}
