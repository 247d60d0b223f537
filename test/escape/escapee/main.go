//go:build linux

// Command escapee tries every way out of a network sandbox it knows and
// prints one JSON line per attempt: blocked, escaped (the attempt went
// out, as far as the sender can tell) or skipped, with the reason. Whether
// anything really arrived is for the receiving side (the canary) to say.
// It is built static and run inside a Trial by test/escape.
//
//	escapee -v4 198.18.1.2 -v6 fd7a:7472:1::2 -port 8080 -dns-port 53 \
//	        -loopback-port 9999 -proxy 127.0.0.1:3128 -denied-name evil.example.test
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Result of one attempt.
type Result struct {
	Name   string `json:"name"`
	Result string `json:"result"` // blocked, escaped, skipped
	Reason string `json:"reason"`
}

var (
	v4         = flag.String("v4", "", "canary IPv4 address")
	v6         = flag.String("v6", "", "canary IPv6 address")
	port       = flag.Int("port", 8080, "canary TCP and UDP port")
	dnsPort    = flag.Int("dns-port", 53, "canary DNS port (UDP and TCP)")
	loopPort   = flag.Int("loopback-port", 0, "a loopback port that is not the proxy's (0: skip)")
	proxyAddr  = flag.String("proxy", "", "the Trial's proxy host:port (empty: skip the CONNECT attempt)")
	allowed4   = flag.String("allowed4", "127.0.0.1:3128", "an IPv4 address and port the Trial may connect to by TCP (the proxy endpoint): the source-routed attempt aims there")
	allowed6   = flag.String("allowed6", "[::1]:3128", "an IPv6 address and port the Trial may connect to by TCP (the proxy endpoint): the routing-header attempt aims there")
	deniedName = flag.String("denied-name", "evil.example.test", "a name not on the allowlist")
	listenFor  = flag.Duration("listen-for", time.Second, "how long the inbound listener waits")
	inPort     = flag.Int("inbound-port", 18080, "the port the inbound listener listens on, every address")
	mode       = flag.String("mode", "network", "network: the ways out through the network; boundary: around it, through another process, the terminal, other socket families and mounts; victim: be the process outside that holds sockets; user-wide: the calls that act on every process of a uid (setpriority, ioprio_set); kill-all: kill -1; keys: the key calls only; vsock: AF_VSOCK sockets only, each way a seccomp profile must refuse")
	i386Name   = flag.String("i386", "", "i386: the attempt through the i386 entry to make (keyctl-i386, socketcall-vsock-i386)")
	keyDesc    = flag.String("key-desc", "trialnet-escape-key", "keys: the description of the key to read from the user keyring")
)

