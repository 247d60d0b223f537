//go:build linux

package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/dnsstub"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/trial"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The sandbox's transparent addresses are the stub's and the BPF
// policy's: a Trial whose lo, policy and resolv.conf named another stub
// or pool than the agent serves would fail every lookup.
func TestTransparentAddressesAgree(t *testing.T) {
	if transparentPool != netip.MustParsePrefix(dnsstub.DefaultPoolCIDR) {
		t.Errorf("pool %s, dnsstub's %s", transparentPool, dnsstub.DefaultPoolCIDR)
	}
	stub := netip.MustParseAddrPort(dnsstub.DefaultListen)
	if stub != netip.MustParseAddrPort(bpf.StubAddr) {
		t.Errorf("dnsstub listens on %s, the BPF policy allows %s", stub, bpf.StubAddr)
	}
	if transparentLo[0] != netip.PrefixFrom(stub.Addr(), 32) {
		t.Errorf("lo carries %s, the stub listens on %s", transparentLo[0], stub)
	}
	if !strings.Contains(trial.ResolvConf, "\nnameserver "+stub.Addr().String()+"\n") || strings.Count(trial.ResolvConf, "nameserver") != 1 {
		t.Errorf("resolv.conf names another server than %s:\n%s", stub.Addr(), trial.ResolvConf)
	}
	if err := bpf.CheckPool(transparentPool); err != nil {
		t.Error(err)
	}
}

// resolvResult is what resolvHelper saw in its mount namespace.
type resolvResult struct {
	Err      string `json:"err,omitempty"`
	Content  string `json:"content"`
	WriteErr string `json:"write_err"`
	Target   string `json:"target"`   // the symlink's target, read by its own path
	Hosts    string `json:"hosts"`    // a neighbour file in the same directory
	NewFile  string `json:"new_file"` // making a file beside it
}

