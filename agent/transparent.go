//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/dnsstub"
	"github.com/trialnet/trialnet/internal/lname"
	"github.com/trialnet/trialnet/internal/tcplisten"
	"github.com/trialnet/trialnet/keeper"
	"github.com/trialnet/trialnet/netns"
	"golang.org/x/sys/unix"
)

// steeredListen is where a Trial's transparent listener listens, in its
// namespace: beside the stub, on a port the kernel picks. Nothing is
// served there in its own right: the steering hands it the pool's
// connections, and a connection made to this address itself maps to no
// name and is refused (unknown_address).
const steeredListen = "127.0.0.53:0"

// transparent is one Trial's transparent mode as the agent runs it
// (docs/transparent.md): its DNS stub on two sockets in the Trial's
// namespace, the listener the steering hands pool connections to (served
// by the proxy), the steering (pinned, so that it outlives this process),
// and the file that keeps the names the stub handed out.
type transparent struct {
	id       string
	learning bool
	stub     *dnsstub.Server // nil while paused
	socks    transparentSockets
	steer    *bpf.Steer
	names    *os.File // nil without a state directory
	// counts is the stub's counts file mapped (dnsCountsFile); nil
	// without a state directory, where the stub counts in its own memory.
	counts   []byte
	stubDone chan struct{} // closed when the stub's two goroutines end
	// last is the stub serving, or serving until a pause, which the
	// proxy's lookups (lookup) read beside pause and resume.
	last   atomic.Pointer[dnsstub.Server]
	paused atomic.Bool
	// fileNames is the names file as lookup last read it while paused.
	fileNames namesCache
	ln        chan struct{} // closed when the proxy stops serving socks.steered
	// held are the stub's sockets while it is paused for a hand-over.
	held []*os.File
	// lastAllow is the Trial's allowlist as the proxy removed it: the
	// stub admits by it what it answers or counts after (admitter).
	lastAllow atomic.Pointer[allow.List]
}

// transparentSockets are a Trial's transparent sockets, as one process
// passes them to the next (a hand-over, the keeper).
type transparentSockets struct {
	udp          *net.UDPConn
	tcp, steered *net.TCPListener
	// steer, from a prepared shell only, steers the pool to steered,
	// attached before the Trial had a name (not pinned); nil otherwise.
	steer *bpf.Steer
	// loaded, from a Trial's files only, is the steer program for
	// shellPool loaded ahead and attached nowhere, for a Trial whose
	// sockets are made in its own namespace (an adoption's); nil
	// otherwise.
	loaded *bpf.Steer
}

func (s transparentSockets) close() {
	if s.steer != nil {
		_ = s.steer.Close()
	}
	if s.loaded != nil {
		_ = s.loaded.Close()
	}
	if s.udp != nil {
		_ = s.udp.Close()
	}
	if s.tcp != nil {
		_ = s.tcp.Close()
	}
	if s.steered != nil {
		_ = s.steered.Close()
	}
}

// transparentKept is how many sockets files copies.
const transparentKept = 3

// files are dups of the sockets, by name, for a successor or the keeper;
// the caller closes them.
func (s transparentSockets) files(id string) (names []lname.Name, files []*os.File, err error) {
	for _, x := range [transparentKept]struct {
		k lname.Kind
		f interface{ File() (*os.File, error) }
	}{{lname.StubUDP, s.udp}, {lname.StubTCP, s.tcp}, {lname.Steered, s.steered}} {
		f, ferr := x.f.File()
		if ferr != nil {
			for _, f := range files {
				_ = f.Close()
			}
			return nil, nil, fmt.Errorf("transparent socket %s: %w", lname.TransparentName(id, x.k), ferr)
		}
		names, files = append(names, lname.TransparentName(id, x.k)), append(files, f)
	}
	return names, files, nil
}

