package proxy

import (
	"bytes"
	"io"
	"log"
	"sync"
)

// unsolicited begins the line net/http's Transport writes to the
// standard log when an idle upstream connection has bytes no request
// asked for, which it quotes.
var unsolicited = []byte("Unsolicited response received on idle HTTP channel starting with ")

// quietLog is the standard log's output without the bytes an upstream
// sent unasked: after a gateway answer, those may be the route's
// credential (an upstream echoing it past the end of its answer), and
// the line would carry it, quoted, to the agent's log.
type quietLog struct{ w io.Writer }

func (q quietLog) Write(p []byte) (int, error) {
	if i := bytes.Index(p, unsolicited); i >= 0 {
		line := append(p[:i+len(unsolicited):i+len(unsolicited)], "[not shown: the upstream's bytes may hold a gateway route's credential]\n"...)
		if _, err := q.w.Write(line); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return q.w.Write(p)
}

var quietMu sync.Mutex

// quietStdLog keeps upstreams' unsolicited bytes out of the standard
// log, where net/http's Transport quotes them. AddTrial calls it for a
// Trial with gateway routes, so that every process that serves one (an
// agent, `trialnet run`'s, a hand-over's successor) has it before its
// first gateway answer; an output that is already quiet is kept.
func quietStdLog() {
	quietMu.Lock()
	defer quietMu.Unlock()
	if _, ok := log.Writer().(quietLog); !ok {
		log.SetOutput(quietLog{w: log.Writer()})
	}
}
