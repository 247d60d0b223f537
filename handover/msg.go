//go:build linux

package handover

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"

	"github.com/trialnet/trialnet/internal/fdpass"
)

// Version is the hand-over protocol this build speaks. An old agent asked
// for another answers Refused, and the new one says so.
const Version = 1

// Kind is what a message is: its "type" on the wire. The strings are the
// protocol's; an agent of an earlier build speaks them, so none may
// change. kinds_test.go lists each with its sender.
type Kind string

// The message kinds, in the order a hand-over sends them. The new agent
// is the successor, the old one its predecessor.
const (
	// KindHello: new agent, first, with its protocol version and paths.
	KindHello Kind = "hello"
	// KindRefused: old agent, instead of an offer, saying why it does not hand over.
	KindRefused Kind = "refused"
	// KindOffer: old agent, after the hello, carrying listeners and counts pages.
	KindOffer Kind = "offer"
	// KindAdopting: new agent, every few seconds while it adopts the Trials.
	KindAdopting Kind = "adopting"
	// KindServing: new agent, once it serves every listener it was offered.
	KindServing Kind = "serving"
	// KindStopped: old agent, once it has stopped accepting, with its open tunnels.
	KindStopped Kind = "stopped"
	// KindRecords: old agent, from the offer until it has drained, with its records.
	KindRecords Kind = "records"
	// KindOpen: old agent, while it drains, when its open tunnels change.
	KindOpen Kind = "open"
	// KindAllow: new agent, while the old one drains, with a Trial's new allowlist.
	KindAllow Kind = "allow"
	// KindRemove: new agent, while the old one drains, removing a Trial.
	KindRemove Kind = "remove"
	// KindDone: old agent, answering an allow or remove (by its Seq).
	KindDone Kind = "done"
	// KindDrained: old agent, last, once it has drained and is about to exit.
	KindDrained Kind = "drained"
)

// Message is one hand-over message: one struct per Kind. On the wire it
// is one JSON object, its fields beside "type" (Envelope).
type Message interface{ Kind() Kind }

// Hello is the new agent's first message: its paths, which must be the
// old one's, and whether it shares the counts behind the limits (an agent
// of an earlier build does not: its open counts go in messages).
type Hello struct {
	Version int               `json:"version,omitempty"`
	PID     int               `json:"pid,omitempty"`
	Paths   map[string]string `json:"paths,omitempty"`
	Shares  bool              `json:"shares,omitempty"`
}