// take sets the socket f names from a predecessor or the keeper; f is
// closed. A file of the wrong type is dropped.
func (s *transparentSockets) take(n lname.Name, f *os.File) error {
	defer f.Close()
	if n.Kind == lname.StubUDP {
		pc, err := net.FilePacketConn(f)
		if err != nil {
			return err
		}
		u, ok := pc.(*net.UDPConn)
		if !ok {
			_ = pc.Close()
			return fmt.Errorf("a %T, not a UDP socket", pc)
		}
		s.udp = u
		return nil
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return err
	}
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		_ = ln.Close()
		return fmt.Errorf("a %T, not a TCP listener", ln)
	}
	if n.Kind == lname.StubTCP {
		s.tcp = tl
	} else {
		s.steered = tl
	}
	return nil
}

// whole reports whether every socket is there.
func (s transparentSockets) whole() bool {
	return s.udp != nil && s.tcp != nil && s.steered != nil
}

// openTransparent starts Trial lt's transparent mode, on the sockets an
// earlier process passed on (inh, checked to be this Trial's) or on new
// ones: the names its stub handed out come back from their file, the
// stub serves, the steering is attached (or its pins adopted), and the
// proxy serves the steered listener. On error nothing is left running;
// pins and the names file stay for the caller's teardown to remove.
func (a *Agent) openTransparent(lt *trial, inh transparentSockets) (_ *transparent, err error) {
	id, nsPath := lt.info.ID, lt.tr.Netns.Path
	tp := &transparent{id: id, learning: lt.info.Learning}
	pre := inh.steer     // a shell's, used by steer or closed
	loaded := inh.loaded // likewise: taken by steer, or closed
	inh.steer, inh.loaded = nil, nil
	defer func() {
		if err != nil {
			tp.close()
			inh.close()
		}
		if pre != nil {
			_ = pre.Close()
		}
		if loaded != nil {
			_ = loaded.Close()
		}
	}()
	if inh.whole() {
		if err := checkTransparent(inh, lt.tr.Netns.Cookie); err != nil {
			a.log.Warn("transparent sockets handed over are not this Trial's; listening anew", "trial", id, "error", err)
			inh.close()
			inh = transparentSockets{}
			_ = pre.Close() // it steers to the socket closed
			pre = nil
		}
	} else {
		inh.close()
		inh = transparentSockets{}
	}
	tp.socks = inh
	if !inh.whole() {
		if tp.socks, err = listenTransparent(nsPath); err != nil {
			return nil, fmt.Errorf("transparent mode of Trial %s: %w", id, err)
		}
	}
	// Both files are for a later agent serving the Trial, which an
	// ephemeral agent's Trial never has (as its ledger, prepare).
	if a.cfg.Host.StateDir != "" && !a.cfg.Ephemeral {
		if tp.names, err = os.OpenFile(a.namesFile(id), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err != nil {
			return nil, fmt.Errorf("transparent names: %w", err)
		}
		if tp.counts, err = a.mapDNSCounts(id); err != nil {
			return nil, fmt.Errorf("transparent mode of Trial %s: the DNS stub's counts: %w", id, err)
		}
	}
	if err := tp.startStub(a); err != nil {
		return nil, err
	}
	l := loaded
	loaded = nil
	tp.steer, pre, err = a.steer(lt, tp, pre, l)
	if err != nil {
		return nil, fmt.Errorf("transparent mode of Trial %s: %w", id, err)
	}
	tp.ln = make(chan struct{})
	go func() {
		defer close(tp.ln)
		if err := a.proxy.ServeTransparent(tp.socks.steered, id, tp.lookup); err != nil {
			a.log.Error("transparent mode", "trial", id, "error", err)
		}
	}()
	return tp, nil
}

// startStub makes the Trial's stub, with the names its earlier stubs
// handed out (their file), and serves it on socks.udp and socks.tcp.
func (tp *transparent) startStub(a *Agent) error {
	var restore []dnsstub.Assigned
	if tp.names != nil {
		f, err := os.Open(a.namesFile(tp.id))
		if err != nil {
			return fmt.Errorf("transparent names: %w", err)
		}
		restore, err = readNames(f)
		_ = f.Close()
		if err != nil {
			return fmt.Errorf("transparent names %s: %w", a.namesFile(tp.id), err)
		}
	}
	cfg := dnsstub.Config{Admit: a.admitter(tp), Restore: restore}
	if tp.counts != nil {
		cfg.Counts = (*dnsstub.Counts)(unsafe.Pointer(&tp.counts[dnsCountsHeader]))
	}
	if tp.names != nil {
		cfg.Record = tp.recordName
	}
	if tp.learning {
		id := tp.id
		cfg.Learn = func(name string) {
			a.log.Info("learning: a name off the allowlist was given an address", "trial", id, "name", name)
		}
	}
	stub, err := dnsstub.New(cfg)
	if err != nil {
		return fmt.Errorf("transparent mode of Trial %s: %w", tp.id, err)
	}
	tp.stub, tp.stubDone = stub, make(chan struct{})
	tp.last.Store(stub)
	tp.paused.Store(false)
	udp, tcp, done := tp.socks.udp, tp.socks.tcp, tp.stubDone
	var left sync.WaitGroup
	for _, serve := range []func() error{func() error { return stub.ServeUDP(udp) }, func() error { return stub.ServeTCP(tcp) }} {
		left.Go(func() {
			if err := serve(); err != nil {
				a.log.Error("transparent mode: the DNS stub", "trial", tp.id, "error", err)
			}
		})
	}
	go func() { left.Wait(); close(done) }()
	return nil
}

// stopStub stops the stub, closing its sockets, and waits for it.
func (tp *transparent) stopStub() {
	if tp.stub == nil {
		return
	}
	_ = tp.stub.Close()
	<-tp.stubDone
	tp.stub, tp.socks.udp, tp.socks.tcp = nil, nil, nil
}

// maxQueued bounds the queries finish counts: the socket's receive
// buffer holds a few hundred, and the Trial, not killed yet, may still
// be sending.
const maxQueued = 4096

// finish stops the stub and returns its final counts; nil when no stub
// serves. At the Trial's end (ending) it first counts the queries still
// queued in its UDP socket, which no one will answer, read from a copy
// of the socket that the stub's close leaves open; otherwise the next
// agent answers them, as a hand-over's successor does (pause).
func (tp *transparent) finish(ending bool) *dnsstub.Stats {
	stub := tp.stub
	if stub == nil {
		return nil
	}
	var f *os.File
	var err error
	if ending {
		f, err = tp.socks.udp.File()
	}
	_ = stub.Close()
	<-tp.stubDone
	if ending && err == nil {
		buf := make([]byte, 1024) // past the stub's 512, a query is oversized whatever its length
		for range maxQueued {
			n, _, err := unix.Recvfrom(int(f.Fd()), buf, unix.MSG_DONTWAIT)
			if err != nil {
				break
			}
			stub.Tally(buf[:n])
		}
		_ = f.Close()
	}
	st := stub.Stats()
	return &st
}

// pause stops the stub for a hand-over: the successor's stub answers on
// copies of the same sockets, with the names this one handed out (their
// file), and two stubs handing out addresses at once could give one
// address two names. It keeps copies of the sockets for resume.
func (tp *transparent) pause() error {
	if tp.stub == nil {
		return nil
	}
	var held []*os.File
	for _, c := range []interface{ File() (*os.File, error) }{tp.socks.udp, tp.socks.tcp} {
		f, err := c.File()
		if err != nil {
			closeAll(held)
			return fmt.Errorf("transparent mode of Trial %s: keep the stub's sockets: %w", tp.id, err)
		}
		held = append(held, f)
	}
	tp.paused.Store(true)
	tp.stopStub()
	tp.held = held
	return nil
}

// resume serves the stub again after a hand-over that did not happen.
func (tp *transparent) resume(a *Agent) error {
	held := tp.held
	tp.held = nil
	if held == nil {
		return nil
	}
	var s transparentSockets
	errs := []error{s.take(lname.TransparentName(tp.id, lname.StubUDP), held[0]), s.take(lname.TransparentName(tp.id, lname.StubTCP), held[1])}
	if err := errors.Join(errs...); err != nil {
		s.close()
		return fmt.Errorf("transparent mode of Trial %s: the stub's sockets: %w", tp.id, err)
	}
	tp.socks.udp, tp.socks.tcp = s.udp, s.tcp
	return tp.startStub(a)
}

// release drops the copies pause kept: the successor serves the stub.
func (tp *transparent) release() {
	closeAll(tp.held)
	tp.held = nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// steer attaches the Trial's steering, pinned; where it cannot be pinned
// (bpffs gone from under the pin directory), unpinned, as the kernel
// layers go on enforcing from this process's hold then too: its pool
// connections are then refused while no agent runs, never let through.
// A shell's steering attached ahead (pre, for shellPool) is pinned
// instead when it can be; it is given back (nil) once used. Else a
// program loaded ahead (loaded, for shellPool) is attached rather than
// one loaded now; loaded is steer's to use or close.
func (a *Agent) steer(lt *trial, tp *transparent, pre, loaded *bpf.Steer) (_, _ *bpf.Steer, err error) {
	defer func() {
		if loaded != nil {
			_ = loaded.Close()
		}
	}()
	pin := a.host.BPF.SteerPin(lt.tr.CgroupID)
	if pre != nil && tp.stub.Pool() == shellPool {
		s, err := pre.PinAt(pin)
		if err == nil {
			return s, nil, nil
		}
		a.log.Warn("transparent mode: a prepared shell's steering could not be pinned; attaching anew", "trial", lt.info.ID, "error", err)
	}
	if loaded == nil {
		loaded = a.ahead.take(a.log)
	}
	s, err := bpf.OpenSteer(pin, lt.tr.Netns.Path, tp.stub.Pool(), tp.socks.steered, loaded)
	loaded = nil // OpenSteer's, used or closed
	if err == nil {
		return s, pre, nil
	}
	s, aerr := bpf.AttachSteer(lt.tr.Netns.Path, tp.stub.Pool(), tp.socks.steered)
	if aerr != nil {
		return nil, pre, errors.Join(err, aerr)
	}
	a.log.Warn("transparent mode: the steering is not pinned; while no agent runs, connections to the Trial's pool addresses are refused", "trial", lt.info.ID, "error", err)
	return s, pre, nil
}

// lookup maps a pool address to its name for the proxy, through the
// stub serving or paused. From the offer of a hand-over until it stops
// accepting, this agent's stub is paused while it still accepts, and the
// successor's stub answers, writing each name to the names file before
// its answer: an address this stub never handed out is looked for there.
func (tp *transparent) lookup(a netip.Addr) (string, bool) {
	s := tp.last.Load()
	if s == nil {
		return "", false
	}
	if n, ok := s.Lookup(a); ok || !tp.paused.Load() || tp.names == nil {
		return n, ok
	}
	return tp.fileNames.lookup(tp.names.Name(), s.Pool(), a)
}

// namesCache is a names file as last read, read again when its size
// changes (a stub appended a name), and checked as a stub restoring it
// would check it.
type namesCache struct {
	mu   sync.Mutex
	size int64
	pool *dnsstub.Pool
}

// lookup is the name the file at path gives a, in a pool over prefix;
// false for none, and for a file that cannot be read or checked.
func (c *namesCache) lookup(path string, prefix netip.Prefix, a netip.Addr) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := os.Stat(path)
	if err != nil {
		return "", false
	}
	if c.pool == nil || st.Size() != c.size {
		if c.pool, err = readPool(path, prefix); err != nil {
			return "", false
		}
		c.size = st.Size()
	}
	return c.pool.Name(a)
}

// readPool is the pool the names file at path restores.
func readPool(path string, prefix netip.Prefix) (*dnsstub.Pool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	names, err := readNames(f)
	_ = f.Close()
	if err != nil {
		return nil, err
	}
	pool, err := dnsstub.NewPool(prefix, dnsstub.DefaultMaxNames)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if err := pool.Restore(n.Name, n.Addr); err != nil {
			return nil, err
		}
	}
	return pool, nil
}

