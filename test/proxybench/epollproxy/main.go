//go:build linux

// Command epollproxy is test/proxybench's ceiling route, not a peer: a
// CONNECT proxy on raw epoll(7) on one locked OS thread, without Go's
// netpoll, goroutines or net package on the path of a tunnel, and without
// any of trialnet's checks, limits or DNS. What it does per tunnel is
// what trialnet cannot skip: it sets the upstream keepalive trialnet sets
// (the client side's is inherited from the listener, as trialnet's is)
// and writes a line per tunnel to stdout, as trialnet writes its decision
// record. Its figures are what an event loop would leave trialnet if its
// checks cost nothing. It dials the IPv4 address the CONNECT names; the
// benchmark gives it one. With --threads N it runs N such loops, each on
// its own locked OS thread with a listening socket of its own in one
// SO_REUSEPORT group, so that the kernel spreads connections over them:
// the best an event-loop design can do with the machine's cores.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Keepalives as trialnet's (internal/tcplisten, proxy/dialer.go).
var (
	listenerOpts = [][3]int{
		{syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1},
		{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, 15},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, 15},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, 9},
		{syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1},
	}
	upstreamOpts = [][3]int{
		{syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1},
		{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, 60},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, 10},
		{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, 9},
	}
)

const (
	answer  = "HTTP/1.1 200 Connection established\r\n\r\n"
	maxHead = 8 << 10
	// edge-triggered, every event of interest from the start
	events = syscall.EPOLLIN | syscall.EPOLLOUT | syscall.EPOLLRDHUP | -syscall.EPOLLET
)

// end is one socket of a tunnel.
type end struct {
	fd      int
	t       *tunnel
	out     []byte // bytes for this socket that did not fit its send buffer
	eof     bool   // this socket's peer half-closed
	shut    bool   // to be half-closed once out is written
	isUp    bool
	pending bool // upstream: connect in progress
}

type tunnel struct {
	client, up *end
	head       []byte // the client's bytes until the request head ends
	started    time.Time
	target     string
	closed     bool
}

type proxy struct {
	ep   int
	ends map[int]*end
	buf  []byte
	line []byte
}

func main() {
	listen := flag.String("listen", "127.0.0.1:3128", "listen on ADDR:PORT (IPv4)")
	threads := flag.Int("threads", 1, "event loops, each on an OS thread of its own with its own SO_REUSEPORT listener")
	flag.Parse()
	n := max(*threads, 1)
	runtime.GOMAXPROCS(n)
	errs := make(chan error, n)
	for range n {
		go func() {
			runtime.LockOSThread()
			errs <- run(*listen, n > 1)
		}()
	}
	fmt.Fprintln(os.Stderr, "epollproxy:", <-errs)
	os.Exit(1)
}

// run serves until it fails; it never returns otherwise (the benchmark
// stops it with a signal).
func run(listen string, reusePort bool) error {
	la, err := netip.ParseAddrPort(listen)
	if err != nil || !la.Addr().Is4() {
		return fmt.Errorf("--listen %q: an IPv4 ADDR:PORT is needed", listen)
	}
	lfd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	opts := listenerOpts
	if reusePort {
		opts = append(opts[:len(opts):len(opts)], [3]int{syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1})
	}
	for _, o := range opts {
		if err := syscall.SetsockoptInt(lfd, o[0], o[1], o[2]); err != nil {
			return err
		}
	}
	if err := syscall.Bind(lfd, &syscall.SockaddrInet4{Port: int(la.Port()), Addr: la.Addr().As4()}); err != nil {
		return err
	}
	if err := syscall.Listen(lfd, 4096); err != nil {
		return err
	}
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, lfd, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(lfd)}); err != nil {
		return err
	}
	p := &proxy{ep: ep, ends: map[int]*end{}, buf: make([]byte, 64<<10)}
	evs := make([]syscall.EpollEvent, 256)
	for {
		n, err := syscall.EpollWait(ep, evs, -1)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		for _, ev := range evs[:n] {
			if int(ev.Fd) == lfd {
				p.accept(lfd)
				continue
			}
			// A socket closed earlier in this batch may already have
			// a new connection's number: its handlers only act on what
			// its socket reports now, so a stale event does no harm.
			if e := p.ends[int(ev.Fd)]; e != nil {
				p.ready(e, ev.Events)
			}
		}
	}
}

// accept takes every pending connection and reads its head if it came
// with the handshake.
func (p *proxy) accept(lfd int) {
	for {
		fd, _, err := syscall.Accept4(lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN, or a failure the next connection may not have
		}
		t := &tunnel{started: time.Now()}
		t.client = &end{fd: fd, t: t}
		if !p.add(t.client) {
			continue
		}
		p.readHead(t)
	}
}

func (p *proxy) add(e *end) bool {
	if err := syscall.EpollCtl(p.ep, syscall.EPOLL_CTL_ADD, e.fd, &syscall.EpollEvent{Events: events, Fd: int32(e.fd)}); err != nil {
		_ = syscall.Close(e.fd)
		return false
	}
	p.ends[e.fd] = e
	return true
}

