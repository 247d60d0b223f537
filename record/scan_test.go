package record

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"
)

// heapAtEOF reads r and, once it is spent, notes the live heap: what
// its reader holds when it has read everything.
type heapAtEOF struct {
	r    io.Reader
	live uint64
}

func (h *heapAtEOF) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if err == io.EOF && h.live == 0 {
		h.live = liveHeap()
	}
	return n, err
}

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// A restarted agent rebuilds each Trial's counters from its whole log,
// which a Trial can fill (64 MiB): read into a slice first, 117,120
// records held 121 MiB of the agent's heap. Scan holds one at a time.
func TestScanHoldsOneRecordAtATime(t *testing.T) {
	const n = 20000
	var log []byte
	for i := range n {
		ev := Event{Schema: EventSchema, ID: fmt.Sprintf("id-%d", i), Time: time.Now(), Trial: "t1", Method: "CONNECT",
			Target: fmt.Sprintf("n%d.off.test:443", i), Host: fmt.Sprintf("n%d.off.test", i), Port: 443,
			Decision: DecisionDeny, Reason: ReasonPolicyDenied, Detail: "not on this Trial's allowlist"}
		var err error
		if log, err = ev.AppendJSON(log); err != nil {
			t.Fatal(err)
		}
		log = append(log, '\n')
	}
	before := liveHeap()
	r := &heapAtEOF{r: bytes.NewReader(log)}
	seen := 0
	if err := Scan(r, "decisions.jsonl", func(*Event) { seen++ }); err != nil {
		t.Fatal(err)
	}
	if seen != n {
		t.Fatalf("scanned %d records of %d", seen, n)
	}
	const bound = 2 << 20
	if grew := int64(r.live) - int64(before); grew > bound {
		t.Fatalf("having read %d records, the reader held %d bytes more of the heap than before, past %d: it keeps them", n, grew, bound)
	}
}