func main() {
	flag.Parse()
	switch *mode {
	case "network":
	case "boundary":
		boundary()
		return
	case "victim":
		victim()
		return
	case "user-wide":
		userWide()
		return
	case "kill-all":
		killAll()
		return
	case "keys":
		keyAttempts(json.NewEncoder(os.Stdout), *keyDesc)
		return
	case "vsock":
		vsockAttempts(json.NewEncoder(os.Stdout))
		return
	case "i386":
		i386Child()
	case "bindconnect":
		os.Exit(bindConnect())
	default:
		fmt.Fprintln(os.Stderr, "unknown -mode", *mode)
		os.Exit(2)
	}
	enc := json.NewEncoder(os.Stdout)
	a4, a6 := netip.MustParseAddr(*v4), netip.MustParseAddr(*v6)
	t4, t6 := netip.AddrPortFrom(a4, uint16(*port)), netip.AddrPortFrom(a6, uint16(*port))
	mapped := netip.AddrPortFrom(netip.AddrFrom16(a4.As16()), uint16(*port))
	attempts := []struct {
		name string
		fn   func() error
	}{
		{"tcp4", func() error { return dialTCP(t4) }},
		{"tcp6", func() error { return dialTCP(t6) }},
		{"tcp-ipv4-mapped", func() error { return dialTCP(mapped) }},
		{"udp4-connected", func() error { return udpConnected(t4) }},
		{"udp6-connected", func() error { return udpConnected(t6) }},
		{"udp4-sendto", func() error { return sendto(unix.AF_INET, unix.SOCK_DGRAM, 0, t4, 0) }},
		{"udp6-sendto", func() error { return sendto(unix.AF_INET6, unix.SOCK_DGRAM, 0, t6, 0) }},
		{"udp-ipv4-mapped-sendto", func() error { return sendto(unix.AF_INET6, unix.SOCK_DGRAM, 0, mapped, 0) }},
		{"udp4-sendmsg", func() error { return sendmsg(t4) }},
		{"tcp4-fastopen", func() error { return sendto(unix.AF_INET, unix.SOCK_STREAM, 0, t4, unix.MSG_FASTOPEN) }},
		{"tcp6-fastopen", func() error { return sendto(unix.AF_INET6, unix.SOCK_STREAM, 0, t6, unix.MSG_FASTOPEN) }},
		{"raw4-icmp", func() error {
			return sendto(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP, netip.AddrPortFrom(a4, 0), 0)
		}},
		{"raw6-icmp", func() error {
			return sendto(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6, netip.AddrPortFrom(a6, 0), 0)
		}},
		{"ping4", func() error {
			return sendto(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP, netip.AddrPortFrom(a4, 0), 0)
		}},
		{"ping6", func() error {
			return sendto(unix.AF_INET6, unix.SOCK_DGRAM, unix.IPPROTO_ICMPV6, netip.AddrPortFrom(a6, 0), 0)
		}},
		{"af-packet", packet},
		{"netlink-add-address", func() error { return netlinkRequest(unix.RTM_NEWADDR) }},
		{"netlink-add-route", func() error { return netlinkRequest(unix.RTM_NEWROUTE) }},
		{"netlink-link-up", func() error { return netlinkRequest(unix.RTM_NEWLINK) }},
		{"dns-udp", func() error { return dnsUDP(netip.AddrPortFrom(a4, uint16(*dnsPort))) }},
		{"dns-tcp", func() error { return dialTCP(netip.AddrPortFrom(a4, uint16(*dnsPort))) }},
		{"loopback-other-port", func() error {
			if *loopPort == 0 {
				return errSkip("no -loopback-port")
			}
			return dialTCP(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(*loopPort)))
		}},
		{"inbound-listener", inbound},
		{"io_uring-connect", func() error { return uringConnect(t4) }},
		{"tcp4-fastopen-connect", func() error { return tcpFastOpenConnect(t4) }},
		{"tcp4-source-route", func() error { return tcp4SourceRoute(netip.MustParseAddrPort(*allowed4), t4) }},
		{"tcp6-routing-header", func() error { return tcp6RoutingHeader(netip.MustParseAddrPort(*allowed6), t6) }},
		{"udp6-routing-header", func() error { return udp6RoutingHeader(t6) }},
		{"connect-denied-name-via-proxy", connectViaProxy},
	}
	for _, at := range attempts {
		report(enc, at.name, at.fn())
	}
}

func report(enc *json.Encoder, name string, err error) {
	r := Result{Name: name, Result: "escaped", Reason: "the kernel accepted it"}
	var skip errSkip
	var esc errEscaped
	switch {
	case errors.As(err, &skip):
		r.Result, r.Reason = "skipped", string(skip)
	case errors.As(err, &esc):
		r.Reason = string(esc)
	case err != nil:
		r.Result, r.Reason = "blocked", err.Error()
	}
	_ = enc.Encode(r)
}

type errSkip string

func (e errSkip) Error() string { return string(e) }

// errEscaped is an attempt that got through, with what it got.
type errEscaped string

func (e errEscaped) Error() string { return string(e) }

func dialTCP(ap netip.AddrPort) error {
	c, err := net.DialTimeout("tcp", ap.String(), 2*time.Second)
	if err != nil {
		return err
	}
	_, _ = c.Write([]byte("escaped\n"))
	return c.Close()
}

func udpConnected(ap netip.AddrPort) error {
	c, err := net.Dial("udp", ap.String())
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte("escaped"))
	return err
}

