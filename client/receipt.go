//go:build linux

// The wire types that carry record's counters and the receipts'
// signatures: kept out of internal/agentwire, so that trialnet-oci links
// neither record (log/slog, crypto/rand) nor crypto/ed25519.

package client

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/trial"
)

// ReceiptSchema is the version of Receipt this build writes; Verify
// refuses a newer one.
const ReceiptSchema = 1

// Receipt is what an evaluation attaches in place of a terminal's text:
// a Trial's end, as the host saw it, signed with a key only root reads.
type Receipt struct {
	Schema int    `json:"schema"`
	Trial  string `json:"trial"`
	// Nonce is the harness's value given to run or create (empty: none),
	// which binds the receipt to the run the harness started.
	Nonce    string            `json:"nonce,omitempty"`
	Host     string            `json:"host"`
	Start    time.Time         `json:"start"`
	End      time.Time         `json:"end"`
	ExitCode *int              `json:"exit_code"` // as the runner reported it; null when it reported none
	Learning bool              `json:"learning"`
	Verdict  string            `json:"verdict"`
	Kernel   map[string]uint64 `json:"kernel"`
	Proxy    record.TrialStats `json:"proxy"`
	// DNS are the transparent Trial's stub's counts (absent without
	// one): a name it refused is a refused attempt no tunnel counts.
	DNS    *DNSStats       `json:"dns,omitempty"`
	Pools  []trial.PoolUse `json:"pools"`
	Layers Layers          `json:"layers"`
	// Programs are the tags of the eBPF programs that enforced the Trial
	// (name → tag, as bpftool shows them).
	Programs map[string]string `json:"programs"`
	// DecisionLog is the SHA-256 and size of the Trial's decisions.jsonl
	// when the receipt was made; empty where no log was kept.
	DecisionLog *LogDigest `json:"decision_log"`
}

// LogDigest identifies a decision log's content.
type LogDigest struct {
	SHA256 string `json:"sha256"`
	Bytes  int64  `json:"bytes"`
	// Unwritten are the records that could not be written to it (its
	// disk full, say) by the agent that ended the Trial: the counters
	// hold them, the log does not.
	Unwritten uint64 `json:"unwritten,omitempty"`
}

// Stats are a Trial's kernel and proxy counters with the egress verdict.
type Stats struct {
	Trial string `json:"trial"`
	// Learning: the Trial let names off its allowlist through; always
	// written, and said in the verdict.
	Learning bool              `json:"learning"`
	Kernel   map[string]uint64 `json:"kernel"`
	Proxy    record.TrialStats `json:"proxy"`
	Egress   uint64            `json:"direct_egress_packets"`
	Foreign  uint64            `json:"foreign_socket_uses"`
	Layers   Layers            `json:"layers"`
	// Receipt is the signed receipt of a destroyed Trial (Destroy's stats
	// only): what an evaluation attaches, not the terminal's text.
	Receipt *SignedReceipt `json:"receipt,omitempty"`
	// Pools are the Trial's use of the host's tasks and memory: now (at
	// destroy: as the teardown found it), at the peak, and the events at
	// the bound (forks refused, OOM kills).
	Pools   []trial.PoolUse `json:"pools"`
	Verdict string          `json:"verdict"`
	// DNS are the counts of the Trial's DNS stub (transparent mode; absent
	// without it), since this agent process started it: a restart starts
	// them again, except names, which the Trial keeps.
	DNS *DNSStats `json:"dns,omitempty"`
	// Unsure, at a destroy, is why the final counters may not hold all
	// the Trial did (a process outlived the kill, or they could not be
	// read); the verdict then says UNKNOWN. Empty: they do.
	Unsure string `json:"counters_unsure,omitempty"`
	// TopRefused are the most refused targets (host:port as asked for).
	TopRefused []record.TargetCount `json:"top_refused"`
	At         time.Time            `json:"at"`
}

// Brief is the verdict in a few words, for run's one summary line: what
// verdictOf says, without the reasons. Stats without a verdict are none
// an agent made (a destroy that failed through an older agent's control
// API answered its error alone): their zeros are no "ok".
func (st Stats) Brief() string {
	v := "0 direct egress packets (ok)"
	switch {
	case st.Verdict == "":
		return "NO VERDICT: the agent gave no final counters"
	case st.Egress > 0:
		v = fmt.Sprintf("ALARM: %d direct egress packets dropped", st.Egress)
	case st.Unsure != "":
		v = "UNKNOWN: the final counters may not hold all the Trial did"
	case !st.Layers.BPFLSM:
		v = "0 direct egress packets (ok; foreign sockets unwatched)"
	case st.Foreign > 0:
		v = fmt.Sprintf("0 direct egress packets; ALERT: %d foreign-socket uses refused", st.Foreign)
	}
	if st.Learning {
		v += "; LEARNING: allowlist not enforced"
	}
	return v
}

// ContainerEnd is what the agent did when a container ended (DELETE
// /v1/containers/{id}, trialnet oci-hook at poststop).
type ContainerEnd struct {
	// Trial is the Trial the container was in ("": none live).
	Trial string `json:"trial,omitempty"`
	// Destroyed: the Trial was made around the container and ended with
	// it; Stats are its final stats, as destroy gives them. Otherwise the
	// Trial lives on, and the container is no longer listed in it.
	Destroyed bool   `json:"destroyed"`
	Stats     *Stats `json:"stats,omitempty"`
}

// SignedReceipt is a receipt as written: its bytes, and the signature
// over them, compacted (json.Compact: an indented copy, as in a run
// report, verifies too), with the key whose public half is given.
type SignedReceipt struct {
	Receipt   json.RawMessage `json:"receipt"`
	Signature []byte          `json:"signature"`
	PublicKey []byte          `json:"public_key"`
}

// ErrReceiptForged is wrapped by Verify for a receipt whose signature or
// key does not hold.
var ErrReceiptForged = errors.New("the receipt does not verify")

// ErrReceiptOtherRun is for a genuine receipt of another run than the
// one expected: another nonce, or none, or another Trial.
var ErrReceiptOtherRun = errors.New("the receipt is of another run")

// Verify checks s against the host key pub (the public half of the key
// that signs this host's receipts) and returns what it says. A receipt
// signed by another key, or changed after it was signed, fails.
func (s SignedReceipt) Verify(pub ed25519.PublicKey) (Receipt, error) {
	if !bytes.Equal(s.PublicKey, pub) {
		return Receipt{}, fmt.Errorf("%w: it was signed with another key than this host's", ErrReceiptForged)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, s.Receipt); err != nil {
		return Receipt{}, fmt.Errorf("%w: %v", ErrReceiptForged, err)
	}
	if !ed25519.Verify(pub, compact.Bytes(), s.Signature) {
		return Receipt{}, fmt.Errorf("%w: its signature does not match its content", ErrReceiptForged)
	}
	var r Receipt
	if err := json.Unmarshal(s.Receipt, &r); err != nil {
		return Receipt{}, fmt.Errorf("%w: %v", ErrReceiptForged, err)
	}
	if r.Schema > ReceiptSchema {
		return Receipt{}, fmt.Errorf("receipt schema %d is newer than the %d this trialnet reads", r.Schema, ReceiptSchema)
	}
	return r, nil
}
