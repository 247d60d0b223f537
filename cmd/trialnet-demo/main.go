//go:build linux

// Command trialnet-demo shows a Trial at work on this machine: it makes a
// test host (its own network namespace behind a veth pair), shows that the
// host can reach it, then runs commands in a Trial with 'trialnet run' and
// shows every way out refused and counted. It removes all it made.
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/testhost"
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
		defer func() {
			step("uninstalling trialnet again (the demo installed it): trialnet uninstall")
			cmd := exec.Command(bin, "uninstall")
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			_ = cmd.Run()
		}()
	}
	th, err := testhost.New(200)
	if err != nil {
		return fmt.Errorf("make the test host: %w", err)
	}
	defer th.Close()

	step("a test host at %s (its own netns + veth) answers the host directly", th.AddrPort4())
	c, err := net.DialTimeout("tcp", th.AddrPort4().String(), 2*time.Second)
	if err != nil {
		return fmt.Errorf("the test host is not reachable even without a Trial: %w", err)
	}
	b, _ := io.ReadAll(c)
	_ = c.Close()
	fmt.Print("    ", string(b))

	target4 := th.AddrPort4().String()
	script := strings.Join([]string{
		`echo "inside the Trial as $(id -un), network interfaces: $(awk -F: 'NR>2{printf "%s ", $1}' /proc/net/dev)"`,
		`try() { name=$1; shift; if out=$("$@" 2>&1); then echo "  ESCAPED  $name"; else echo "  refused  $name: $(echo "$out" | tail -n1)"; fi; }`,
		`try "TCP to the test host" curl -sS -m 3 http://` + target4 + `/`,
		`try "TCP over IPv6 to the test host" curl -sS -m 3 http://[` + th.Addr6.String() + `]:8080/`,
		`try "IPv4-mapped IPv6 to the test host" curl -sS -m 3 http://[::ffff:` + th.Addr4.String() + `]:8080/`,
		`try "UDP to the test host" bash -c 'echo x > /dev/udp/` + strings.ReplaceAll(target4, ":", "/") + `'`,
		`try "the host's own address" curl -sS -m 3 http://` + th.Local4.String() + `:22/`,
		`try "the Docker socket path" curl -sS -m 3 --unix-socket /var/run/docker.sock http://x/`,
	}, "\n")

	step("the same attempts from inside a Trial: sudo trialnet run --uid 65534 -- bash -c ...")
	cmd := exec.Command(bin, "run", "--uid", "65534", "--", "bash", "-c", script)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("trialnet run: %w", err)
	}
	if n := th.Arrivals(); n != 1 {
		return fmt.Errorf("the test host saw %d connections; only the host's own (1) was expected", n)
	}
	step("the test host saw only the host's own connection: nothing left the Trial")
	return nil
}