func sockaddr(ap netip.AddrPort, family int) unix.Sockaddr {
	if family == unix.AF_INET {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

func sendto(family, typ, proto int, ap netip.AddrPort, flags int) error {
	fd, err := unix.Socket(family, typ, proto)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	msg := []byte("escaped")
	if proto == unix.IPPROTO_ICMP || proto == unix.IPPROTO_ICMPV6 {
		typ := byte(8) // echo request
		if proto == unix.IPPROTO_ICMPV6 {
			typ = 128
		}
		msg = []byte{typ, 0, 0, 0, 0, 1, 0, 1}
	}
	if err := unix.Sendto(fd, msg, flags, sockaddr(ap, family)); err != nil {
		return fmt.Errorf("sendto: %w", err)
	}
	return nil
}

func sendmsg(ap netip.AddrPort) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendmsg(fd, []byte("escaped"), nil, sockaddr(ap, unix.AF_INET), 0); err != nil {
		return fmt.Errorf("sendmsg: %w", err)
	}
	return nil
}

func packet() error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	_ = unix.Close(fd)
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// netlinkRequest sends a minimal request of the given type for lo (index
// 1) and reports the kernel's answer.
func netlinkRequest(typ uint16) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	var body []byte
	switch typ {
	case unix.RTM_NEWADDR: // 198.18.255.1/32 on lo
		body = []byte{unix.AF_INET, 32, 0, 0, 1, 0, 0, 0}
		body = append(body, rtattr(unix.IFA_LOCAL, []byte{198, 18, 255, 1})...)
	case unix.RTM_NEWROUTE: // 0.0.0.0/0 via lo
		body = []byte{unix.AF_INET, 0, 0, 0, unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RT_SCOPE_LINK, unix.RTN_UNICAST, 0, 0, 0, 0}
		body = append(body, rtattr(unix.RTA_OIF, []byte{1, 0, 0, 0})...)
	case unix.RTM_NEWLINK: // lo up
		body = make([]byte, unix.SizeofIfInfomsg)
		*(*unix.IfInfomsg)(unsafe.Pointer(&body[0])) = unix.IfInfomsg{Index: 1, Flags: unix.IFF_UP, Change: unix.IFF_UP}
	}
	hdr := make([]byte, unix.SizeofNlMsghdr)
	*(*unix.NlMsghdr)(unsafe.Pointer(&hdr[0])) = unix.NlMsghdr{
		Len: uint32(unix.SizeofNlMsghdr + len(body)), Type: typ,
		Flags: unix.NLM_F_REQUEST | unix.NLM_F_ACK | unix.NLM_F_CREATE | unix.NLM_F_REPLACE, Seq: 1,
	}
	if err := unix.Sendto(fd, append(hdr, body...), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("recv: %w", err)
	}
	if n >= unix.SizeofNlMsghdr+4 {
		if code := int32(*(*uint32)(unsafe.Pointer(&buf[unix.SizeofNlMsghdr]))); code != 0 {
			return fmt.Errorf("kernel: %w", syscall.Errno(-code))
		}
	}
	return nil
}

func rtattr(typ uint16, data []byte) []byte {
	l := 4 + len(data)
	out := make([]byte, (l+3)&^3)
	out[0], out[1], out[2], out[3] = byte(l), byte(l>>8), byte(typ), byte(typ>>8)
	copy(out[4:], data)
	return out
}

// dnsUDP sends an A query for example.com and waits briefly for an answer.
func dnsUDP(ap netip.AddrPort) error {
	c, err := net.Dial("udp", ap.String())
	if err != nil {
		return err
	}
	defer c.Close()
	q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1}
	_, err = c.Write(q)
	return err
}

// inbound listens on every address and waits for anyone to connect.
func inbound() error {
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", *inPort))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(*listenFor))
	c, err := ln.Accept()
	if err != nil {
		return fmt.Errorf("nothing connected in %v: %w", *listenFor, err)
	}
	_ = c.Close()
	return nil
}

func connectViaProxy() error {
	if *proxyAddr == "" {
		return errSkip("no -proxy")
	}
	c, err := net.DialTimeout("tcp", *proxyAddr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	target := fmt.Sprintf("%s:%d", *deniedName, *port)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return err
	}
	if resp.StatusCode == 200 {
		return nil
	}
	return fmt.Errorf("proxy: %s (%s)", resp.Status, strings.TrimSpace(resp.Header.Get("Trialnet-Reason")))
}
