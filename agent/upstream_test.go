//go:build linux

package agent

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	trialspec "github.com/trialnet/trialnet/trial"
)

// relayProxy is a CONNECT proxy on a test host that resolves names from
// its own table, dials them and relays, recording what it was asked.
type relayProxy struct {
	mu   sync.Mutex
	asks []string // "target auth"
}

func (rp *relayProxy) serve(c net.Conn, names map[string]netip.Addr) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	rp.mu.Lock()
	rp.asks = append(rp.asks, req.Host+" "+req.Header.Get("Proxy-Authorization"))
	rp.mu.Unlock()
	host, port, _ := net.SplitHostPort(req.Host)
	a, ok := names[host]
	if !ok {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	up, err := net.Dial("tcp", net.JoinHostPort(a.String(), port))
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	defer up.Close()
	_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	go func() { _, _ = io.Copy(up, br); _ = up.(*net.TCPConn).CloseWrite() }()
	_, _ = io.Copy(c, up)
}

func (rp *relayProxy) asked() []string {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return append([]string(nil), rp.asks...)
}

// An agent with an upstream proxy opens a Trial's allowed connections
// through it, by CONNECT, forwarded and transparent alike; a refused
// name never reaches it; its credential is in nothing the Trial or an
// auditor reads.
func TestPrivilegedUpstreamProxyAgent(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 247) // no names: the agent's DNS is never asked
	rp := &relayProxy{}
	proxyAddr := netip.AddrPortFrom(w.host.Addr4, 3128)
	ln, err := w.host.NS.Listen(context.Background(), "tcp", proxyAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	names := map[string]netip.Addr{"upstream.example.test": w.host.Addr4}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { rp.serve(c, names) })
		}
	})
	secret := "corp-pw-9f3a"
	cred := filepath.Join(t.TempDir(), "upstream")
	if err := os.WriteFile(cred, []byte("trialnet:"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := w.config(t)
	cfg.File, err = config.ParseFile(fmt.Appendf(nil, "upstream_proxy: {address: %q, credentials_file: %q}\n", proxyAddr, cred))
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, cfg)
	entry := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-upstream", Allow: []string{entry}})
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + entry + "/"
	if code, out := through(t, a, info.ID, url); code != 0 || out != "hello from "+entry {
		t.Fatalf("CONNECT: curl exit %d: %s", code, out)
	}
	if code, out := curl(t, a, info.ID, "-x", ProxyURL, url); code != 0 || out != "hello from "+entry {
		t.Fatalf("forwarded: curl exit %d: %s", code, out)
	}
	addr, _ := stubLookup(t, info.Netns, "udp", "upstream.example.test")
	if code, out := transparentCurl(t, info, "--resolve", fmt.Sprintf("%s:%s", entry, addr), url); code != 0 || out != "hello from "+entry {
		t.Fatalf("transparent: curl exit %d: %s", code, out)
	}
	if code, _ := through(t, a, info.ID, fmt.Sprintf("http://other.example.test:%d/", upstreamPort)); code == 0 {
		t.Fatal("a name off the allowlist was reached")
	}
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("trialnet:"+secret))
	want := entry + " " + auth
	// Transparent plain HTTP is dialled once when it connects, and again
	// by the forwarder once its first bytes say HTTP (proxy.go's
	// serveTransparent): four CONNECTs for three requests.
	asks := rp.asked()
	if len(asks) != 4 {
		t.Errorf("the upstream proxy was asked %d times, want 4", len(asks))
	}
	for _, ask := range asks {
		if ask != want {
			t.Fatalf("the upstream proxy was asked %q; want only CONNECT %s with the credential", asks, entry)
		}
	}
	recs, err := a.Audit(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.Stats(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal([]any{recs, st, info})
	if s := string(b); strings.Contains(s, secret) || strings.Contains(s, strings.TrimPrefix(auth, "Basic ")) {
		t.Fatal("the credential is in the Trial's records, stats or description")
	}
}
