//go:build linux

package sandbox

import (
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/testpty"
	"golang.org/x/term"
)

// These tests drive the relay's end (close, settle, fence) on a real test
// pty with the Trial's output fed to the relay through a pipe: no Trial,
// no root.

// noticeBuf is trialnet's stderr, as the relay writes it.
type noticeBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (n *noticeBuf) Write(p []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.b.Write(p)
}

func (n *noticeBuf) String() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.b.String()
}

// relayOnly is the relay of a Trial whose output went to slave (the
// caller's terminal, raw as a shell's line editor leaves it), fed what
// output writes, and closed, as the Trial's end closes it, once output
// returns (the Trial exited). It returns what the relay said on
// trialnet's stderr.
func relayOnly(t *testing.T, slave *os.File, output func(w io.Writer)) string {
	t.Helper()
	if _, err := term.MakeRaw(int(slave.Fd())); err != nil {
		t.Fatal(err)
	}
	notices := &noticeBuf{}
	tt := &terminal{user: slave, tty: slave, out: slave, notices: notices}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tt.wg.Go(func() { _, _ = io.Copy(scanner{tt}, r) })
	output(w)
	_ = w.Close()
	closed := make(chan struct{})
	go func() {
		tt.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay's close did not return within 30s: the teardown would wait on the terminal")
	}
	return notices.String()
}

// A Trial writes a query every 20 kB of 400 kB of output and exits; its
// terminal is behind a slow link: it reads 100 kB/s and answers each query
// 2.5 s after it read it, later than the fence's old flat 2 s wait. The
// relay waits on while the terminal takes output and sends answers: none
// of them is left for the caller's shell, and nothing needs saying.
func TestFenceOutwaitsASlowLink(t *testing.T) {
	master, slave := testpty.Open(t, 24, 80)
	a := startAnswering(t, &answering{master: master, delay: 2500 * time.Millisecond, rate: 100_000})
	const queries = 20
	notice := relayOnly(t, slave, func(w io.Writer) {
		chunk := strings.Repeat("x", 20_000) + "\x1b[6n"
		for range queries {
			if _, err := io.WriteString(w, chunk); err != nil {
				t.Error(err)
				return
			}
		}
	})
	if left := a.leftFor(t, slave); left != "" {
		t.Fatalf("%d bytes of the terminal's answers wait in its input for the caller's shell: %q (trialnet said %q)", len(left), left, notice)
	}
	if notice != "" {
		t.Errorf("trialnet said %q, with every answer dropped", notice)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.queued != queries+1 || a.status != 1 {
		t.Errorf("the terminal gave %d answers (%d to status requests), want %d: the Trial's and the fence's", a.queued, a.status, queries+1)
	}
}

// Where the fence's answer does not come within the wait, trialnet says on
// its stderr, in one line, that answers may still be typed into the
// shell, and what to do: behind a terminal that answers no status
// request; behind one 2.5 s late with no sign of life meanwhile (a query
// after output sshd buffered); behind one that keeps sending (keys held
// down, reports) and never answers, which cannot hold the teardown past
// the bound either. Whatever reaches the shell, trialnet has said so.
func TestFenceUnansweredIsSaid(t *testing.T) {
	for _, c := range []struct {
		name  string
		a     *answering
		typed bool // the terminal sends bytes all along
	}{
		{"answers no status request", &answering{delay: 50 * time.Millisecond, deaf: true}, false},
		{"answers 2.5s late", &answering{delay: 2500 * time.Millisecond}, false},
		{"sends all along, answers no status request", &answering{deaf: true}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			master, slave := testpty.Open(t, 24, 80)
			c.a.master = master
			a := startAnswering(t, c.a)
			stop := make(chan struct{})
			typing := sync.WaitGroup{}
			if c.typed {
				typing.Go(func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(100 * time.Millisecond):
							_, _ = master.WriteString("k")
						}
					}
				})
			}
			notice := relayOnly(t, slave, func(w io.Writer) { _, _ = io.WriteString(w, "\x1b[6n") })
			close(stop)
			typing.Wait()
			left := a.leftFor(t, slave)
			t.Logf("trialnet said %q; left for the shell: %q", notice, left)
			if strings.Count(notice, "\n") != 1 || !strings.HasSuffix(notice, "\n") || !strings.HasPrefix(notice, "trialnet: ") {
				t.Fatalf("trialnet said %q, want one line of its own", notice)
			}
			for _, want := range []string{"did not answer", "may still come and be typed into your shell", "Ctrl-U"} {
				if !strings.Contains(notice, want) {
					t.Errorf("the notice %q does not say %q", notice, want)
				}
			}
		})
	}
}
