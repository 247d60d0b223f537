//go:build linux

package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/upstream"
)

// doctorDialTimeout bounds each connection the doctor tries.
const doctorDialTimeout = 3 * time.Second

// ConfigChecks are the doctor's lines for what f relies on this host to
// provide: the upstream proxy (its credentials readable as the agent
// reads them, its address accepting connections) and each profile's host
// services (something listening on the address and port). None is
// required: a Trial that does not use them is enforced without them.
func ConfigChecks(f *config.File) []bpf.Check {
	if f == nil {
		return nil
	}
	var checks []bpf.Check
	if up := f.UpstreamProxy; up.Address != "" {
		p, err := upstream.Load(up)
		checks = append(checks, bpf.Check{Name: "upstream proxy " + up.Address + ": configuration and credentials file", Err: err})
		if err == nil {
			checks = append(checks, bpf.Check{Name: "upstream proxy " + p.Address() + " accepts connections", Err: tryConnect(p.Address())})
		}
	}
	for _, name := range f.ProfileNames() {
		for _, h := range f.Profiles[name].HostServices {
			addr := h.Address
			if addr == "" {
				addr = "127.0.0.1"
			}
			ap := net.JoinHostPort(addr, fmt.Sprint(h.Port))
			checks = append(checks, bpf.Check{Name: fmt.Sprintf("host service %s (profile %s) is listening", ap, name), Err: listening(addr, ap)})
		}
	}
	return checks
}

// listening reports whether something accepts connections at ap, and
// that addr is one of this host's (a host service elsewhere is refused).
func listening(addr, ap string) error {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return err
	}
	if !a.IsLoopback() {
		own, err := hostAddrs()
		if err != nil {
			return err
		}
		if !slices.Contains(own, a) {
			return fmt.Errorf("%s is not one of this host's addresses: the agent refuses to dial it", a)
		}
	}
	return tryConnect(ap)
}

func hostAddrs() ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ia := range ifAddrs {
		if p, err := netip.ParsePrefix(ia.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}

func tryConnect(addr string) error {
	c, err := net.DialTimeout("tcp", addr, doctorDialTimeout)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("no answer from %s within %s", addr, doctorDialTimeout)
		}
		return err
	}
	return c.Close()
}