// admitter is the stub's policy for Trial id: its allowlist as it is at
// each question, so that allow and deny apply to lookups at once.
func (a *Agent) admitter(tp *transparent) func(string) bool {
	return func(name string) bool {
		l, ok := a.proxy.Allow(tp.id)
		if !ok {
			// Removed from the proxy as it stops: the questions the
			// stub answers or counts until then are judged by the
			// list it had, not refused as off it.
			l = tp.lastAllow.Load()
		}
		return l != nil && l.AdmitsName(name)
	}
}

// close stops what tp serves in this process and waits for it: the
// stub, its sockets and the steered listener (the proxy's Trial removal
// closes that one too). The steering and its pins stay (dropTransparent
// removes them), as a successor or the keeper may hold the sockets.
func (tp *transparent) close() {
	tp.stopStub()
	tp.release()
	tp.socks.close()
	if tp.ln != nil {
		<-tp.ln
	}
	if tp.steer != nil {
		_ = tp.steer.Close()
	}
	if tp.names != nil {
		_ = tp.names.Close()
	}
	if tp.counts != nil {
		_ = unix.Munmap(tp.counts) // the stub, which counted in it, has stopped
		tp.counts = nil
	}
}

// checkTransparent refuses sockets handed over that are not a Trial's
// transparent ones in the namespace with cookie: served as this Trial's,
// another's would get this Trial's policy.
func checkTransparent(s transparentSockets, cookie uint64) error {
	for _, x := range []struct {
		c    syscall.Conn
		addr net.Addr
		want string
	}{{s.udp, s.udp.LocalAddr(), dnsstub.DefaultListen}, {s.tcp, s.tcp.Addr(), dnsstub.DefaultListen}, {s.steered, s.steered.Addr(), steeredListen}} {
		ap, err := netip.ParseAddrPort(x.addr.String())
		want := netip.MustParseAddrPort(x.want)
		if err != nil || ap.Addr().Unmap() != want.Addr() || (want.Port() != 0 && ap.Port() != want.Port()) {
			return fmt.Errorf("a socket on %s, not %s", x.addr, x.want)
		}
		got, err := netnsCookie(x.c)
		if err != nil {
			return err
		}
		if got != cookie {
			return fmt.Errorf("the socket on %s lives in another network namespace", x.addr)
		}
	}
	return nil
}