func (p *proxy) ready(e *end, ev uint32) {
	t := e.t
	switch {
	case t.up == nil:
		p.readHead(t)
	case e.pending:
		if ev&(syscall.EPOLLOUT|syscall.EPOLLERR|syscall.EPOLLHUP) == 0 {
			return
		}
		if soerr, err := syscall.GetsockoptInt(e.fd, syscall.SOL_SOCKET, syscall.SO_ERROR); err != nil || soerr != 0 {
			p.close(t, "connect failed")
			return
		}
		e.pending = false
		t.client.out = append(t.client.out, answer...)
		e.out, t.head = append(e.out, t.head...), nil // pipelined after the head
		p.flush(t.client)
		p.flush(e)
		p.pump(t.client, e)
		p.pump(e, t.client)
	case t.up.pending: // the client's bytes wait for the connect
	default:
		other := t.up
		if e == t.up {
			other = t.client
		}
		if p.flush(e) {
			p.pump(other, e) // room again: what waited may go on
		}
		p.pump(e, other)
	}
}

// readHead reads the request head and dials what it names.
func (p *proxy) readHead(t *tunnel) {
	for {
		n, err := syscall.Read(t.client.fd, p.buf)
		if errors.Is(err, syscall.EAGAIN) {
			return
		}
		if err != nil || n == 0 {
			p.close(t, "client ended before its head")
			return
		}
		t.head = append(t.head, p.buf[:n]...)
		i := bytes.Index(t.head, []byte("\r\n\r\n"))
		if i < 0 {
			if len(t.head) > maxHead {
				p.close(t, "head too long")
				return
			}
			continue
		}
		line, _, _ := bytes.Cut(t.head, []byte("\r\n"))
		f := bytes.Fields(line)
		if len(f) != 3 || string(f[0]) != "CONNECT" {
			p.close(t, "not a CONNECT")
			return
		}
		t.target = string(f[1])
		t.head = t.head[i+4:]
		p.dial(t)
		return
	}
}

func (p *proxy) dial(t *tunnel) {
	ap, err := netip.ParseAddrPort(t.target)
	if err != nil || !ap.Addr().Is4() {
		p.close(t, "the target is not an IPv4 address")
		return
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		p.close(t, "socket failed")
		return
	}
	for _, o := range upstreamOpts {
		_ = syscall.SetsockoptInt(fd, o[0], o[1], o[2])
	}
	t.up = &end{fd: fd, t: t, isUp: true, pending: true}
	if !p.add(t.up) {
		t.up = nil
		p.close(t, "epoll failed")
		return
	}
	err = syscall.Connect(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	if err != nil && !errors.Is(err, syscall.EINPROGRESS) {
		p.close(t, "connect failed")
	}
}

// flush writes what waits for e; it reports whether nothing is left.
func (p *proxy) flush(e *end) bool {
	for !e.t.closed && len(e.out) > 0 {
		n, err := syscall.Write(e.fd, e.out)
		if errors.Is(err, syscall.EAGAIN) {
			return false
		}
		if err != nil {
			p.close(e.t, "write failed")
			return false
		}
		e.out = e.out[n:]
	}
	if e.t.closed {
		return false
	}
	e.out = nil
	if e.shut {
		e.shut = false
		_ = syscall.Shutdown(e.fd, syscall.SHUT_WR)
	}
	return !e.t.closed
}

// pump copies src to dst until src has nothing more or dst is full; at
// src's EOF it half-closes dst, and once both have ended it closes both.
func (p *proxy) pump(src, dst *end) {
	t := src.t
	for !t.closed && !src.eof && len(dst.out) == 0 {
		n, err := syscall.Read(src.fd, p.buf)
		if errors.Is(err, syscall.EAGAIN) {
			return
		}
		if err != nil {
			p.close(t, "read failed")
			return
		}
		if n == 0 {
			src.eof = true
			dst.shut = true
			p.flush(dst)
			if dst.eof && !t.closed {
				p.close(t, "")
			}
			return
		}
		m, err := syscall.Write(dst.fd, p.buf[:n])
		if errors.Is(err, syscall.EAGAIN) {
			m, err = 0, nil
		}
		if err != nil {
			p.close(t, "write failed")
			return
		}
		if m < n {
			dst.out = append(dst.out, p.buf[m:n]...)
		}
	}
}

// close ends the tunnel and writes its line.
func (p *proxy) close(t *tunnel, why string) {
	if t.closed {
		return
	}
	t.closed = true
	for _, e := range []*end{t.client, t.up} {
		if e != nil {
			delete(p.ends, e.fd)
			_ = syscall.Close(e.fd)
		}
	}
	p.line = fmt.Appendf(p.line[:0], "{\"time\":%q,\"method\":\"CONNECT\",\"target\":%q,\"decision\":\"allow\",\"detail\":%q,\"duration_us\":%d}\n",
		t.started.UTC().Format(time.RFC3339Nano), t.target, why, time.Since(t.started).Microseconds())
	_, _ = os.Stdout.Write(p.line)
}
