// Command naiveproxy is test/proxybench's baseline peer: the CONNECT
// proxy one writes first with net/http (Hijack, then io.Copy both ways),
// with no policy, no limits and no records. It dials whatever the CONNECT
// names with the system resolver; the benchmark gives it an address.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:3128", "listen on ADDR:PORT")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() { _ = http.Serve(ln, http.HandlerFunc(connect)) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}

func connect(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
		return
	}
	up, err := net.Dial("tcp", r.Host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	client, rw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		_ = up.Close()
		return
	}
	defer client.Close()
	defer up.Close()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent after its request may sit in the server's
	// reader; after them, copy from the connection itself, so that
	// TCP-to-TCP io.Copy can splice.
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			return
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go pipe(&wg, up, client)
	go pipe(&wg, client, up)
	wg.Wait()
}

// pipe copies until EOF, then passes the EOF on with CloseWrite: each
// direction ends on its own (half-close), and the tunnel when both have.
func pipe(wg *sync.WaitGroup, dst, src net.Conn) {
	defer wg.Done()
	_, _ = io.Copy(dst, src)
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
