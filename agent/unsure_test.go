//go:build linux

package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

// requireUnsureVerdict fails unless st and its signed receipt say the
// final counters may not hold all the Trial did, and never "ok".
func requireUnsureVerdict(t *testing.T, a *Agent, st client.Stats) {
	t.Helper()
	if st.Unsure == "" || !strings.Contains(st.Verdict, "UNKNOWN") || strings.Contains(st.Verdict, "(ok)") {
		t.Errorf("destroy's verdict %q (unsure %q): want UNKNOWN, never ok", st.Verdict, st.Unsure)
	}
	if b := st.Brief(); !strings.Contains(b, "UNKNOWN") || strings.Contains(b, "(ok") {
		t.Errorf("the summary's verdict %q: want UNKNOWN, never ok", b)
	}
	if st.Receipt == nil {
		t.Fatal("no receipt signed")
	}
	pub, err := ReadPublicKey(ReceiptPublicKey(a.cfg.ReceiptKey))
	if err != nil {
		t.Fatal(err)
	}
	r, err := st.Receipt.Verify(pub)
	if err != nil {
		t.Fatal(err)
	}
	if r.Verdict != st.Verdict {
		t.Errorf("the signed verdict %q, destroy's %q", r.Verdict, st.Verdict)
	}
}

// A destroy that cannot read the Trial's final counters signs no "ok"
// over the zeros it has instead: the receipt says it does not know.
func TestPrivilegedDestroyUnreadCountersAreNoVerdict(t *testing.T) {
	privtest.Require(t)
	cfg := AgentConfig{Host: isolatedHost(t), DataDir: t.TempDir(), ReceiptKey: filepath.Join(t.TempDir(), "receipt.key"), Ephemeral: true, File: &config.File{}}
	a := startAgent(t, cfg)
	const id = "unsure-read"
	if _, err := a.Create(context.Background(), trialspec.Request{ID: id}); err != nil {
		t.Fatal(err)
	}
	lt, err := a.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	// Its entries gone from the maps: the counters cannot be read.
	if err := a.host.BPF.RemoveTrial(lt.tr.CgroupID); err != nil {
		t.Fatal(err)
	}
	st, err := a.Destroy(context.Background(), id)
	if err == nil {
		t.Error("destroy: no error for counters it could not read")
	}
	requireUnsureVerdict(t, a, st)

	// Through the control API the error carries those stats: alone, it
	// hid the signed UNKNOWN (or ALARM) behind run's NO VERDICT.
	const viaAPI = "unsure-read-api"
	if _, err := a.Create(context.Background(), trialspec.Request{ID: viaAPI}); err != nil {
		t.Fatal(err)
	}
	if lt, err = a.lookup(viaAPI); err != nil {
		t.Fatal(err)
	}
	if err := a.host.BPF.RemoveTrial(lt.tr.CgroupID); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, "/v1/trials/"+viaAPI+"?exit_code=0", nil))
	var answer struct {
		Error *client.Error `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil || answer.Error == nil {
		t.Fatalf("destroy through the API answered %d %q: want an error (%v)", rec.Code, rec.Body.String(), err)
	}
	var sent client.Stats
	if err := json.Unmarshal(answer.Error.Stats, &sent); err != nil {
		t.Fatalf("the destroy's error carried no stats: %q (%v)", rec.Body.String(), err)
	}
	requireUnsureVerdict(t, a, sent)
}

// stuckInFUSE starts a process in cgroup that the kernel will not let
// die: it looks a name up on a FUSE mount whose server read the request
// and never answers, which a SIGKILL cannot end (the kernel waits the
// answer out). A Trial's own process gets there the same ways: a FUSE
// mount of a nested Trial's sandbox, a sync(2) behind gigabytes of its
// own dirty pages. The cleanup aborts the mount, and the process dies.
func stuckInFUSE(t *testing.T, cgroup string) {
	t.Helper()
	mnt := t.TempDir()
	// Blocking reads on a raw descriptor: Go's poller does not take /dev/fuse.
	dev, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", dev)
	if err := unix.Mount("trialnet-stuck", mnt, "fuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(dev)
		t.Skipf("no FUSE mount here: %v", err)
	}
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	cmd := exec.Command("/usr/bin/stat", filepath.Join(mnt, "x"))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	read := make(chan uint32, 4)
	go serveFUSEUnanswered(dev, read)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The server reads no more: its last holder gone, the connection
		// is aborted, the lookup ends, and the process with it.
		_ = unix.Close(dev)
		_ = cmd.Wait()
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
	})
	for op := range read {
		if op == fuseLookup {
			return // read, and never to be answered
		}
	}
	t.Fatal("the FUSE server ended before the lookup came")
}

const (
	fuseLookup = 1
	fuseInit   = 26
)

// serveFUSEUnanswered answers the kernel's INIT and reads the requests
// after it without answering, sending each opcode read to read, until
// it has read a lookup.
func serveFUSEUnanswered(dev int, read chan<- uint32) {
	defer close(read)
	buf := make([]byte, 1<<17)
	for {
		n, err := unix.Read(dev, buf)
		if err != nil || n < 40 {
			return
		}
		op, unique := binary.LittleEndian.Uint32(buf[4:]), binary.LittleEndian.Uint64(buf[8:])
		if op == fuseInit {
			out := make([]byte, 16+64) // fuse_out_header, fuse_init_out
			binary.LittleEndian.PutUint32(out[0:], uint32(len(out)))
			binary.LittleEndian.PutUint64(out[8:], unique)
			binary.LittleEndian.PutUint32(out[16:], 7)    // major
			binary.LittleEndian.PutUint32(out[20:], 31)   // minor
			binary.LittleEndian.PutUint32(out[36:], 4096) // max_write
			if _, err := unix.Write(dev, out); err != nil {
				return
			}
		}
		read <- op
		if op == fuseLookup {
			return
		}
	}
}

// A Trial's process that the kill cannot end (stuck in the kernel) may
// still try things once the counters are read: the receipt says the
// counters may not hold all the Trial did, never "ok".
func TestPrivilegedDestroyPastAnUnkillableProcessIsNoVerdict(t *testing.T) {
	privtest.Require(t)
	cfg := AgentConfig{Host: isolatedHost(t), DataDir: t.TempDir(), ReceiptKey: filepath.Join(t.TempDir(), "receipt.key"), Ephemeral: true, File: &config.File{}}
	a := startAgent(t, cfg)
	const id = "unsure-kill"
	if _, err := a.Create(context.Background(), trialspec.Request{ID: id}); err != nil {
		t.Fatal(err)
	}
	lt, err := a.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	cgroup, cgroupID := lt.tr.Cgroup, lt.tr.CgroupID
	// Left by the destroy, which could not empty it, with its launch
	// locks (marked closing); after the process.
	t.Cleanup(func() {
		if os.Remove(cgroup) == nil {
			sandbox.RemoveLaunchLock(cgroupID)
		}
	})
	stuckInFUSE(t, cgroup)
	st, err := a.Destroy(context.Background(), id)
	if err == nil || !strings.Contains(err.Error(), "still has processes") {
		t.Errorf("destroy: %v; want the kill's failure", err)
	}
	requireUnsureVerdict(t, a, st)
}
