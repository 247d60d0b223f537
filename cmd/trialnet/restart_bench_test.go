//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/netns"
)

// BenchmarkAgentRestart measures how long a CONNECT waits while the agent
// is replaced: by hand-over (a second agent takes over), and by a crash
// (SIGKILL, then a new agent started at once), beside the same stream of
// CONNECTs to an agent left alone (steady, the reference). Each iteration
// is one replacement under a stream of back-to-back CONNECTs, each
// echoing a line, made from the Trial's network namespace; it reports the
// longest wait of any CONNECT served and the median. None may be refused;
// in a crash, the one the killed agent was serving is cut (reported as
// cut/op).
func BenchmarkAgentRestart(b *testing.B) {
	privtest.Require(b)
	for _, mode := range []string{"steady", "handover", "crash"} {
		b.Run(mode, func(b *testing.B) { benchRestart(b, mode) })
	}
}

func benchRestart(b *testing.B, mode string) {
	a := newAgentWithConfig(b, "bench-"+mode, echoWorld(b)+"limits:\n  connects_per_second: 5000\n  connect_burst: 5000\n  records_per_second: 5000\n  record_burst: 5000\n")
	a.start(b)
	createTrial(b, a.sock, "rb")
	info, err := client.NewClient(a.sock).Get(b.Context(), "rb")
	if err != nil {
		b.Fatal(err)
	}
	ns, err := netns.Open(filepath.Dir(info.Netns), "rb")
	if err != nil {
		b.Fatal(err)
	}
	proxyAddr := agent.ProxyEndpoints[0].String()
	var worst, waits []time.Duration
	cuts := 0
	b.ResetTimer()
	for range b.N {
		var mu sync.Mutex
		var these []time.Duration
		var failed error
		cut := 0
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				err := echoConnect(ns, proxyAddr)
				mu.Lock()
				var refused *refusedError
				switch {
				case err == nil:
					these = append(these, time.Since(start))
				case mode == "crash" && !errors.As(err, &refused):
					cut++
				case failed == nil:
					failed = err
				}
				mu.Unlock()
			}
		}()
		time.Sleep(200 * time.Millisecond)
		switch mode {
		case "handover":
			old := a.cmd
			a.startNext(b)
			go func() { _ = old.Wait() }()
		case "crash":
			a.stop(b, syscall.SIGKILL)
			a.start(b)
		}
		time.Sleep(300 * time.Millisecond)
		close(stop)
		<-done
		if failed != nil {
			b.Fatalf("%s: a CONNECT failed: %v", mode, failed)
		}
		worst = append(worst, slices.Max(these))
		waits = append(waits, these...)
		cuts += cut
	}
	b.StopTimer()
	slices.Sort(waits)
	b.ReportMetric(float64(slices.Max(worst).Microseconds())/1000, "max-wait-ms")
	b.ReportMetric(float64(waits[len(waits)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(cuts)/float64(b.N), "cut/op")
	a.stop(b, syscall.SIGTERM)
}

// refusedError is a CONNECT refused: no listener, or an answer other
// than 200.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return "refused: " + e.err.Error() }

// echoConnect opens a tunnel through the proxy endpoint in ns to the
// echo server and echoes one line.
func echoConnect(ns *netns.Namespace, proxyAddr string) error {
	var c net.Conn
	if err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", proxyAddr, 30*time.Second)
		return err
	}); err != nil {
		return &refusedError{err}
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", echoTarget, echoTarget)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return &refusedError{fmt.Errorf("answered %s", resp.Status)}
	}
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return err
	}
	line, err := br.ReadString('\n')
	if err != nil || line != "ping\n" {
		return fmt.Errorf("echo %q: %v", line, err)
	}
	return nil
}