// resolvHelper runs mountResolvConf in a mount namespace of its own (the
// test starts it with one), as a Trial's init does, and reports what the
// paths then read: TRIALNET_RESOLV is "path scratch".
func resolvHelper() int {
	var r resolvResult
	path, scratch, _ := strings.Cut(os.Getenv("TRIALNET_RESOLV"), " ")
	dir := filepath.Dir(path)
	_, absent := os.Lstat(path)
	if err := mountResolvConf(path, scratch, false); err != nil {
		r.Err = err.Error()
	} else {
		b, err := os.ReadFile(path)
		r.Content = string(b) + errString(err)
		r.WriteErr = errString(openWrite(path))
		b, _ = os.ReadFile(filepath.Join(dir, "../run/systemd/resolve/stub-resolv.conf"))
		r.Target = string(b)
		b, _ = os.ReadFile(filepath.Join(dir, "hosts"))
		r.Hosts = string(b)
		if absent != nil { // elsewhere the directory is the host's, and writable
			r.NewFile = errString(os.WriteFile(filepath.Join(dir, "new"), nil, 0o644))
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return errName(err)
}

// snapshot is every file below dir with its content, mode and inode, and
// each symlink with its target: what the host has, which no Trial may change.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		v := fmt.Sprintf("%v ino=%d mtime=%d", fi.Mode(), st.Ino, st.Mtim.Nano())
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			v += " -> " + l
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			v += " " + string(b)
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A transparent Trial's resolv.conf names its stub, read-only, whatever
// the host has at the path (a file, systemd-resolved's symlink, a
// dangling symlink, nothing); the host's files are not written, and
// outside the Trial's mount namespace the path reads as before.
func TestPrivilegedResolvConfWhateverTheHostHas(t *testing.T) {
	privtest.Require(t)
	hostFile := "nameserver 192.0.2.1\nsearch corp.example\n"
	resolved := "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch .\n"
	const link = "../run/systemd/resolve/stub-resolv.conf"
	for _, c := range []struct {
		name    string
		make    func(t *testing.T, root string)
		wantErr string
	}{
		{"file", func(t *testing.T, root string) { write(t, root+"/etc/resolv.conf", hostFile) }, ""},
		{"symlink to systemd-resolved's", func(t *testing.T, root string) {
			write(t, root+"/run/systemd/resolve/stub-resolv.conf", resolved)
			linkAt(t, link, root+"/etc/resolv.conf")
		}, ""},
		{"dangling symlink", func(t *testing.T, root string) { linkAt(t, link, root+"/etc/resolv.conf") }, ""},
		{"absent", func(t *testing.T, root string) {}, ""},
		{"a directory", func(t *testing.T, root string) {
			if err := os.Mkdir(root+"/etc/resolv.conf", 0o755); err != nil {
				t.Fatal(err)
			}
		}, "is a directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root+"/etc/hosts", "127.0.0.1 localhost\n")
			if err := os.Mkdir(root+"/scratch", 0o755); err != nil {
				t.Fatal(err)
			}
			c.make(t, root)
			before := snapshot(t, root)
			r := runResolvHelper(t, root+"/etc/resolv.conf", root+"/scratch")
			if after := snapshot(t, root); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("the host's files changed:\nbefore %v\nafter  %v", before, after)
			}
			if c.wantErr != "" {
				if !strings.Contains(r.Err, c.wantErr) || !strings.Contains(r.Err, "--no-transparent") {
					t.Fatalf("got %+v, want an error saying %q and what to do", r, c.wantErr)
				}
				return
			}
			if r.Err != "" {
				t.Fatal(r.Err)
			}
			if r.Content != trial.ResolvConf {
				t.Errorf("the Trial's resolv.conf reads %q", r.Content)
			}
			if r.WriteErr != "EROFS" {
				t.Errorf("writing the Trial's resolv.conf: %q, want EROFS", r.WriteErr)
			}
			if r.Hosts != "127.0.0.1 localhost\n" {
				t.Errorf("its neighbour reads %q", r.Hosts)
			}
			if c.name == "symlink to systemd-resolved's" && r.Target != resolved {
				t.Errorf("the symlink's target, the host's, reads %q in the Trial", r.Target)
			}
			if c.name == "absent" && r.NewFile != "EROFS" {
				t.Errorf("making a file beside it: %q, want EROFS (a read-only overlay)", r.NewFile)
			}
		})
	}
	// A host directory with mounts below it cannot be overlaid without
	// hiding them: refused, saying what to do.
	t.Run("absent, with a mount below", func(t *testing.T) {
		root := t.TempDir()
		if err := os.MkdirAll(root+"/etc/sub", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(root+"/scratch", 0o755); err != nil {
			t.Fatal(err)
		}
		r := runResolvHelper(t, root+"/etc/resolv.conf", root+"/scratch", root+"/etc/sub")
		if !strings.Contains(r.Err, "hide the mount at "+root+"/etc/sub") {
			t.Fatalf("got %+v, want a refusal naming the mount", r)
		}
	})
}

// runResolvHelper runs resolvHelper in a new mount namespace (made
// private by the runtime: nothing propagates back), with a tmpfs first
// mounted on each of submounts there.
func runResolvHelper(t *testing.T, path, scratch string, submounts ...string) resolvResult {
	t.Helper()
	script := ""
	for _, m := range submounts {
		script += "mount -t tmpfs none " + m + " && "
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", script+"exec \"$0\"", self)
	cmd.Env = []string{"TRIALNET_RESOLV=" + path + " " + scratch, "PATH=/usr/bin:/bin:/usr/sbin:/sbin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWNS}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("resolv helper: %v: %s", err, stderr.Bytes())
	}
	var r resolvResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("resolv helper said %q: %v", out, err)
	}
	return r
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func linkAt(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// A transparent Trial, on this host's own /etc/resolv.conf: it reads the
// stub's, cannot write or unmount it, and its lo carries the stub's
// address and the IPv6 one AI_ADDRCONFIG needs; a Trial beside it
// without transparent mode reads the host's, and the host's is unchanged.
func TestPrivilegedTransparentTrialNames(t *testing.T) {
	h := newHost(t)
	hostBefore, hostErr := os.ReadFile(resolvPath) // absent is a case too
	var before, after unix.Stat_t
	_ = unix.Lstat(resolvPath, &before)

	tr := newTrial(t, h, trial.Spec{Transparent: true, UnixOpen: true})
	plain := newTrial(t, h, trial.Spec{UnixOpen: true})
	code, out := runProbe(t, tr, "read", resolvPath)
	if code != probeOK || out != strings.TrimSpace(trial.ResolvConf+"ok") {
		t.Fatalf("the transparent Trial's resolv.conf: exit %d, %q", code, out)
	}
	if code, out := runProbe(t, tr, "open-write", resolvPath); code != probeOther || out != "EROFS" {
		t.Errorf("writing it: exit %d, %s; want EROFS", code, out)
	}
	if code, out := runProbe(t, tr, "umount", resolvPath); code != probeRefused {
		t.Errorf("unmounting it: exit %d, %s; want EPERM", code, out)
	}
	if code, out := runProbe(t, tr, "read", resolvPath); code != probeOK || !strings.Contains(out, "nameserver 127.0.0.53") {
		t.Errorf("after the attempts it reads %q", out)
	}
	code, out = runProbe(t, plain, "read", resolvPath)
	if hostErr == nil && (code != probeOK || out != strings.TrimSpace(string(hostBefore)+"ok")) {
		t.Errorf("a Trial without transparent mode reads %q (exit %d), the host has %q", out, code, hostBefore)
	}
	if hostNow, err := os.ReadFile(resolvPath); !bytes.Equal(hostNow, hostBefore) || (err == nil) != (hostErr == nil) {
		t.Errorf("the host's resolv.conf changed: %q (%v), was %q (%v)", hostNow, err, hostBefore, hostErr)
	}
	if err := unix.Lstat(resolvPath, &after); err == nil && (after.Ino != before.Ino || after.Mtim != before.Mtim) {
		t.Errorf("the host's resolv.conf changed: inode %d mtime %v, was %d %v", after.Ino, after.Mtim, before.Ino, before.Mtim)
	}

	for _, c := range []struct {
		tr   *Trial
		want []string
	}{
		{tr, []string{"127.0.0.1/8", "127.0.0.53/32", "::1/128", "fd7a:7472:6e73::53/128"}},
		{plain, []string{"127.0.0.1/8", "::1/128"}},
	} {
		if got := loAddrsOf(t, c.tr); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Trial %s (transparent %v): lo carries %v, want %v", c.tr.ID, c.tr.Spec.Transparent, got, c.want)
		}
	}
}

// loAddrsOf lists the addresses on tr's lo, IPv4 first.
func loAddrsOf(t testing.TB, tr *Trial) []string {
	t.Helper()
	var got []string
	err := tr.Netns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			as, err := netlink.AddrList(lo, fam)
			if err != nil {
				return err
			}
			for _, a := range as {
				got = append(got, a.IPNet.String())
			}
			slices.Sort(got[len(got)-len(as):])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// In strict mode, transparent mode adds TCP to any port of the pool and
// UDP and TCP to the stub's 127.0.0.53:53, judged the same through an
// IPv4-mapped IPv6 address; nothing else, and without transparent mode
// not those either. Every refusal is counted where it was before.
func TestPrivilegedStrictTransparentAllowsPoolAndStub(t *testing.T) {
	h := newHost(t)
	h.Proxy = []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:3128")}
	tr := newTrial(t, h, trial.Spec{Strict: true, Transparent: true, UnixOpen: true})
	plain := newTrial(t, h, trial.Spec{Strict: true, UnixOpen: true})
	pool1 := listenIn(t, tr.Netns, "tcp4", "127.100.0.7:0")
	pool2 := listenIn(t, tr.Netns, "tcp4", "127.100.255.254:0")
	other := listenIn(t, tr.Netns, "tcp4", "127.0.0.1:0")
	lo2 := listenIn(t, tr.Netns, "tcp4", "127.0.0.2:0")
	outside := listenIn(t, tr.Netns, "tcp4", "127.101.0.1:0")
	stubOther := listenIn(t, tr.Netns, "tcp4", "127.0.0.53:54")
	listenIn(t, tr.Netns, "tcp4", bpf.StubAddr)
	// The same listeners beside the Trial without transparent mode.
	listenIn(t, plain.Netns, "tcp4", pool1.String())
	listenIn(t, plain.Netns, "tcp4", bpf.StubAddr)
	mapped := func(ap netip.AddrPort) string {
		return netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port()).String()
	}
	stub := netip.MustParseAddrPort(bpf.StubAddr)
	poolUDP := netip.AddrPortFrom(pool1.Addr(), 53)
	checkAttempts(t, tr, []attempt{
		{"pool", []string{"tcp", pool1.String()}, probeOK, "connect4_allowed"},
		{"pool, another address and port", []string{"tcp", pool2.String()}, probeOK, "connect4_allowed"},
		{"pool v4-mapped", []string{"tcp", mapped(pool2)}, probeOK, "connect6_allowed"},
		{"stub tcp", []string{"tcp", bpf.StubAddr}, probeOK, "connect4_allowed"},
		{"stub udp sendto", []string{"udp-sendto", bpf.StubAddr}, probeOK, "sendmsg4_allowed"},
		{"stub udp connect", []string{"udp-connect", bpf.StubAddr}, probeOK, "connect4_allowed"},
		{"stub tcp v4-mapped", []string{"tcp", mapped(stub)}, probeOK, "connect6_allowed"},
		// An IPv6 socket's datagram to a v4-mapped address goes by IPv4's
		// UDP, whose hook judges it (udpv6_sendmsg hands it over first).
		{"stub udp sendto v4-mapped", []string{"udp-sendto", mapped(stub)}, probeOK, "sendmsg4_allowed"},
		{"proxy, still", []string{"tcp", "127.0.0.1:3128"}, probeOther, "connect4_allowed"}, // nothing listens: ECONNREFUSED, past the hook
		{"another port on 127.0.0.1", []string{"tcp", other.String()}, probeRefused, "connect4_denied"},
		{"127.0.0.2", []string{"tcp", lo2.String()}, probeRefused, "connect4_denied"},
		{"127.0.0.2 v4-mapped", []string{"tcp", mapped(lo2)}, probeRefused, "connect6_denied"},
		{"next to the pool", []string{"tcp", outside.String()}, probeRefused, "connect4_denied"},
		{"another port on the stub's address", []string{"tcp", stubOther.String()}, probeRefused, "connect4_denied"},
		{"udp sendto the pool", []string{"udp-sendto", poolUDP.String()}, probeRefused, "sendmsg4_denied"},
		{"udp connect the pool", []string{"udp-connect", poolUDP.String()}, probeRefused, "connect4_denied"},
		{"udp sendto the pool v4-mapped", []string{"udp-sendto", mapped(poolUDP)}, probeRefused, "sendmsg4_denied"},
		{"udp sendto 127.0.0.1:53", []string{"udp-sendto", "127.0.0.1:53"}, probeRefused, "sendmsg4_denied"},
		{"stub's IPv6 address", []string{"tcp", "[fd7a:7472:6e73::53]:53"}, probeRefused, "connect6_denied"},
		{"stub's IPv6 address udp", []string{"udp-sendto", "[fd7a:7472:6e73::53]:53"}, probeRefused, "sendmsg6_denied"},
	})
	t.Run("without transparent mode", func(t *testing.T) {
		checkAttempts(t, plain, []attempt{
			{"pool", []string{"tcp", pool1.String()}, probeRefused, "connect4_denied"},
			{"pool v4-mapped", []string{"tcp", mapped(pool1)}, probeRefused, "connect6_denied"},
			{"stub tcp", []string{"tcp", bpf.StubAddr}, probeRefused, "connect4_denied"},
			{"stub udp sendto", []string{"udp-sendto", bpf.StubAddr}, probeRefused, "sendmsg4_denied"},
			{"stub udp sendto v4-mapped", []string{"udp-sendto", mapped(stub)}, probeRefused, "sendmsg4_denied"},
		})
	})
}

// Outside strict mode all of 127.0.0.0/8 was allowed before transparent
// mode, UDP sends included: the stub and the pool need nothing more, and
// the stub's IPv6 address stays unreachable.
func TestPrivilegedTransparentOutsideStrict(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{Transparent: true, UnixOpen: true})
	pool := listenIn(t, tr.Netns, "tcp4", "127.100.0.7:0")
	listenIn(t, tr.Netns, "tcp4", bpf.StubAddr)
	checkAttempts(t, tr, []attempt{
		{"pool", []string{"tcp", pool.String()}, probeOK, "connect4_allowed"},
		{"stub tcp", []string{"tcp", bpf.StubAddr}, probeOK, "connect4_allowed"},
		{"stub udp sendto", []string{"udp-sendto", bpf.StubAddr}, probeOK, "sendmsg4_allowed"},
		{"stub udp sendto v4-mapped", []string{"udp-sendto", "[::ffff:127.0.0.53]:53"}, probeOK, "sendmsg4_allowed"},
		{"stub's IPv6 address", []string{"tcp", "[fd7a:7472:6e73::53]:53"}, probeRefused, "connect6_denied"},
		{"stub's IPv6 address udp", []string{"udp-sendto", "[fd7a:7472:6e73::53]:53"}, probeRefused, "sendmsg6_denied"},
	})
}

