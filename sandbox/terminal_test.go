//go:build linux

package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/internal/testpty"
	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// answering is a terminal emulator standing in for the operator's, on
// the master of a test pty: it answers cursor position requests
// (ESC[6n) and, unless deaf, status requests (ESC[5n), each delay after
// it read it and in order, as a terminal behind an ssh link does; the
// 8-bit CSI (a raw 0x9B) too, as a terminal in 8-bit mode does; spacing
// apart, as one over a slow link sends them. Like a
// strict VT parser it ignores everything in a DCS until ST or CAN. With a
// rate, it reads that many bytes a second at most, as output reaches a
// terminal over a slow link.
type answering struct {
	master  *os.File
	delay   time.Duration
	spacing time.Duration
	deaf    bool
	rate    int

	mu      sync.Mutex
	changed *sync.Cond
	out     bytes.Buffer // what it was sent
	queued  int          // answers due
	sent    int          // answers written
	status  int          // status requests among them
	answers chan answer
	done    chan struct{}
}

type answer struct {
	due time.Time
	b   string
}

// endOfOutput is written to the terminal after everything else: once the
// terminal has read it, it has read all of the Trial's output.
const endOfOutput = "\r\n<end of output>\r\n"

func newAnswering(t *testing.T, master *os.File, delay, spacing time.Duration, deaf bool) *answering {
	return startAnswering(t, &answering{master: master, delay: delay, spacing: spacing, deaf: deaf})
}

// startAnswering starts the terminal a describes.
func startAnswering(t *testing.T, a *answering) *answering {
	a.answers, a.done = make(chan answer, 1<<14), make(chan struct{})
	a.changed = sync.NewCond(&a.mu)
	go a.read()
	go a.write()
	t.Cleanup(func() { close(a.done) })
	return a
}

func (a *answering) read() {
	const (
		ground = iota
		esc
		csi
		dcs
		dcsEsc
	)
	st := ground
	var params []byte
	buf := make([]byte, 4096)
	for {
		n, err := a.master.Read(buf)
		if err != nil {
			return
		}
		if a.rate > 0 {
			time.Sleep(time.Duration(n) * time.Second / time.Duration(a.rate))
		}
		now := time.Now()
		a.mu.Lock()
		a.out.Write(buf[:n])
		for _, b := range buf[:n] {
			switch {
			case b == 0x18:
				st = ground
			case st == dcs:
				if b == 0x1b {
					st = dcsEsc
				}
			case st == dcsEsc:
				st = dcs
				if b == '\\' {
					st = ground
				}
			case b == 0x1b:
				st = esc
			case b == 0x9b:
				st, params = csi, params[:0]
			case st == esc && b == '[':
				st, params = csi, params[:0]
			case st == esc && b == 'P':
				st = dcs
			case st == esc:
				st = ground
			case st == csi && b >= 0x20 && b < 0x40:
				params = append(params, b)
			case st == csi:
				st = ground
				if b != 'n' {
					break
				}
				switch string(params) {
				case "6":
					a.queue(now, "\x1b[2;1R")
				case "5":
					if !a.deaf {
						a.status++
						a.queue(now, "\x1b[0n")
					}
				}
			}
		}
		a.changed.Broadcast()
		a.mu.Unlock()
	}
}

func (a *answering) queue(now time.Time, b string) {
	a.queued++
	a.answers <- answer{now.Add(a.delay), b}
}

func (a *answering) write() {
	for {
		var ans answer
		select {
		case ans = <-a.answers:
		case <-a.done:
			return
		}
		time.Sleep(time.Until(ans.due))
		_, _ = a.master.Write([]byte(ans.b))
		time.Sleep(a.spacing)
		a.mu.Lock()
		a.sent++
		a.changed.Broadcast()
		a.mu.Unlock()
	}
}

// await waits until cond holds, bounded.
func (a *answering) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	timer := time.AfterFunc(20*time.Second, func() {
		a.mu.Lock()
		a.changed.Broadcast()
		a.mu.Unlock()
	})
	defer timer.Stop()
	end := time.Now().Add(20 * time.Second)
	a.mu.Lock()
	defer a.mu.Unlock()
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("the terminal: no %s within 20s; it read %q", what, a.out.String())
		}
		a.changed.Wait()
	}
}