func netnsCookie(c syscall.Conn) (uint64, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cookie uint64
	var cerr error
	if err := raw.Control(func(fd uintptr) { cookie, cerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE) }); err != nil {
		return 0, err
	}
	return cookie, cerr
}

// listenTransparent opens the stub's sockets and the steered listener in
// the namespace at nsPath.
func listenTransparent(nsPath string) (s transparentSockets, err error) {
	err = netns.Do(nsPath, func() error {
		s, err = openTransparentSockets()
		return err
	})
	if err != nil {
		s.close()
		return transparentSockets{}, transparentListenError(err)
	}
	return s, nil
}

// listenTransparentHere is listenTransparent in the calling thread's
// namespace.
func listenTransparentHere() (transparentSockets, error) {
	s, err := openTransparentSockets()
	if err != nil {
		s.close()
		return transparentSockets{}, transparentListenError(err)
	}
	return s, nil
}

// openTransparentSockets opens the stub's sockets and the steered
// listener in the calling thread's namespace; on error, what it opened
// is in s, for the caller to close. The listeners are plain TCP (a
// sockmap holds no MPTCP socket, which Go listens with by default) and
// carry the clients' keepalive (tcplisten.Config).
func openTransparentSockets() (s transparentSockets, err error) {
	lc := tcplisten.Config()
	ctx := context.Background()
	pc, err := lc.ListenPacket(ctx, "udp4", dnsstub.DefaultListen)
	if err != nil {
		return s, err
	}
	s.udp = pc.(*net.UDPConn)
	ln, err := lc.Listen(ctx, "tcp4", dnsstub.DefaultListen)
	if err != nil {
		return s, err
	}
	s.tcp = ln.(*net.TCPListener)
	ln, err = lc.Listen(ctx, "tcp4", steeredListen)
	if err != nil {
		return s, err
	}
	s.steered = ln.(*net.TCPListener)
	return s, nil
}