// Refused says why the old agent does not hand over; it serves on.
type Refused struct {
	Version int    `json:"version,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Offer carries files (at most fdpass.MaxFiles a message) under Names,
// in order, and says whether more offers follow. The first also carries
// each Trial's log size when the old agent began sending its records, its
// open tunnels, and its slot in each counts page sent (by name), when the
// new agent shares them.
type Offer struct {
	Version int              `json:"version,omitempty"`
	PID     int              `json:"pid,omitempty"`
	Names   []string         `json:"names,omitempty"`
	More    bool             `json:"more,omitempty"`
	Offsets map[string]int64 `json:"offsets,omitempty"`
	Slots   map[string]int   `json:"slots,omitempty"`
	Open    map[string]int64 `json:"open,omitempty"`
}

// Adopting says the new agent is still adopting the Trials.
type Adopting struct{}

// Serving says the new agent serves every listener it was offered.
type Serving struct {
	PID int `json:"pid,omitempty"`
}

// Stopped says the old agent has stopped accepting, with the tunnels and
// requests it still serves, per Trial.
type Stopped struct {
	Open map[string]int64 `json:"open,omitempty"`
}

// Records are lines the old agent wrote to Trial's log.
type Records struct {
	Trial string            `json:"trial,omitempty"`
	Lines []json.RawMessage `json:"lines,omitempty"`
}

// Open is what the old agent serves, per Trial, when it changed.
type Open struct {
	Open map[string]int64 `json:"open,omitempty"`
}

// Allow is Trial's new allowlist (as the control API encodes it) and the
// entries whose tunnels are cut, for the old agent to apply to what it
// still serves; Done answers it.
type Allow struct {
	Trial string          `json:"trial,omitempty"`
	Seq   uint64          `json:"seq,omitempty"`
	Allow json.RawMessage `json:"allow,omitempty"`
	Cut   []string        `json:"cut,omitempty"`
}

// Remove ends what the old agent serves of Trial; Done answers it.
type Remove struct {
	Trial string `json:"trial,omitempty"`
	Seq   uint64 `json:"seq,omitempty"`
}

// Done answers the Allow or Remove numbered Seq: N tunnels cut, or why
// it was not applied.
type Done struct {
	Error string `json:"error,omitempty"`
	Seq   uint64 `json:"seq,omitempty"`
	N     int    `json:"n,omitempty"`
}

// Drained is the old agent's last message: it has drained and exits.
type Drained struct{}

func (Hello) Kind() Kind    { return KindHello }
func (Refused) Kind() Kind  { return KindRefused }
func (Offer) Kind() Kind    { return KindOffer }
func (Adopting) Kind() Kind { return KindAdopting }
func (Serving) Kind() Kind  { return KindServing }
func (Stopped) Kind() Kind  { return KindStopped }
func (Records) Kind() Kind  { return KindRecords }
func (Open) Kind() Kind     { return KindOpen }
func (Allow) Kind() Kind    { return KindAllow }
func (Remove) Kind() Kind   { return KindRemove }
func (Done) Kind() Kind     { return KindDone }
func (Drained) Kind() Kind  { return KindDrained }

// decoders read each kind's message: the protocol's vocabulary.
var decoders = map[Kind]func([]byte) (Message, error){
	KindHello: decode[Hello], KindRefused: decode[Refused], KindOffer: decode[Offer],
	KindAdopting: decode[Adopting], KindServing: decode[Serving], KindStopped: decode[Stopped],
	KindRecords: decode[Records], KindOpen: decode[Open], KindAllow: decode[Allow],
	KindRemove: decode[Remove], KindDone: decode[Done], KindDrained: decode[Drained],
}

func decode[T Message](b []byte) (Message, error) {
	var m T
	err := json.Unmarshal(b, &m)
	return m, err
}

// Envelope is a Message as it goes on the wire: one JSON object with the
// message's Kind under "type" beside its fields, as earlier builds wrote
// one struct for every kind.
type Envelope struct{ Msg Message }

// Kind is the kind of the message inside.
func (e Envelope) Kind() Kind { return e.Msg.Kind() }

// MarshalJSON writes the message's fields after its "type".
func (e Envelope) MarshalJSON() ([]byte, error) {
	kind, err := json.Marshal(e.Msg.Kind())
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(e.Msg)
	if err != nil {
		return nil, err
	}
	out := append([]byte(`{"type":`), kind...)
	if rest := bytes.TrimPrefix(body, []byte("{")); len(rest) > 1 {
		out = append(append(out, ','), rest...)
		return out, nil
	}
	return append(out, '}'), nil
}

// Unknown is a message of a kind this build does not know (a later
// build's): each side says what it does with one.
type Unknown struct{ Type Kind }

// Kind is the kind the message said it was.
func (u Unknown) Kind() Kind { return u.Type }

// UnmarshalJSON reads a message; one of a kind this build does not know
// is an Unknown.
func (e *Envelope) UnmarshalJSON(b []byte) error {
	var head struct {
		Type Kind `json:"type"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return err
	}
	dec := decoders[head.Type]
	if dec == nil {
		e.Msg = Unknown{head.Type}
		return nil
	}
	m, err := dec(b)
	if err != nil {
		return fmt.Errorf("a hand-over %q message: %w", head.Type, err)
	}
	e.Msg = m
	return nil
}

// Send writes m to c as one message, with files attached (at most
// fdpass.MaxFiles).
func Send(c *net.UnixConn, m Message, files ...*os.File) error {
	return fdpass.Send(c, Envelope{m}, files...)
}

// Recv reads one message from c, with the files that came with it, which
// the caller owns.
func Recv(c *net.UnixConn) (Message, []*os.File, error) {
	var e Envelope
	files, err := fdpass.Recv(c, &e)
	return e.Msg, files, err
}
