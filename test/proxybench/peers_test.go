//go:build linux

package proxybench

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/internal/testkit"
)

// smokescreenModule is the pinned peer version, built into the run's temp
// dir: it is not a dependency of ours, so it stays out of go.mod.
const smokescreenModule = "github.com/stripe/smokescreen@v0.1.0"

// peer is one proxy the benchmark compares with trialnet.
type peer struct {
	name string
	// target is what the CONNECT asks for: the name where the peer can
	// resolve it through the test DNS server, else the address.
	target string
	start  func() (*process, error)
}

// peers lists trialnet first, then the others. What each is given:
//   - trialnet: the name, resolved through the test DNS server
//     (--resolver), allowed by name and port, limits far above the load;
//   - tinyproxy: the address (it has no resolver option), CONNECT to the
//     bench port only;
//   - squid: the address (its dns_nameservers takes no port), CONNECT to
//     the bench port only, no disk cache, no access log;
//   - smokescreen: the name, resolved through the test DNS server
//     (--resolver-address), the test host's range allowed (it denies
//     non-global ranges by default), no egress ACL;
//   - naive Go: the address (it uses the system resolver);
//   - epoll ceiling (not a peer: left out of the best peer and of the
//     bold): the address; what an event loop leaves trialnet's proxy
//     when its checks cost nothing (./epollproxy);
//   - reuseport ceiling (not a peer either): the same with one event
//     loop per CPU (-reuseport-threads), each with its own SO_REUSEPORT
//     listener: the most an event-loop design gets from the machine's
//     cores.
func (e *env) peers() []peer {
	name := fmt.Sprintf("%s:%d", upstreamName, benchPort)
	addr := e.upstream.String()
	ps := []peer{
		{"trialnet", name, e.startTrialnet},
		{"tinyproxy", addr, e.startTinyproxy},
		{"squid", addr, e.startSquid},
		{"smokescreen", name, e.startSmokescreen},
		{"naive Go", addr, e.startNaive},
		{ceilingRoute, addr, func() (*process, error) { return e.startEpoll(1) }},
		{reuseportRoute, addr, func() (*process, error) { return e.startEpoll(*reuseportThreads) }},
	}
	for _, b := range baselines() {
		ps = append(ps, peer{b.route, name, func() (*process, error) { return e.startTrialnetBin(b.bin) }})
	}
	return ps
}

// ceilingRoute and reuseportRoute are ./epollproxy's routes, with one
// event loop and with one per CPU: references, not peers.
const (
	ceilingRoute   = "epoll ceiling"
	reuseportRoute = "reuseport ceiling"
)

// isReference reports whether route is a reference rather than a peer:
// left out of the best peer and of the bold.
func isReference(route string) bool {
	return route == "direct" || route == ceilingRoute || route == reuseportRoute || strings.HasPrefix(route, baselinePrefix)
}

// baseline is another build of trialnet run beside this tree's.
type baseline struct{ route, bin string }

// baselines parses TRIALNET_BASELINE_BIN: a comma-separated list of
// builds, each PATH or LABEL=PATH. A lone PATH is the route "trialnet,
// baseline build"; a LABEL makes the route "trialnet, LABEL", so that
// several candidates can run in one interleaved run.
func baselines() []baseline {
	env := os.Getenv("TRIALNET_BASELINE_BIN")
	if env == "" {
		return nil
	}
	var bs []baseline
	for _, item := range strings.Split(env, ",") {
		label, bin, ok := strings.Cut(item, "=")
		if !ok {
			label, bin = "baseline build", item
		}
		bs = append(bs, baseline{baselinePrefix + label, bin})
	}
	return bs
}

// build compiles what the peers need into e.dir: trialnet, the naive
// proxy, the event-loop ceiling and smokescreen.
func (e *env) build() error {
	for _, c := range []*exec.Cmd{
		exec.Command("go", "build", "-o", filepath.Join(e.dir, "trialnet"), "../../cmd/trialnet"),
		exec.Command("go", "build", "-o", filepath.Join(e.dir, "naiveproxy"), "./naiveproxy"),
		exec.Command("go", "build", "-o", filepath.Join(e.dir, "epollproxy"), "./epollproxy"),
		exec.Command("go", "install", smokescreenModule),
	} {
		c.Env = append(os.Environ(), "GOBIN="+e.dir)
		if out, err := c.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(c.Args, " "), err, out)
		}
	}
	return nil
}

// baselinePrefix starts the route of another build of trialnet (TRIALNET_BASELINE_BIN, an
// earlier commit's, say) run in the same rounds: a change's effect, side
// by side. It is neither a peer nor trialnet in the ratios.
const baselinePrefix = "trialnet, "

// startTrialnet starts this tree's `trialnet proxy`.
func (e *env) startTrialnet() (*process, error) {
	return e.startTrialnetBin(filepath.Join(e.dir, "trialnet"))
}

