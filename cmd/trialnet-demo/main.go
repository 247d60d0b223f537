//go:build linux

// Command trialnet-demo shows a Trial at work on this machine. It makes a
// test upstream (its own network namespace behind a veth pair, serving
// HTTP) and a DNS server that names it, then runs a script in a Trial
// with 'trialnet run --allow api.demo.test:8081': the allowed request goes
// through the proxy; a direct connection, a DNS query, an IP-literal
// CONNECT, a name not on the allowlist and the other ways out fail with
// their reasons; the Trial's counters follow. It removes all it made.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/testhost"
)

const (
	allowedName = "api.demo.test"
	otherName   = "evil.demo.test"
	httpPort    = 8081
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "trialnet-demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) {
	fmt.Printf("\n==> "+format+"\n", args...)
}

func run() error {
	bin := "bin/trialnet"
	if len(os.Args) > 1 {
		bin = os.Args[1]
	}
	// Leave the machine as found: uninstall trialnet afterwards if this
	// demo is what installed it.
	if _, err := os.Stat(bpf.DefaultPinDir); os.IsNotExist(err) {
		defer uninstall(bin)
	}
	th, err := testhost.New(200)
	if err != nil {
		return fmt.Errorf("make the test host: %w", err)
	}
	defer th.Close()
	upstream := netip.AddrPortFrom(th.Addr4, httpPort)
	var requests atomic.Int64
	ln, err := th.NS.Listen(context.Background(), "tcp", upstream.String())
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		fmt.Fprintf(w, "hello from the provider at %s\n", r.Host)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	dnsAddr, stopDNS, err := testhost.ServeDNS(th.Addr4, allowedName)
	if err != nil {
		return err
	}
	defer stopDNS()

	step("a test upstream at %s (its own netns + veth), named %s by a DNS server at %s", upstream, allowedName, dnsAddr)
	if err := showDirect(th); err != nil {
		return err
	}

	step("the same from inside a Trial: sudo trialnet run --allow %s:%d --uid 65534 -- bash -c ...", allowedName, httpPort)
	cmd := exec.Command(bin, "run", "--allow", fmt.Sprintf("%s:%d", allowedName, httpPort),
		"--resolver", dnsAddr, "--allow-cidr", "198.18.200.0/24", "--uid", "65534", "--", "bash", "-c", trialScript(th))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("trialnet run: %w", err)
	}
	if n := requests.Load(); n != 1 {
		return fmt.Errorf("the upstream saw %d requests; only the allowed one was expected", n)
	}
	if n := th.Arrivals(); n != 1 {
		return fmt.Errorf("the test host's canaries saw %d arrivals; only the host's own (1) was expected", n)
	}
	step("the upstream saw exactly the one allowed request; nothing else left the Trial")
	return nil
}

// uninstall removes trialnet again, for a run that found it not installed
// and so installed it itself.
func uninstall(bin string) {
	step("uninstalling trialnet again (the demo installed it): trialnet uninstall")
	cmd := exec.Command(bin, "uninstall")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	_ = cmd.Run()
}

// showDirect connects to the test host without a Trial: what the Trial is
// then refused is the Trial's doing, not an unreachable host.
func showDirect(th *testhost.Host) error {
	c, err := net.DialTimeout("tcp", th.AddrPort4().String(), 2*time.Second)
	if err != nil {
		return fmt.Errorf("the test host is not reachable even without a Trial: %w", err)
	}
	b, _ := io.ReadAll(c)
	_ = c.Close()
	fmt.Print("    the host reaches it directly: ", string(b))
	return nil
}

// trialScript is what the demo runs in the Trial: the allowed request,
// then each way out, printing for each whether it was refused and why.
func trialScript(th *testhost.Host) string {
	ip := th.Addr4.String()
	url := fmt.Sprintf("http://%s:%d/", allowedName, httpPort)
	return strings.Join([]string{
		`echo "inside the Trial as $(id -un); interfaces: $(awk -F: 'NR>2{printf "%s ", $1}' /proc/net/dev); HTTPS_PROXY=$HTTPS_PROXY"`,
		// via: through the proxy with CONNECT, printing the proxy's reason on refusal.
		`via() { out=$(curl -sS -m 5 --proxytunnel -D /tmp/h "$2" 2>&1); rc=$?; r=$(tr -d '\r' </tmp/h 2>/dev/null | sed -n 's/^Trialnet-Reason: //p' | head -n1); rm -f /tmp/h;` +
			` if [ $rc = 0 ]; then echo "  allowed  $1: $out"; else echo "  refused  $1: ${r:-$(echo "$out" | tail -n1)}"; fi; }`,
		`try() { name=$1; shift; if out=$("$@" 2>&1); then echo "  ESCAPED  $name"; else echo "  refused  $name: $(echo "$out" | tail -n1)"; fi; }`,
		`via "` + allowedName + ` through the proxy" ` + url,
		`via "` + otherName + ` (not on the allowlist)" http://` + otherName + fmt.Sprintf(":%d/", httpPort),
		`via "CONNECT to an IP literal" http://` + ip + fmt.Sprintf(":%d/", httpPort),
		`try "direct TCP to the upstream" curl -sS -m 3 --noproxy '*' http://` + ip + fmt.Sprintf(":%d/", httpPort),
		`try "direct TCP over IPv6" curl -sS -m 3 --noproxy '*' http://[` + th.Addr6.String() + `]:8080/`,
		`try "IPv4-mapped IPv6" curl -sS -m 3 --noproxy '*' http://[::ffff:` + ip + `]:8080/`,
		`try "a DNS query (UDP to the upstream's port 53)" bash -c 'printf "\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03api\x04demo\x04test\x00\x00\x01\x00\x01" > /dev/udp/` + ip + `/53'`,
		`try "a DNS query over TCP" bash -c ': </dev/tcp/` + ip + `/53'`,
		`try "UDP to the upstream" bash -c 'echo x > /dev/udp/` + ip + `/8080'`,
		`try "the host's own address" curl -sS -m 3 --noproxy '*' http://` + th.Local4.String() + `:22/`,
		`try "the Docker socket" curl -sS -m 3 --unix-socket /var/run/docker.sock http://x/`,
		fmt.Sprintf(`try "signal a process outside the Trial (this demo, pid %d)" kill -0 %d`, os.Getpid(), os.Getpid()),
		`try "an AF_VSOCK socket (to the hypervisor)" perl -e 'socket(my $s, 40, 1, 0) or die "$!\n"'`,
		`try "a user namespace (for a mount over an allowed socket)" unshare -Ur true`,
	}, "\n")
}
