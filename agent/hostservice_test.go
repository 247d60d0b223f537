//go:build linux

package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
)

// serveNamed serves HTTP on the host's addr:port answering name, and
// counts the requests; it reports false where addr cannot be bound.
func serveNamed(t *testing.T, addr netip.Addr, port uint16, name string, n *atomic.Int64) bool {
	t.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, port).String())
	if err != nil {
		return false
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		n.Add(1)
		fmt.Fprint(rw, name)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return true
}

// A profile's host service is reached from a Trial as
// host.trialnet.internal:PORT through the proxy and, in transparent mode,
// through the name the stub hands out; the host's other ports and
// addresses, and the service's own port on them, stay unreachable,
// refused by the proxy or by the kernel.
func TestPrivilegedHostService(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 246)
	var served, strays atomic.Int64
	svcLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(svcLn.Addr().(*net.TCPAddr).Port)
	_ = svcLn.Close()
	if !serveNamed(t, netip.MustParseAddr("127.0.0.1"), port, "the-service", &served) {
		t.Fatal("cannot listen on the service's port")
	}
	otherLn, _ := net.Listen("tcp", "127.0.0.1:0")
	otherPort := uint16(otherLn.Addr().(*net.TCPAddr).Port)
	_ = otherLn.Close()
	serveNamed(t, netip.MustParseAddr("127.0.0.1"), otherPort, "another-port", &strays)
	serveNamed(t, w.host.Local4, port, "another-address", &strays) // the host's address on the test host's link
	serveNamed(t, netip.MustParseAddr("::1"), port, "ipv6-loopback", &strays)

	cfg := w.config(t)
	cfg.File, err = config.ParseFile(fmt.Appendf(nil, "profiles:\n  dev:\n    host_services:\n      - port: %d\n", port))
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, cfg)
	svc, other := fmt.Sprintf("%s:%d", trialspec.HostServiceName, port), fmt.Sprintf("%s:%d", trialspec.HostServiceName, otherPort)
	// The other port is on the allowlist too: what refuses it is that no
	// host service is there.
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-hostsvc", Profiles: []string{"dev"}, Allow: []string{other}})
	if err != nil {
		t.Fatal(err)
	}
	if len(info.HostServices) != 1 || info.HostServices[0].Port != port {
		t.Fatalf("the Trial's host services: %+v", info.HostServices)
	}
	if code, out := through(t, a, info.ID, "http://"+svc+"/"); code != 0 || out != "the-service" {
		t.Fatalf("CONNECT %s: curl exit %d: %s", svc, code, out)
	}
	if code, out := curl(t, a, info.ID, "-x", ProxyURL, "http://"+svc+"/"); code != 0 || out != "the-service" {
		t.Fatalf("forwarded GET to %s: curl exit %d: %s", svc, code, out)
	}
	if code, out := through(t, a, info.ID, "http://"+other+"/"); code == 0 || !strings.Contains(out, "403") {
		t.Fatalf("CONNECT %s: curl exit %d: %s", other, code, out)
	}
	lastRecord(t, a, info.ID, record.ReasonAddressDenied)

	addr, _ := stubLookup(t, info.Netns, "udp", trialspec.HostServiceName)
	if !addr.IsValid() {
		t.Fatal("the stub hands out no address for the host service name")
	}
	if code, out := transparentCurl(t, info, "--resolve", fmt.Sprintf("%s:%s", svc, addr), "http://"+svc+"/"); code != 0 || out != "the-service" {
		t.Fatalf("transparent %s: curl exit %d: %s", svc, code, out)
	}
	if code, out := transparentCurl(t, info, "--resolve", fmt.Sprintf("%s:%s", other, addr), "http://"+other+"/"); code == 0 {
		t.Fatalf("transparent %s reached: %s", other, out)
	}
	lastRecord(t, a, info.ID, record.ReasonAddressDenied)

	before, err := a.Stats(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Straight at the host: its address on another link, and loopback in
	// every spelling, which in the Trial is its own loopback, not the host's.
	direct := []string{
		fmt.Sprintf("http://%s:%d/", w.host.Local4, port),
		fmt.Sprintf("http://127.0.0.1:%d/", port),
		fmt.Sprintf("http://[::1]:%d/", port),
		fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/", port),
		fmt.Sprintf("http://[::ffff:%s]:%d/", w.host.Local4, port),
	}
	for _, u := range direct {
		if code, out := transparentCurl(t, info, u); code == 0 {
			t.Errorf("%s reached: %s", u, out)
		}
	}
	after, err := a.Stats(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := deniedOf(after.Kernel) - deniedOf(before.Kernel); d < 2 {
		t.Errorf("the kernel counted %d refused connects for the host's other address in both forms, want 2 or more: %v", d, after.Kernel)
	}
	if n := strays.Load(); n != 0 {
		t.Fatalf("the host's other ports and addresses were reached %d times", n)
	}
	if served.Load() != 3 {
		t.Fatalf("the service served %d requests, want 3", served.Load())
	}
}

func deniedOf(k map[string]uint64) uint64 {
	return k["connect4_denied"] + k["connect6_denied"]
}
