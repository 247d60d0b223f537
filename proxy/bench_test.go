//go:build linux

package proxy

import (
	"io"
	"net"
	"testing"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/internal/tlstest"
)

// benchProxy is a test proxy without limits that matter, its events
// drained, and the CONNECT head for its one allowed name.
func benchProxy(b *testing.B) (*testProxy, []byte) {
	tp := newTestProxy(b, proxyOpts{allow: []string{"api.example.com:443"},
		limits: &trialspec.ProxyLimits{ConnectRate: 1e9, ConnectBurst: 1 << 30, MaxTunnels: 1 << 20, MaxClientConns: 1 << 20, MaxPendingHeads: 1 << 20}})
	go func() {
		for range tp.events {
		}
	}()
	tp.dns.set("api.example.com", 3600, "93.184.216.34")
	return tp, []byte(connectHead("api.example.com:443"))
}

// BenchmarkConnectFirstByte is the in-process CONNECT path (parse, policy,
// cached DNS, guard, dial, first byte) against a loopback echo upstream;
// BenchmarkDirectFirstByte is the same upstream without the proxy. The
// system comparison with tinyproxy is in test/proxybench.
func BenchmarkConnectFirstByte(b *testing.B) {
	tp, head := benchProxy(b)
	b.ResetTimer()
	for range b.N {
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = c.Write(head)
		buf := make([]byte, 39) // "HTTP/1.1 200 Connection established\r\n\r\n"
		if _, err := io.ReadFull(c, buf); err != nil || string(buf[9:12]) != "200" {
			b.Fatalf("%q %v", buf, err)
		}
		_, _ = c.Write([]byte{'x'})
		if _, err := io.ReadFull(c, buf[:1]); err != nil {
			b.Fatal(err)
		}
		_ = c.Close()
	}
}

func BenchmarkDirectFirstByte(b *testing.B) {
	up := newUpstream(b, echo)
	b.ResetTimer()
	for range b.N {
		c, err := net.Dial("tcp", up.ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		buf := []byte{'x'}
		_, _ = c.Write(buf)
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
		_ = c.Close()
	}
}

// BenchmarkConnectParallel opens tunnels from 64 concurrent clients.
func BenchmarkConnectParallel(b *testing.B) {
	tp, head := benchProxy(b)
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 39)
		for pb.Next() {
			c, err := net.Dial("tcp", tp.addr)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = c.Write(head)
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Error(err)
			}
			_, _ = c.Write([]byte{'x'})
			_, _ = io.ReadFull(c, buf[:1])
			_ = c.Close()
		}
	})
}

// BenchmarkConnectTLSFirstByte is BenchmarkConnectFirstByte for a TLS
// tunnel: a captured ClientHello goes up, a ServerHello record comes
// back, then one byte each way. It measures what the proxy adds to a TLS
// handshake (the ClientHello check, the wait for the server's answer),
// not the cryptography, which the client and server do.
func BenchmarkConnectTLSFirstByte(b *testing.B) {
	hello := tlstest.ClientHello(b, "api.example.com")
	sh := tlstest.ServerHelloRecord(false)
	tp := newTestProxy(b, proxyOpts{allow: []string{"api.example.com:443"},
		limits: &trialspec.ProxyLimits{ConnectRate: 1e9, ConnectBurst: 1 << 30, MaxTunnels: 1 << 20, MaxClientConns: 1 << 20, MaxPendingHeads: 1 << 20},
		upstream: func(c *net.TCPConn) {
			if _, err := io.ReadFull(c, make([]byte, len(hello))); err != nil {
				return
			}
			_, _ = c.Write(sh)
			echo(c)
		}})
	go func() {
		for range tp.events {
		}
	}()
	tp.dns.set("api.example.com", 3600, "93.184.216.34")
	head := []byte(connectHead("api.example.com:443"))
	b.ResetTimer()
	for range b.N {
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = c.Write(head)
		buf := make([]byte, 39+len(sh))
		if _, err := io.ReadFull(c, buf[:39]); err != nil || string(buf[9:12]) != "200" {
			b.Fatalf("%q %v", buf, err)
		}
		_, _ = c.Write(hello)
		if _, err := io.ReadFull(c, buf[:len(sh)]); err != nil {
			b.Fatal(err)
		}
		_, _ = c.Write([]byte{'x'})
		if _, err := io.ReadFull(c, buf[:1]); err != nil {
			b.Fatal(err)
		}
		_ = c.Close()
	}
}