// transparentListenError says why the transparent sockets could not be
// opened, and what to do.
func transparentListenError(err error) error {
	if errors.Is(err, syscall.EACCES) {
		// Port 53 is privileged in the Trial's namespace as anywhere.
		return fmt.Errorf("open the DNS stub's sockets on %s: %w: binding port 53 needs CAP_NET_BIND_SERVICE, which this agent runs without; give it the capability (deploy/trialnet.service and the Kubernetes manifest list it), or create the Trial with --no-transparent", dnsstub.DefaultListen, err)
	}
	return fmt.Errorf("open the DNS stub's sockets and the transparent listener (lo needs %s): %w", netip.MustParseAddrPort(dnsstub.DefaultListen).Addr(), err)
}

// namesFile keeps, per Trial, the names its stub handed out and their
// addresses, one "ADDRESS NAME" a line, so that an agent that restarts
// gives each address the same name: a connection to an address handed
// out before the restart must mean what it meant. Root-only, appended to
// before each answer, at most dnsstub.DefaultMaxNames lines.
func (a *Agent) namesFile(id string) string {
	return filepath.Join(a.cfg.Host.StateDir, id+namesSuffix)
}

// dnsCountsFile keeps, per Trial, its stub's counts (dnsstub.Counts),
// mapped shared: a stub started by a later agent, after a restart, a
// crash or a hand-over, counts on where the last one stopped, so the
// receipt's DNS counts are the Trial's, not one process's. Root-only, a
// header (dnsCountsMagic, then the counts' size) and the words.
func (a *Agent) dnsCountsFile(id string) string {
	return filepath.Join(a.cfg.Host.StateDir, id+dnsCountsSuffix)
}

