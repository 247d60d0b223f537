//go:build linux

package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/netns"
	"golang.org/x/sys/unix"
)

func clearCloexec(f *os.File) error {
	_, err := unix.FcntlInt(f.Fd(), unix.F_SETFD, 0)
	return err
}

// loaderHelper is a separate loader process: it loads and pins the eBPF
// layer, installs one Trial's policy, says "ready", and waits to be killed.
func loaderHelper() int {
	f := strings.Split(os.Getenv("TRIALNET_LOADER"), "|")
	cgid, _ := strconv.ParseUint(f[2], 10, 64)
	cookie, _ := strconv.ParseUint(f[3], 10, 64)
	l, err := bpf.Load(bpf.Options{Cgroup: f[0], PinDir: f[1]})
	if err == nil {
		err = l.AddTrial(cgid, bpf.Policy{NetnsCookie: cookie, UnixOpen: true})
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
	return 0
}

func TestPrivilegedLoaderKilledEnforcementStays(t *testing.T) {
	privtest.Require(t)
	th := testhost.NewT(t, 63)
	root, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	suffix := randSuffix()
	parent := filepath.Join(root, "trialnet-test-"+suffix)
	cg := filepath.Join(parent, "t")
	pins := bpf.DefaultPinDir + "-test-" + suffix
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = killCgroup(cg, killWait)
		_ = removeCgroup(cg)
		_ = removeCgroup(parent)
	})
	t.Cleanup(func() { _ = bpf.Uninstall(pins) })
	ns, err := netns.Create(t.TempDir(), "t")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	cgid, err := bpf.CgroupID(cg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveLaunchLock(cgid) })

	exe, _ := os.Executable()
	helper := exec.Command(exe)
	helper.Env = append(os.Environ(), fmt.Sprintf("TRIALNET_LOADER=%s|%s|%d|%d", parent, pins, cgid, ns.Cookie))
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		_ = helper.Process.Kill()
		_ = helper.Wait()
		t.Fatalf("loader helper: %q", line)
	}
	tr := &Trial{Launcher: Launcher{ID: "t", Cgroup: cg, CgroupID: cgid, Netns: ns}}
	removePoolsAtCleanup(t, &tr.Launcher)
	if code, out := runProbe(t, tr, "tcp", th.AddrPort4().String()); code != probeRefused {
		t.Fatalf("with the loader alive: exit %d (%s), want refused", code, out)
	}
	_ = helper.Process.Signal(unix.SIGKILL)
	_ = helper.Wait()

	// No loader process at all now: the pins alone enforce.
	lo := listenIn(t, ns, "tcp4", "127.0.0.1:0")
	if code, out := runProbe(t, tr, "tcp", th.AddrPort4().String()); code != probeRefused {
		t.Fatalf("after SIGKILL of the loader: exit %d (%s), want refused", code, out)
	}
	if code, out := runProbe(t, tr, "tcp", lo.String()); code != probeOK {
		t.Fatalf("after SIGKILL of the loader the Trial lost its loopback: exit %d (%s)", code, out)
	}
	if th.WaitArrivals(1, 200*time.Millisecond) {
		t.Fatal("the test host saw traffic")
	}

	// Loading again adopts the pins; the counters carried on.
	l, err := bpf.Load(bpf.Options{Cgroup: parent, PinDir: pins})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := l.Counters(cgid)
	if err != nil {
		t.Fatal(err)
	}
	if c.Connect4Denied < 2 || c.Connect4Allowed < 1 {
		t.Fatalf("counters did not continue across the loader's death: %+v", c)
	}
	if code, _ := runProbe(t, tr, "tcp", th.AddrPort4().String()); code != probeRefused {
		t.Fatal("after re-load: not refused")
	}
	if c2, _ := l.Counters(cgid); c2.Connect4Denied != c.Connect4Denied+1 {
		t.Fatalf("after re-load the counter went from %d to %d, want +1", c.Connect4Denied, c2.Connect4Denied)
	}
}