// leftFor returns what the terminal's input holds for the caller's shell
// once the terminal has read all output (slave written after the Trial)
// and given every answer it will: everything read from slave before a
// mark the terminal types last.
func (a *answering) leftFor(t *testing.T, slave *os.File) string {
	t.Helper()
	if _, err := slave.WriteString(endOfOutput); err != nil {
		t.Fatal(err)
	}
	a.await(t, "end of output", func() bool { return strings.Contains(a.out.String(), endOfOutput) })
	a.await(t, "answers", func() bool { return a.sent == a.queued })
	const mark = "<typed after>"
	if _, err := a.master.WriteString(mark); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 4096)
	fds := []unix.PollFd{{Fd: int32(slave.Fd()), Events: unix.POLLIN}}
	for end := time.Now().Add(20 * time.Second); !bytes.HasSuffix(got, []byte(mark)); {
		if time.Now().After(end) {
			t.Fatalf("the mark typed on the terminal never came; read %q", got)
		}
		if _, err := unix.Poll(fds, 100); err != nil && err != unix.EINTR {
			t.Fatal(err)
		}
		if fds[0].Revents&unix.POLLIN == 0 {
			continue
		}
		n, err := unix.Read(int(slave.Fd()), buf)
		if err != nil && err != unix.EAGAIN && err != unix.EINTR {
			t.Fatal(err)
		}
		got = append(got, buf[:max(n, 0)]...)
	}
	return string(got[:len(got)-len(mark)])
}

// A Trial writes queries to the caller's terminal and exits; the terminal
// answers late, as one behind an ssh link does (output buffered there is
// read long after it was written). With stdin not a terminal (/dev/null)
// or a terminal, nothing of the answers is left in the terminal's input
// for the caller's shell to read, whatever the form of the query, however
// many, however late (up to the bound of the wait), and whatever the Trial
// does to the relay's own status request (the fence): requests of its
// own, an escape sequence left unfinished. trialnet says nothing then,
// and says on its stderr (Command.Notices, never the Trial's stream) when
// the fence goes unanswered.
func TestPrivilegedLateTerminalAnswersAreDropped(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	const late = 1500 * time.Millisecond // past the old 500 ms window
	for _, c := range []struct {
		name    string
		printf  string // the Trial's output, as printf's format
		delay   time.Duration
		spacing time.Duration // between answers
		tty     bool          // stdin is the terminal too
		wronly  bool          // stdout is the terminal opened write-only
		deaf    bool          // the terminal answers no status request
		answers int           // the Trial's queries the terminal answers (status requests among them)
	}{
		{"stdin /dev/null, 50ms", `\033[6n`, 50 * time.Millisecond, 0, false, false, false, 1},
		{"stdin /dev/null, 300ms", `\033[6n`, 300 * time.Millisecond, 0, false, false, false, 1},
		{"stdin the terminal, 300ms", `\033[6n`, 300 * time.Millisecond, 0, true, false, false, 1},
		{"stdin /dev/null, 1500ms", `\033[6n`, late, 0, false, false, false, 1},
		{"stdin the terminal, 1500ms", `\033[6n`, late, 0, true, false, false, 1},
		{"8-bit CSI", `\2336n`, 50 * time.Millisecond, 0, false, false, false, 1},
		{"8-bit CSI after a UTF-8 lead byte", `\304\2336n`, 50 * time.Millisecond, 0, true, false, false, 1},
		{"a status request of the Trial's", `\033[5n\033[6n`, late, 100 * time.Millisecond, false, false, false, 2},
		{"an unfinished DCS at exit", `\033[6n\033P`, 50 * time.Millisecond, 0, false, false, false, 1},
		{"a flood", strings.Repeat(`\033[6n`, 1000), 300 * time.Millisecond, 0, true, false, false, 1000},
		{"stdout write-only, 1500ms", `\033[6n`, late, 0, false, true, false, 1},
		{"a terminal that answers no status request", `\033[6n`, 300 * time.Millisecond, 0, false, false, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			master, slave := testpty.Open(t, 24, 80)
			// As a shell's line editor leaves it: raw, so that whatever
			// arrives is there to read, newline or not.
			if _, err := term.MakeRaw(int(slave.Fd())); err != nil {
				t.Fatal(err)
			}
			a := newAnswering(t, master, c.delay, c.spacing, c.deaf)
			var stdin, stdout *os.File = devnull, slave
			if c.tty {
				stdin = slave
			}
			if c.wronly {
				if stdout, err = os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", slave.Fd()), os.O_WRONLY|unix.O_NOCTTY, 0); err != nil {
					t.Fatal(err)
				}
				defer stdout.Close()
			}
			notices := &noticeBuf{}
			p, err := tr.Start(Command{Args: []string{"printf", c.printf}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody,
				Stdin: stdin, Stdout: stdout, Stderr: stdout, Notices: notices})
			if err != nil {
				t.Fatal(err)
			}
			if code, err := p.Wait(); code != 0 || err != nil {
				t.Fatalf("printf: %d %v", code, err)
			}
			if left := a.leftFor(t, slave); left != "" {
				t.Fatalf("%d bytes of the terminal's answers wait in its input for the caller's shell: %q", len(left), left)
			}
			if said := notices.String(); c.deaf != strings.Contains(said, "may still come and be typed into your shell") {
				t.Errorf("trialnet said %q on its stderr; a notice wanted: %v", said, c.deaf)
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if strings.Contains(a.out.String(), "may still come") {
				t.Errorf("the notice went to the terminal by the Trial's stream: %q", a.out.String())
			}
			trials := strings.Count(c.printf, `5n`)
			if want := c.answers + 1; !c.deaf && (a.queued != want || a.status != trials+1) {
				t.Errorf("the terminal gave %d answers (%d to status requests), want %d: the Trial's and the fence's", a.queued, a.status, want)
			}
		})
	}
}