// The suffixes of the names and counts files, after the Trial's id.
const (
	namesSuffix     = ".names"
	dnsCountsSuffix = ".dnscounts"
)

const (
	dnsCountsMagic  = "TNDNSCT1"
	dnsCountsHeader = 64 // the words start on a cache line of their own
	dnsCountsLen    = 4096
)

// The header and the counts fit the page mapped: a stub that counted
// more than this would not compile.
var _ [dnsCountsLen - dnsCountsHeader - dnsstub.CountsSize]byte

// mapDNSCounts maps Trial id's counts file, made zeroed if it is not
// there. A file of another layout (an agent whose stub counts other
// things) is started anew, and the log says so: its words would be read
// as the wrong counts.
func (a *Agent) mapDNSCounts(id string) ([]byte, error) {
	path := a.dnsCountsFile(id)
	// Not through a link, nor onto another kind of file: the agent, as
	// root, truncates and maps what it opens.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w (a link or another kind of file there is not the agent's: remove it)", err)
	}
	defer f.Close()
	header := make([]byte, dnsCountsHeader)
	copy(header, dnsCountsMagic)
	binary.LittleEndian.PutUint32(header[len(dnsCountsMagic):], uint32(dnsstub.CountsSize))
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is a %s, not the agent's file: remove it", path, st.Mode().Type())
	}
	got := make([]byte, dnsCountsHeader)
	if st.Size() != 0 {
		if _, err := f.ReadAt(got, 0); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
	}
	if st.Size() != dnsCountsLen || !bytes.Equal(got, header) {
		if st.Size() != 0 {
			a.log.Warn("the DNS stub's counts file is not this agent's layout: counting anew", "trial", id, "path", path)
		}
		if err := f.Truncate(0); err != nil {
			return nil, err
		}
		if err := f.Truncate(dnsCountsLen); err != nil {
			return nil, err
		}
		if _, err := f.WriteAt(header, 0); err != nil {
			return nil, err
		}
	}
	return unix.Mmap(int(f.Fd()), 0, dnsCountsLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

// readNames reads a names file: at most DefaultMaxNames lines, each an
// address and a name (the stub checks both again). A last line without
// its newline is a write cut short: its answer was never sent, and it is
// left out.
func readNames(r io.Reader) ([]dnsstub.Assigned, error) {
	const maxLine = 64 + 253
	br := bufio.NewReaderSize(io.LimitReader(r, int64(dnsstub.DefaultMaxNames+1)*(maxLine+1)), maxLine+1)
	var out []dnsstub.Assigned
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", len(out)+1, err)
		}
		addr, name, ok := strings.Cut(string(bytes.TrimSuffix(line, []byte("\n"))), " ")
		a, perr := netip.ParseAddr(addr)
		if !ok || perr != nil {
			return nil, fmt.Errorf("line %d is not an address and a name", len(out)+1)
		}
		if len(out) == dnsstub.DefaultMaxNames {
			return nil, fmt.Errorf("more than %d names", dnsstub.DefaultMaxNames)
		}
		out = append(out, dnsstub.Assigned{Name: name, Addr: a})
	}
}

