//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
)

// A bad flag or config stops the proxy before it listens.
func TestProxyRefusesBadInputBeforeListening(t *testing.T) {
	badConfig := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(badConfig, []byte("profiles:\n  x: ['*.co.uk:443']\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "nothing is allowed"},
		{[]string{"--allow", "*.com:443"}, "too broad"},
		{[]string{"--allow", "*.s3.amazonaws.com:443"}, "is a public suffix (private section"},
		{[]string{"--allow", "*.compute.amazonaws.com:443"}, "every name directly under"},
		{[]string{"--allow", "127.0.0.1:443"}, "IP address"},
		{[]string{"--allow", "api.anthropic.com"}, "host:port"},
		{[]string{"--profile", "claude"}, "--config"},
		{[]string{"--profile", "nosuch", "--config", "../../examples/trialnet.yaml"}, "unknown profile"},
		{[]string{"--profile", "claude-gateway", "--config", "../../examples/trialnet.yaml"}, "credential gateway routes"},
		{[]string{"--config", badConfig, "--allow", "a.example.com:443"}, "too broad"},
		{[]string{"--config", "/nonexistent.yaml", "--allow", "a.example.com:443"}, "no such file"},
		{[]string{"--allow", "a.example.com:443", "--allow-cidr", "0.0.0.0/0"}, "never be allowed"},
		{[]string{"--allow", "a.example.com:443", "--resolver", "dns.google"}, "want an IP address"},
		{[]string{"--allow", "a.example.com:443", "--bogus"}, "not defined"},
	} {
		addr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
		var out, errOut bytes.Buffer
		code := serveProxy(context.Background(), append(tc.args, "--listen", addr), &out, &errOut, func([]net.Addr) {
			t.Errorf("%v: the proxy started listening", tc.args)
		})
		if code != exitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want %d mentioning %q", tc.args, code, errOut.String(), exitUsage, tc.want)
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			t.Errorf("%v: something listens on %s", tc.args, addr)
		}
	}
}

// The standalone proxy tunnels to an allowed name (a test host), refuses
// others with a reason, and writes one JSON decision line per CONNECT.
func TestPrivilegedProxyCommand(t *testing.T) {
	privtest.Require(t)
	th := testhost.NewT(t, 211)
	dnsAddr, stopDNS, err := testhost.ServeDNS(th.Addr4, "upstream.example.com")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopDNS)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan []net.Addr, 1)
	var out privtest.SyncBuffer
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- serveProxy(ctx, []string{"--listen", "127.0.0.1:0", "--allow", fmt.Sprintf("upstream.example.com:%d", testhost.Port),
			"--resolver", dnsAddr, "--allow-cidr", "198.18.0.0/15", "--trial", "cli"}, &out, &errOut, func(a []net.Addr) { ready <- a })
	}()
	var addrs []net.Addr
	select {
	case addrs = <-ready:
	case code := <-done:
		t.Fatalf("proxy exited %d: %s", code, errOut.String())
	}
	for target, want := range map[string]int{
		fmt.Sprintf("upstream.example.com:%d", testhost.Port): 200,
		"other.example.com:443":                               403,
		th.AddrPort4().String():                               403,
	} {
		c, err := net.Dial("tcp", addrs[0].String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != want {
			t.Fatalf("%s: %v %v, want %d", target, resp, err, want)
		}
		_ = c.Close()
	}
	if !th.WaitArrivals(1, 5*time.Second) {
		t.Fatal("the allowed CONNECT did not reach the test host")
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	reasons := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		if rec["trial"] != "cli" {
			t.Fatalf("record without the Trial: %q", line)
		}
		reasons[rec["reason"].(string)] = true
	}
	for _, r := range []string{"allowed", "policy_denied", "ip_literal"} {
		if !reasons[r] {
			t.Errorf("no %s record in:\n%s", r, out.String())
		}
	}
}

// --pprof-dir leaves the profiles docs/performance.md was measured with.
func TestProxyPprofDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "prof")
	runProxyProfiled(t, dir)
	for _, name := range profileNames {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
}

var profileNames = []string{"cpu.pprof", "trace.out", "block.pprof", "mutex.pprof"}

// A --pprof-dir others can write (/tmp/prof, as the docs show) holds
// what they planted at the profiles' names: symlinks and hard links to a
// file of the proxy's user (root's /etc/shadow, for a proxy run by root),
// which a profile written through them would truncate and overwrite.
// Seen red with startProfiles's os.Create back: every victim overwritten.
func TestProxyPprofDirFollowsNoLink(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "prof")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	victims := t.TempDir()
	for i, name := range profileNames {
		victim := filepath.Join(victims, name)
		if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		plant := os.Symlink
		if i%2 == 1 {
			plant = os.Link
		}
		if err := plant(victim, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	runProxyProfiled(t, dir)
	for _, name := range profileNames {
		if b, err := os.ReadFile(filepath.Join(victims, name)); err != nil || string(b) != "precious\n" {
			t.Errorf("the file a link planted at %s led to was written through: %d bytes, %v", name, len(b), err)
		}
		if st, err := os.Lstat(filepath.Join(dir, name)); err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
			t.Errorf("%s is no profile of its own: %v %v", name, st, err)
		}
	}
}

// runProxyProfiled serves one refused CONNECT with --pprof-dir dir.
func runProxyProfiled(t *testing.T, dir string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan []net.Addr, 1)
	var out, errOut privtest.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- serveProxy(ctx, []string{"--listen", "127.0.0.1:0", "--allow", "api.example.com:443", "--resolver", "127.0.0.1:1",
			"--pprof-dir", dir}, &out, &errOut, func(a []net.Addr) { ready <- a })
	}()
	var addrs []net.Addr
	select {
	case addrs = <-ready:
	case code := <-done:
		t.Fatalf("proxy exited %d: %s", code, errOut.String())
	}
	c, err := net.Dial("tcp", addrs[0].String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT other.example.com:443 HTTP/1.1\r\nHost: other.example.com:443\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("%v %v", resp, err)
	}
	_ = c.Close()
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
}