// While the Trial runs, the terminal's answers to its queries and the
// operator's typing reach it.
func TestPrivilegedTerminalAnswersReachTheTrial(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	a, p, master, slave := startOnTerminal(t, tr, `stty raw -echo; printf '\033[6n\033[5n'; head -c 15 | od -An -c | tr -d ' \n'; echo; echo done`)
	a.await(t, "answers", func() bool { return a.sent == 2 })
	if _, err := master.WriteString("hello"); err != nil {
		t.Fatal(err)
	}
	out := a.outputOf(t, p)
	if want := `033[2;1R033[0nhello`; !strings.Contains(out, want) {
		t.Errorf("the Trial read %q, want %q (its answers, then the typing)", out, want)
	}
	if left := a.leftFor(t, slave); left != "" {
		t.Fatalf("left for the shell: %q", left)
	}
}

// A Trial on a terminal cannot set the operator's clipboard (OSC 52): the
// operator's next paste ran its text in a shell outside the Trial, in an
// attacker's review. The sequence reaches the terminal without its
// introducer and number, and its text shows as text.
func TestPrivilegedTerminalClipboardWriteIsStopped(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	// "curl x | sh" in base64, for the clipboard, then the title (passed).
	a, p, _, _ := startOnTerminal(t, tr, `printf '\033]52;c;Y3VybCB4IHwgc2gK\007\033]2;a-title\007'; echo done`)
	out := a.outputOf(t, p)
	if strings.Contains(out, "]52") || !strings.Contains(out, "c;Y3VybCB4IHwgc2gK") {
		t.Errorf("the terminal read %q: want the clipboard write's introducer and number left out, its text shown", out)
	}
	if !strings.Contains(out, "\x1b]2;a-title\x07") {
		t.Errorf("the terminal read %q: want the title passed", out)
	}
}

// startOnTerminal starts script in tr on a test pty in raw mode, whose
// master an answering terminal reads.
func startOnTerminal(t *testing.T, tr *Trial, script string) (a *answering, p *Process, master, slave *os.File) {
	t.Helper()
	master, slave = testpty.Open(t, 24, 80)
	if _, err := term.MakeRaw(int(slave.Fd())); err != nil {
		t.Fatal(err)
	}
	a = newAnswering(t, master, 0, 0, false)
	p, err := tr.Start(Command{Args: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody,
		Stdin: slave, Stdout: slave, Stderr: slave})
	if err != nil {
		t.Fatal(err)
	}
	return a, p, master, slave
}

// outputOf waits for p, which ends its output with "done", and returns all
// the terminal read.
func (a *answering) outputOf(t *testing.T, p *Process) string {
	t.Helper()
	if code, err := p.Wait(); code != 0 || err != nil {
		t.Fatalf("the script: %d %v", code, err)
	}
	a.await(t, "done", func() bool { return strings.Contains(a.out.String(), "done") })
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.out.String()
}