// recordName appends one name the stub hands out, before its answer. A
// line written in part (the disk full) is cut off again: a later line
// appended to it would make the file unreadable to the next agent.
func (tp *transparent) recordName(name string, a netip.Addr) error {
	st, err := tp.names.Stat()
	if err != nil {
		return err
	}
	if _, err = tp.names.WriteString(a.String() + " " + name + "\n"); err != nil {
		return errors.Join(err, tp.names.Truncate(st.Size()))
	}
	return nil
}

// dropTransparent removes what a Trial's transparent mode keeps beyond
// this process (the steering's pins, the names file): the Trial is gone.
func (a *Agent) dropTransparent(id string, cgroupID uint64) {
	if cgroupID != 0 {
		if err := bpf.RemoveSteerPins(a.host.BPF.SteerPin(cgroupID)); err != nil {
			a.log.Warn("the steering's pins were not removed", "trial", id, "error", err)
		}
	}
	if a.cfg.Host.StateDir != "" {
		// Files: one unlink each, where os.Remove tries an rmdir after an
		// unlink that failed (an ephemeral agent's Trial has neither).
		_ = unix.Unlink(a.namesFile(id))
		_ = unix.Unlink(a.dnsCountsFile(id))
	}
}

// startTransparent starts Trial lt's transparent mode if its Spec asks
// for it, on the sockets inh (a predecessor's or the keeper's, else
// new), and gives the keeper copies of them.
func (a *Agent) startTransparent(lt *trial, inh transparentSockets) error {
	if !lt.info.Transparent {
		inh.close()
		return nil
	}
	tp, err := a.openTransparent(lt, inh)
	if err != nil {
		return err
	}
	lt.mu.Lock()
	lt.tp = tp
	lt.mu.Unlock()
	if a.keeper != nil {
		names, files, err := a.transparentFiles(lt)
		if err != nil {
			a.log.Warn("keeper: transparent sockets not kept", "trial", lt.info.ID, "error", err)
			return nil
		}
		created := make([]string, len(names))
		for i := range created {
			created[i] = keeper.TrialCreated(lt.info.Created)
		}
		a.keeper.PutFiles(lnameStrings(names), created, files)
		closeAll(files)
	}
	return nil
}

// transparentFiles are copies of Trial lt's transparent sockets, by
// name (none when it has no transparent mode); the caller closes them.
func (a *Agent) transparentFiles(lt *trial) ([]lname.Name, []*os.File, error) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if !lt.keepsTransparent() {
		return nil, nil, nil
	}
	return lt.tp.socks.files(lt.info.ID)
}

// keepsTransparent reports whether the keeper is to hold copies of the
// Trial's transparent sockets (transparentSockets.files); lt.mu is held.
func (lt *trial) keepsTransparent() bool {
	tp := lt.tp
	// Paused for a hand-over, or handed over (the stub stopped, its
	// copies released): the successor's to keep.
	return tp != nil && tp.held == nil && tp.socks.udp != nil && tp.socks.tcp != nil && tp.socks.steered != nil
}

