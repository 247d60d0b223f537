package agentwire

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A draining agent answers handed_over on its control socket until its
// successor's socket replaces it at the path, which a loaded successor
// does more than a second after it heard that the old one stopped: the
// call is tried again until it reaches the successor (or its context
// ends), not given up after a few tries while the old agent still
// answers.
func TestCallRetriesUntilTheSuccessorAnswers(t *testing.T) {
	const answersHandedOver = 10 // a second of them, 100 ms apart
	tries := 0
	err := Call(context.Background(), nil, func(context.Context, []byte) error {
		tries++
		if tries <= answersHandedOver {
			return &Error{Code: CodeHandedOver, Message: "handed over"}
		}
		return nil
	}, nil)
	if err != nil || tries != answersHandedOver+1 {
		t.Errorf("a call answered handed_over %d times: %v after %d tries; want it carried out by the next", answersHandedOver, err, tries)
	}
}

// A call answered handed_over until its context ends says that no new
// agent answered at the socket meanwhile (still starting, or gone: the
// old agent answers so for at most its wait), not only the old agent's
// "the new agent serves a retry", which every retry disproved. It stays
// the agent's handed_over error, and says that the context ended.
func TestCallHandedOverUntilItsContextEndsSaysNoSuccessorAnswered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := Call(ctx, nil, func(context.Context, []byte) error {
		return &Error{Code: CodeHandedOver, Message: "this agent handed over; the new agent serves a retry"}
	}, nil)
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeHandedOver || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), "no new agent answered") {
		t.Errorf("a call answered handed_over until its deadline: %v; want the handed_over error, the deadline, and that no new agent answered", err)
	}
}
