// Package lname names the files an agent passes on to its successor in a
// hand-over and to the keeper: its listeners (the metrics port and each
// Trial's proxy endpoints) and its counts pages (the proxy's and each
// Trial's). On the wire a name is a string ("metrics", "trial:ID:I",
// "counts", "counts:ID") that agents and keepers of earlier builds speak
// too, so the format never changes; in the code it is a Name.
package lname

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/trialnet/trialnet/internal/ident"
)

// Kind is what a named file is.
type Kind uint8

// The kinds of file a name names.
const (
	// Metrics is the agent's metrics listener.
	Metrics Kind = iota + 1
	// Endpoint is one of a Trial's proxy endpoint listeners.
	Endpoint
	// Counts is a counts page: the proxy's (no Trial), or a Trial's.
	Counts
	// StubUDP and StubTCP are a transparent Trial's DNS stub sockets,
	// Steered its transparent listener (docs/transparent.md).
	StubUDP
	StubTCP
	Steered
)

// transparentWords are the wire words of the transparent kinds, after
// TrialPrefix: an earlier build parses none of them (no index), so it
// closes such files, and a keeper drops them with the Trial's prefix.
var transparentWords = map[Kind]string{StubUDP: "dns-udp", StubTCP: "dns-tcp", Steered: "steer"}

// TransparentName names Trial id's file of kind k (StubUDP, StubTCP or
// Steered).
func TransparentName(id string, k Kind) Name { return Name{Kind: k, Trial: id} }

// OfTrial reports whether n names one of a Trial's sockets (an endpoint
// or a transparent one), which a keeper drops with the Trial.
func (n Name) OfTrial() bool { return n.Kind == Endpoint || transparentWords[n.Kind] != "" }

// Name names one file: its Kind, and for a Trial's the Trial's id and,
// for an endpoint, its index (0: the IPv4 endpoint HTTPS_PROXY names).
type Name struct {
	Kind  Kind
	Trial string
	Index int
}

// Wire prefixes and words; an earlier build speaks them too.
const (
	wordMetrics = "metrics"
	wordTrial   = "trial"
	wordCounts  = "counts"
)

// MetricsName names the metrics listener.
func MetricsName() Name { return Name{Kind: Metrics} }

// EndpointName names listener i of Trial id.
func EndpointName(id string, i int) Name { return Name{Kind: Endpoint, Trial: id, Index: i} }

// CountsName names Trial id's counts page; "" names the proxy's.
func CountsName(id string) Name { return Name{Kind: Counts, Trial: id} }

// TrialPrefix starts the wire name of every endpoint listener of Trial
// id: the keeper drops a Trial's listeners by it.
func TrialPrefix(id string) string { return wordTrial + ":" + id + ":" }

// String is the name as it goes on the wire.
func (n Name) String() string {
	switch n.Kind {
	case Metrics:
		return wordMetrics
	case Endpoint:
		return TrialPrefix(n.Trial) + strconv.Itoa(n.Index)
	case StubUDP, StubTCP, Steered:
		return TrialPrefix(n.Trial) + transparentWords[n.Kind]
	case Counts:
		if n.Trial == "" {
			return wordCounts
		}
		return wordCounts + ":" + n.Trial
	}
	return fmt.Sprintf("lname.Kind(%d)", n.Kind)
}

// Parse reads a name from the wire. It refuses anything String does not
// write: an unknown word, a Trial id that is not one (ident.Valid), an
// index that is negative or not in its shortest form; a file under such
// a name is another build's, and its receiver closes it.
func Parse(s string) (Name, error) {
	word, rest, hasRest := strings.Cut(s, ":")
	switch {
	case word == wordMetrics && !hasRest:
		return MetricsName(), nil
	case word == wordCounts && !hasRest:
		return CountsName(""), nil
	case word == wordCounts && ident.Valid(rest):
		return CountsName(rest), nil
	case word == wordTrial:
		id, idx, ok := strings.Cut(rest, ":")
		for k, w := range transparentWords {
			if ok && idx == w && ident.Valid(id) {
				return TransparentName(id, k), nil
			}
		}
		i, err := strconv.Atoi(idx)
		if ok && ident.Valid(id) && err == nil && i >= 0 && strconv.Itoa(i) == idx {
			return EndpointName(id, i), nil
		}
	}
	return Name{}, fmt.Errorf("%q names no file this build knows (metrics, trial:ID:INDEX, trial:ID:dns-udp, trial:ID:dns-tcp, trial:ID:steer, counts, counts:ID)", s)
}

// Less orders names so that a Trial's endpoints come together, in index
// order (its IPv4 endpoint, the one HTTPS_PROXY names, first).
func Less(x, y Name) bool {
	if x.Kind != y.Kind {
		return x.Kind < y.Kind
	}
	if x.Trial != y.Trial {
		return x.Trial < y.Trial
	}
	return x.Index < y.Index
}
