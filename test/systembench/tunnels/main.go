//go:build linux

// Command tunnels is a Trial's client load: it opens N tunnels through a
// CONNECT proxy, C at a time, each to an upstream that echoes one byte
// and closes, and prints how long they took:
//
//	tunnels 127.0.0.1:3128 upstream.example.test:9002 2000 1
//	n=2000 secs=0.812 p50us=398 p99us=702
//
// It runs inside the Trial (its cgroup, namespace and filters), so that
// the agent serves it as it serves any Trial's process.
package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: tunnels PROXY TARGET N CLIENTS")
		os.Exit(2)
	}
	n, err1 := strconv.Atoi(os.Args[3])
	clients, err2 := strconv.Atoi(os.Args[4])
	if err1 != nil || err2 != nil || n < 1 || clients < 1 {
		fmt.Fprintln(os.Stderr, "tunnels: N and CLIENTS are positive counts")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], n, clients); err != nil {
		fmt.Fprintln(os.Stderr, "tunnels:", err)
		os.Exit(1)
	}
}

func run(proxy, target string, n, clients int) error {
	lats := make([][]time.Duration, clients)
	errs := make([]error, clients)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				if err := tunnel(proxy, target); err != nil {
					errs[c] = err
					return
				}
				lats[c] = append(lats[c], time.Since(t0))
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	fmt.Printf("n=%d secs=%.4f p50us=%d p99us=%d\n", len(all), took.Seconds(),
		all[len(all)/2].Microseconds(), all[len(all)*99/100].Microseconds())
	return nil
}

// tunnel makes one CONNECT, sends a byte, reads it back and resets the
// connection: the upstream closes first, so neither side of the Trial's
// namespace keeps thousands of connections in TIME_WAIT.
func tunnel(proxy, target string) error {
	c, err := net.DialTimeout("tcp", proxy, 5*time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = c.(*net.TCPConn).SetLinger(0); _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		return err
	}
	br := bufio.NewReaderSize(c, 512)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("CONNECT: %s", resp.Status)
	}
	if _, err := c.Write([]byte{'x'}); err != nil {
		return err
	}
	if b, err := br.ReadByte(); err != nil || b != 'x' {
		return fmt.Errorf("echo: %q %v", b, err)
	}
	return nil
}
