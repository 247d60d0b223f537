// Package gwtest is the test side of the credential gateway: a CA of its
// own and a model-provider upstream that answers enough of the
// Anthropic Messages, OpenAI Chat Completions and Responses APIs
// (streaming and not) for Claude Code, Codex and OpenCode to finish a
// turn, and that records every request with the credential it carried.
package gwtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// NewCA makes a CA and a server certificate under it for names; caPEM
// is the CA's certificate, for a trust store.
func NewCA(t testing.TB, names ...string) (caPEM []byte, cert tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gwtest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Seen is one request the upstream received.
type Seen struct {
	Method, Host, URI string
	Header            http.Header
	Body              string
}

// Upstream is the fake provider. Check, if set, judges each request's
// credential: one it refuses is answered 401, as a provider would, and
// still recorded.
type Upstream struct {
	Check func(*http.Request) error
	// Hold, if set, is waited for after the first event of a streamed
	// answer: a test that sees that event before closing Hold shows the
	// stream was not buffered on the way.
	Hold chan struct{}
	// Header is added to every response.
	Header http.Header

	mu  sync.Mutex
	got []Seen
}

// Requests are the requests received so far.
func (u *Upstream) Requests() []Seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Seen(nil), u.got...)
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	u.mu.Lock()
	u.got = append(u.got, Seen{r.Method, r.Host, r.RequestURI, r.Header.Clone(), string(body)})
	u.mu.Unlock()
	for k, v := range u.Header {
		w.Header()[k] = v
	}
	if u.Check != nil {
		if err := u.Check(r); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": "authentication_error", "message": "gwtest: " + err.Error()}})
			_, _ = w.Write(b)
			return
		}
	}
	var req struct {
		Stream bool   `json:"stream"`
		Model  string `json:"model"`
	}
	_ = json.Unmarshal(body, &req)
	if req.Model == "" {
		req.Model = "gwtest-model"
	}
	path := r.URL.Path
	switch {
	case strings.HasSuffix(path, "/messages/count_tokens"):
		writeJSON(w, map[string]any{"input_tokens": 10})
	case strings.HasSuffix(path, "/messages"):
		u.anthropic(w, req.Model, req.Stream)
	case strings.HasSuffix(path, "/chat/completions"):
		u.chat(w, req.Model, req.Stream)
	case strings.HasSuffix(path, "/responses"):
		u.responses(w, req.Model)
	case strings.HasSuffix(path, "/models"):
		writeJSON(w, map[string]any{"object": "list", "data": []any{map[string]any{"id": "gwtest-model", "object": "model", "type": "model", "display_name": "gwtest", "created_at": "2025-01-01T00:00:00Z", "owned_by": "gwtest"}}})
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":{"message":"gwtest: no such endpoint"}}`)
	}
}

// Answer is the text every model answer holds.
const Answer = "gwtest says hello"

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// sse writes server-sent events, flushing each; after the first it
// waits for Hold, if set.
type sse struct {
	w     http.ResponseWriter
	hold  chan struct{}
	first bool
}

func (u *Upstream) stream(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, hold: u.Hold, first: true}
}

func (s *sse) event(name string, data any) {
	b, _ := json.Marshal(data)
	if name != "" {
		fmt.Fprintf(s.w, "event: %s\n", name)
	}
	fmt.Fprintf(s.w, "data: %s\n\n", b)
	s.w.(http.Flusher).Flush()
	if s.first && s.hold != nil {
		s.first = false
		<-s.hold
	}
}

func (u *Upstream) anthropic(w http.ResponseWriter, model string, stream bool) {
	usage := map[string]any{"input_tokens": 10, "output_tokens": 5}
	msg := map[string]any{"id": "msg_gwtest", "type": "message", "role": "assistant", "model": model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": usage}
	if !stream {
		msg["content"] = []any{map[string]any{"type": "text", "text": Answer}}
		msg["stop_reason"] = "end_turn"
		writeJSON(w, msg)
		return
	}
	s := u.stream(w)
	s.event("message_start", map[string]any{"type": "message_start", "message": msg})
	s.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	s.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": Answer}})
	s.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	s.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 5}})
	s.event("message_stop", map[string]any{"type": "message_stop"})
}

func (u *Upstream) chat(w http.ResponseWriter, model string, stream bool) {
	created := time.Now().Unix()
	if !stream {
		writeJSON(w, map[string]any{"id": "chatcmpl-gwtest", "object": "chat.completion", "created": created, "model": model,
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": Answer}, "finish_reason": "stop"}},
			"usage":   map[string]any{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
		return
	}
	s := u.stream(w)
	chunk := func(delta map[string]any, finish any, usage any) map[string]any {
		c := map[string]any{"id": "chatcmpl-gwtest", "object": "chat.completion.chunk", "created": created, "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
		if usage != nil {
			c["usage"] = usage
		}
		return c
	}
	s.event("", chunk(map[string]any{"role": "assistant", "content": ""}, nil, nil))
	s.event("", chunk(map[string]any{"content": Answer}, nil, nil))
	s.event("", chunk(map[string]any{}, "stop", map[string]any{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}))
	fmt.Fprint(w, "data: [DONE]\n\n")
	w.(http.Flusher).Flush()
}

func (u *Upstream) responses(w http.ResponseWriter, model string) {
	s := u.stream(w)
	created := time.Now().Unix()
	resp := func(status string, output []any) map[string]any {
		r := map[string]any{"id": "resp_gwtest", "object": "response", "created_at": created, "status": status, "model": model, "output": output}
		if status == "completed" {
			r["usage"] = map[string]any{"input_tokens": 10, "input_tokens_details": map[string]any{"cached_tokens": 0},
				"output_tokens": 5, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 15}
		}
		return r
	}
	item := map[string]any{"id": "msg_gwtest", "type": "message", "role": "assistant", "status": "in_progress", "content": []any{}}
	done := map[string]any{"id": "msg_gwtest", "type": "message", "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": Answer, "annotations": []any{}}}}
	s.event("response.created", map[string]any{"type": "response.created", "sequence_number": 0, "response": resp("in_progress", []any{})})
	s.event("response.output_item.added", map[string]any{"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": item})
	s.event("response.content_part.added", map[string]any{"type": "response.content_part.added", "sequence_number": 2, "item_id": "msg_gwtest", "output_index": 0, "content_index": 0,
		"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
	s.event("response.output_text.delta", map[string]any{"type": "response.output_text.delta", "sequence_number": 3, "item_id": "msg_gwtest", "output_index": 0, "content_index": 0, "delta": Answer})
	s.event("response.output_text.done", map[string]any{"type": "response.output_text.done", "sequence_number": 4, "item_id": "msg_gwtest", "output_index": 0, "content_index": 0, "text": Answer})
	s.event("response.content_part.done", map[string]any{"type": "response.content_part.done", "sequence_number": 5, "item_id": "msg_gwtest", "output_index": 0, "content_index": 0,
		"part": map[string]any{"type": "output_text", "text": Answer, "annotations": []any{}}})
	s.event("response.output_item.done", map[string]any{"type": "response.output_item.done", "sequence_number": 6, "output_index": 0, "item": done})
	s.event("response.completed", map[string]any{"type": "response.completed", "sequence_number": 7, "response": resp("completed", []any{done})})
}
