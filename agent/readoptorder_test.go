//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
)

var readopted = regexp.MustCompile(`msg="trial re-adopted" trial=(\S+)`)

// A restarted agent adopts its Trials one after another, each once its
// decision log is replayed, and a Trial's CONNECTs wait until it is
// adopted: a Trial that filled its log (64 MiB, 1.8 s to replay here)
// held back every Trial whose id came after its own. The Trials with the
// smallest logs are adopted first.
func TestPrivilegedReadoptSmallestLogsFirst(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 249, "upstream.example.test")
	p := startAgentWithTrial(t, w, "a-full")
	if _, err := p.c.Create(context.Background(), trialspec.Request{ID: "b-quiet", Allow: []string{fmt.Sprintf("upstream.example.test:%d", upstreamPort)}}); err != nil {
		t.Fatal(err)
	}
	if err := p.first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.first.cmd.Wait()
	// What the Trial's refusals would have written, while no agent runs.
	f, err := os.OpenFile(filepath.Join(p.data, "a-full", "decisions.jsonl"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	var buf []byte
	for i := range 2000 {
		ev := record.Event{Schema: record.EventSchema, ID: fmt.Sprintf("junk-%d", i), Time: time.Now(), Trial: "a-full",
			Method: "CONNECT", Target: fmt.Sprintf("n%d.off.test:443", i), Host: fmt.Sprintf("n%d.off.test", i), Port: 443,
			Decision: record.DecisionDeny, Reason: record.ReasonPolicyDenied, Detail: "not on this Trial's allowlist"}
		if buf, err = ev.AppendJSON(buf); err != nil {
			t.Fatal(err)
		}
		buf = append(buf, '\n')
	}
	if _, err := f.Write(buf); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()

	second := runAgent(t, p.bin, p.args...)
	waitReady(t, p.c, second)
	var order []string
	for _, m := range readopted.FindAllStringSubmatch(second.stderr.String(), -1) {
		order = append(order, m[1])
	}
	if want := []string{"b-quiet", "a-full"}; !slices.Equal(order, want) {
		t.Fatalf("Trials re-adopted in the order %v, want %v: the one with the smaller log first\n%s", order, want, second.stderr.String())
	}
	st, err := p.c.Stats(context.Background(), "a-full")
	if err != nil || st.Proxy.Denied < 2000 {
		t.Fatalf("a-full's refusals after the restart: %d, %v; want its log's 2000 at least", st.Proxy.Denied, err)
	}
}