// The stub is a transparent Trial's only resolver: the network layers
// let it reach nothing but its loopback, and a host resolver's unix
// socket (systemd-resolved's varlink, nscd, D-Bus for resolve1, avahi,
// sssd) is refused by unix confinement like any host socket. A stand-in
// at a path of the test's shows it on every host; the real ones where
// this host has them. A Trial that opts out of unix confinement reaches
// the stand-in: the refusal is the confinement's.
func TestPrivilegedNoHostResolverSocket(t *testing.T) {
	h := newHost(t)
	standIn := filepath.Join(privtest.SharedDir(t, "resolver-"), "io.systemd.Resolve")
	self, err := netns.Open(filepath.Dir(selfNetns()), filepath.Base(selfNetns()))
	if err != nil {
		t.Fatal(err)
	}
	listenUnixIn(t, self, standIn, false)
	tr := newTrial(t, h, trial.Spec{Transparent: true})
	denied := "unix_connect_denied"
	if h.BPF.LSM() {
		denied = "unix_identity_denied"
	}
	attempts := []attempt{{"stand-in for systemd-resolved's varlink", []string{"unix", standIn}, probeRefused, denied}}
	for _, p := range []string{"/run/systemd/resolve/io.systemd.Resolve", "/run/nscd/socket", "/var/run/nscd/socket",
		"/run/dbus/system_bus_socket", "/run/avahi-daemon/socket", "/var/lib/sss/pipes/nss"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			attempts = append(attempts, attempt{p, []string{"unix", p}, probeRefused, denied})
		}
	}
	checkAttempts(t, tr, attempts)
	open := newTrial(t, h, trial.Spec{Transparent: true, UnixOpen: true})
	if code, out := runProbe(t, open, "unix", standIn); code != probeOK {
		t.Fatalf("a Trial without unix confinement: exit %d (%s), want the stand-in reached", code, out)
	}
}