// startTrialnetBin starts a `trialnet proxy` process of bin allowing the
// upstream by name.
func (e *env) startTrialnetBin(bin string) (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	// Limits far above what the benchmark does: it measures speed, not limits.
	cfg := filepath.Join(e.dir, "trialnet.yaml")
	if err := os.WriteFile(cfg, []byte("limits: {max_tunnels: 100000, max_client_connections: 100000, max_pending_heads: 100000, connects_per_second: 1000000, connect_burst: 1000000}\nmax_connections: 100000\n"), 0o644); err != nil {
		return nil, err
	}
	return e.start("trialnet", addr, bin, "proxy", "--config", cfg, "--listen", addr, "--trial", "bench",
		"--allow", fmt.Sprintf("%s:%d", upstreamName, benchPort), "--resolver", e.dnsAddr, "--allow-cidr", "198.18.0.0/15")
}

// startTinyproxy starts tinyproxy allowing CONNECT to the upstream port.
func (e *env) startTinyproxy() (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	tiny, err := exec.LookPath("tinyproxy")
	if err != nil {
		return nil, fmt.Errorf("tinyproxy is not installed (make bench-deps installs it): %w", err)
	}
	conf := filepath.Join(e.dir, "tinyproxy-"+port(addr)+".conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(
		"Port %s\nListen 127.0.0.1\nTimeout 600\nMaxClients 4096\nConnectPort %d\nAllow 127.0.0.1\nLogLevel Critical\nDisableViaHeader Yes\n",
		port(addr), benchPort)), 0o644); err != nil {
		return nil, err
	}
	return e.start("tinyproxy", addr, tiny, "-d", "-c", conf)
}

// startSquid runs squid in the foreground (-N: no daemon, no workers)
// with a config, pid file and log of its own in a fresh directory. Run
// as root, squid drops to the proxy user, which must own that directory.
func (e *env) startSquid() (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	squid, err := exec.LookPath("squid")
	if err != nil {
		return nil, fmt.Errorf("squid is not installed (make bench-deps installs it): %w", err)
	}
	dir := filepath.Join(e.dir, "squid-"+port(addr))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	u, err := user.Lookup("proxy")
	if err != nil {
		return nil, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	// dns_nameservers: squid needs no DNS here (it gets the address), and
	// must send no query off the machine should it try one anyway.
	conf := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`http_port %s
acl CONNECT method CONNECT
acl bench_port port %d
http_access allow CONNECT bench_port localhost
http_access deny all
pid_filename %[3]s/squid.pid
cache_log %[3]s/cache.log
coredump_dir %[3]s
access_log none
cache_store_log none
cache deny all
dns_nameservers 127.0.0.1
shutdown_lifetime 0 seconds
pinger_enable off
netdb_filename none
digest_generation off
logfile_rotate 0
via off
forwarded_for delete
`, addr, benchPort, dir)), 0o644); err != nil {
		return nil, err
	}
	return e.start("squid", addr, squid, "-N", "-f", conf)
}

// startSmokescreen runs the pinned smokescreen, resolving through the
// test DNS server. Its statsd metrics go to a UDP socket of the run that
// nobody reads, not to whatever may listen on its default port.
func (e *env) startSmokescreen() (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return e.start("smokescreen", addr, filepath.Join(e.dir, "smokescreen"),
		"--listen-ip", "127.0.0.1", "--listen-port", port(addr),
		"--resolver-address", e.dnsAddr, "--allow-range", "198.18.0.0/15",
		"--statsd-address", e.statsd.LocalAddr().String())
}

// startNaive runs the naive net/http proxy (./naiveproxy).
func (e *env) startNaive() (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return e.start("naiveproxy", addr, filepath.Join(e.dir, "naiveproxy"), "--listen", addr)
}

// startEpoll runs the event-loop ceiling (./epollproxy) with threads
// event loops.
func (e *env) startEpoll(threads int) (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return e.start("epollproxy", addr, filepath.Join(e.dir, "epollproxy"), "--listen", addr, "--threads", strconv.Itoa(threads))
}

type process struct {
	cmd  *exec.Cmd
	addr string
	stop func()
}

// start runs a proxy process and waits until it accepts connections. Its
// output (trialnet's decision records, smokescreen's request log) goes to
// a file in the run's temp dir, as it would in use.
func (e *env) start(name, addr, path string, args ...string) (*process, error) {
	logPath := filepath.Join(e.dir, name+"-"+port(addr)+".log")
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, addr: addr}
	p.stop = sync.OnceFunc(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	e.cleanup = append(e.cleanup, p.stop)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			return p, nil
		}
	}
	p.stop()
	out, _ := os.ReadFile(logPath)
	return nil, fmt.Errorf("%s did not start listening on %s: %s", path, addr, out)
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func port(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// treeRSSBytes sums the resident memory of pid and its descendants.
func treeRSSBytes(pid int) int64 {
	total := int64(0)
	for _, p := range append([]int{pid}, descendants(pid)...) {
		total += testkit.RSSBytes(p)
	}
	return total
}

// treeCPU sums user and system time of pid and its descendants, with
// that of their reaped children (a proxy that forks per connection).
func treeCPU(pid int) time.Duration {
	var ticks int64
	for _, p := range append([]int{pid}, descendants(pid)...) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		// After "pid (comm) " the fields start at field 3 (state):
		// utime, stime, cutime and cstime are fields 14 to 17.
		f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
		for _, i := range []int{14, 15, 16, 17} {
			if n, err := strconv.ParseInt(f[i-3], 10, 64); err == nil {
				ticks += n
			}
		}
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ: always 100 in /proc
}

func descendants(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		data, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
				out = append(out, descendants(c)...)
			}
		}
	}
	return out
}