// keptCount is how many of the Trials' sockets the keeper is to hold:
// their endpoint listeners and the transparent sockets transparentFiles
// copies, counted without copying them.
func (a *Agent) keptCount() int {
	n := 0
	for _, lt := range a.liveTrials() {
		lt.mu.Lock()
		n += len(lt.lns)
		if lt.keepsTransparent() {
			n += transparentKept
		}
		lt.mu.Unlock()
	}
	return n
}

func lnameStrings(ns []lname.Name) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.String()
	}
	return out
}

// allTrials are the Trials in the registry, in whatever state.
func (a *Agent) allTrials() []*trial {
	a.mu.Lock()
	defer a.mu.Unlock()
	lts := make([]*trial, 0, len(a.trials))
	for _, lt := range a.trials {
		lts = append(lts, lt)
	}
	return lts
}

// liveTrials are the live Trials.
func (a *Agent) liveTrials() []*trial {
	a.mu.Lock()
	defer a.mu.Unlock()
	lts := make([]*trial, 0, len(a.trials))
	for _, lt := range a.trials {
		if lt.state == stateLive {
			lts = append(lts, lt)
		}
	}
	return lts
}

// pauseStubs stops every Trial's stub for a hand-over (transparent.pause);
// if one cannot be paused, those paused resume and the hand-over fails.
func (a *Agent) pauseStubs() error {
	var paused []*trial
	for _, lt := range a.liveTrials() {
		lt.mu.Lock()
		tp := lt.tp
		var err error
		if tp != nil {
			err = tp.pause()
		}
		lt.mu.Unlock()
		if err != nil {
			for _, p := range paused {
				a.resumeStub(p)
			}
			return err
		}
		paused = append(paused, lt)
	}
	return nil
}

// resumeStubs serves every paused stub again: the hand-over failed.
func (a *Agent) resumeStubs() {
	for _, lt := range a.liveTrials() {
		a.resumeStub(lt)
	}
}

func (a *Agent) resumeStub(lt *trial) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.tp != nil {
		if err := lt.tp.resume(a); err != nil {
			a.log.Error("transparent mode: the DNS stub could not serve again after a failed hand-over; lookups in the Trial fail until the agent restarts", "trial", lt.info.ID, "error", err)
		}
	}
}

// releaseStubs drops the sockets paused stubs kept: the successor serves.
func (a *Agent) releaseStubs() {
	for _, lt := range a.liveTrials() {
		lt.mu.Lock()
		if lt.tp != nil {
			lt.tp.release()
		}
		lt.mu.Unlock()
	}
}

// steerAhead is the steering an embedded agent loads while it starts,
// for its Trial's default pool (shellPool): a program load (2.5 ms of
// CPU, most of a transparent create's own) off the way to the command.
type steerAhead struct {
	done  chan struct{}
	s     *bpf.Steer
	err   error
	taken atomic.Bool
}

func loadSteerAhead() *steerAhead {
	sa := &steerAhead{done: make(chan struct{})}
	go func() {
		defer close(sa.done)
		sa.s, sa.err = bpf.LoadSteer(shellPool)
	}()
	return sa
}

// take is the steering loaded ahead, once, when it loaded (nil: OpenSteer
// loads one, and says why if it cannot either).
func (sa *steerAhead) take(log *slog.Logger) *bpf.Steer {
	if sa == nil || !sa.taken.CompareAndSwap(false, true) {
		return nil
	}
	<-sa.done
	if sa.err != nil {
		log.Warn("transparent mode: the steering loaded ahead failed; loading it again", "error", sa.err)
	}
	return sa.s
}

// close frees the steering loaded ahead if no Trial took it.
func (sa *steerAhead) close() {
	if sa == nil || !sa.taken.CompareAndSwap(false, true) {
		return
	}
	<-sa.done
	if sa.s != nil {
		_ = sa.s.Close()
	}
}
