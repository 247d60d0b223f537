//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// A refusal reaches the kernel's log as one record at KERN_ERR, which a
// console at a quiet loglevel shows (crun reports only the hook's exit
// status): the forged second record an annotation key with a newline
// asks for is not there.
func TestPrivilegedOCIHookRefusalInKmsg(t *testing.T) {
	privtest.Require(t)
	// Raw reads: Go's poller would wait on EAGAIN, the end of the log.
	kmsg, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(kmsg)
	if _, err := unix.Seek(kmsg, 0, io.SeekEnd); err != nil {
		t.Fatal(err)
	}
	bundle := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.0.2"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("kmsg-%d", time.Now().UnixNano())
	state := fmt.Sprintf(`{"ociVersion":"1.0.2","id":%q,"status":"creating","pid":1,"bundle":%q,"annotations":{"trialnet.io/x\n<0>forged":"y"}}`, id, bundle)
	stdin := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(stdin, []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(stdin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	was := os.Stdin
	os.Stdin = f
	code, _, errOut := trialnet("oci-hook", "--socket", filepath.Join(t.TempDir(), "absent.sock"))
	os.Stdin = was
	if code == exitOK || !strings.Contains(errOut, id) {
		t.Fatalf("the hook let the container in: exit %d\n%s", code, errOut)
	}
	var mine []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(kmsg, buf)
		if errors.Is(err, unix.EPIPE) {
			continue // records overwritten while read
		}
		if err != nil {
			break // EAGAIN: no more
		}
		if rec := string(buf[:n]); strings.Contains(rec, id) || strings.Contains(rec, "forged") {
			mine = append(mine, rec)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("the kernel's log holds %d records of the refusal, want 1: %q", len(mine), mine)
	}
	head, msg, _ := strings.Cut(mine[0], ";")
	prio, _ := strconv.Atoi(strings.Split(head, ",")[0])
	if prio&7 != 3 || !strings.HasPrefix(msg, "trialnet oci-hook: refused container "+id) || strings.Count(msg, "\n") != 1 {
		t.Errorf("the record %q: want level 3 (err), %q first, one line", mine[0], "trialnet oci-hook: refused container "+id)
	}
	t.Logf("the kernel's log: %q", mine[0])
}
