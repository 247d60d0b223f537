//go:build linux

package proxy

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"html"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/wire"
)

// A gateway's answer is checked for its Trial's routes' secrets, because an
// upstream that reflects the request (an echo endpoint, a debug header,
// an error quoting the key it refused) would otherwise hand the Trial
// the very thing the gateway keeps from it. The secret is looked for in
// the spellings an upstream plausibly gives it (secretForms), in any
// case; an upstream that transforms it otherwise (encrypts it, hands it
// out a few bytes at a time) is not stopped, which SECURITY.md says.

// gatewayRequestFields are the Trial's fields a gateway request never
// carries upstream: a coded answer (Accept-Encoding), one in another
// charset (Accept-Charset: UTF-7, EBCDIC) or a range of one (Range,
// If-Range, and Request-Range, which Apache httpd reads where Range is
// absent) would hide an echoed secret from the check.
var gatewayRequestFields = []string{"Accept-Encoding", "Accept-Charset", "Range", "If-Range", "Request-Range"}

// minDerivedForm is the shortest derived spelling of a secret looked
// for: a shorter one would match answers by chance.
const minDerivedForm = 8

// pyHTML is Python's html.escape, whose entities for " and ' are not
// Go's.
var pyHTML = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#x27;")

// secretForms are the spellings of secret an answer is searched for, in
// lower case (answers are compared in lower case): as sent; quoted by
// Go's %q, JSON (also with "\/"), percent-encoding and HTML (Go's and
// Python's entities: an error page quoting it); in hex; in UTF-16
// and UTF-32 of either byte order (an upstream whose text is so answers
// in it unasked, or as a charset parameter of Accept asks); and in
// base64, standard and URL-safe, the part of its encoding that does not
// depend on the bytes before it, at each of the three alignments.
func secretForms(secret Secret) [][]byte {
	s := string(secret)
	q := strconv.Quote(s)
	j, _ := json.Marshal(s)
	derived := []string{q[1 : len(q)-1], string(j[1 : len(j)-1]), strings.ReplaceAll(string(j[1:len(j)-1]), "/", `\/`),
		url.QueryEscape(s), url.PathEscape(s), hex.EncodeToString(secret), html.EscapeString(s), pyHTML.Replace(s)}
	for _, width := range []int{2, 4} {
		derived = append(derived, wideForm(secret, width, false), wideForm(secret, width, true))
	}
	for align := range 3 {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, align), secret...))
		// Groups of three bytes wholly inside the secret: from the first
		// after the padding to the last complete one.
		from, to := 4*((align+2)/3), 4*((align+len(secret))/3)
		if to > from {
			core := enc[from:to]
			derived = append(derived, core, strings.NewReplacer("+", "-", "/", "_").Replace(core))
		}
	}
	forms := [][]byte{bytes.ToLower(secret)}
	for _, d := range derived {
		f := []byte(strings.ToLower(d))
		if len(f) >= minDerivedForm && !containsForm(forms, f) {
			forms = append(forms, f)
		}
	}
	return forms
}

// wideForm is secret, printable ASCII, in UTF-16 (width 2) or UTF-32
// (width 4), little- or big-endian: each byte among zero bytes.
func wideForm(secret Secret, width int, bigEndian bool) string {
	b := make([]byte, 0, width*len(secret))
	pad := make([]byte, width-1)
	for _, c := range secret {
		if bigEndian {
			b = append(append(b, pad...), c)
		} else {
			b = append(append(b, c), pad...)
		}
	}
	return string(b)
}

// routesForms are the forms of every route's secret.
func routesForms(routes []GatewayRoute) [][]byte {
	var forms [][]byte
	for _, r := range routes {
		for _, f := range secretForms(r.Secret) {
			if !containsForm(forms, f) {
				forms = append(forms, f)
			}
		}
	}
	return forms
}

func containsForm(forms [][]byte, f []byte) bool {
	for _, g := range forms {
		if bytes.Equal(g, f) {
			return true
		}
	}
	return false
}

// lowerASCII is b in lower case, written into dst's storage.
func lowerASCII(dst, b []byte) []byte {
	dst = append(dst[:0], b...)
	for i, c := range dst {
		if c >= 'A' && c <= 'Z' {
			dst[i] = c + 'a' - 'A'
		}
	}
	return dst
}

// holdsForm reports whether s holds any of forms, in any case.
func holdsForm(s string, forms [][]byte) bool {
	low := lowerASCII(nil, []byte(s))
	for _, f := range forms {
		if bytes.Contains(low, f) {
			return true
		}
	}
	return false
}

// checkGatewayHead refuses an upstream's answer whose head holds the
// route's secret, or whose body is coded so that the check cannot see
// it.
func checkGatewayHead(resp *http.Response, forms [][]byte) error {
	echo := holdsForm(resp.Status, forms)
	for name, vs := range resp.Header {
		for _, v := range vs {
			echo = echo || holdsForm(name, forms) || holdsForm(v, forms)
		}
	}
	for name := range resp.Trailer {
		// Announced in the head the Trial gets ("Trailer: name").
		echo = echo || holdsForm(name, forms)
	}
	if echo {
		return record.Deny(record.ReasonUpstreamBadResponse, "the upstream's answer repeats a gateway route's credential in its head; it is not passed on")
	}
	if ce := resp.Header.Values("Content-Encoding"); len(ce) > 0 && !(len(ce) == 1 && strings.EqualFold(strings.TrimSpace(ce[0]), "identity")) {
		return record.Deny(record.ReasonUpstreamBadResponse, "the upstream's answer is coded (Content-Encoding %q), which the gateway cannot check for the route's credential; the gateway asks for none", wire.Truncate(strings.Join(ce, ", ")))
	}
	return nil
}

// errEchoedSecret ends an answer whose body or trailer holds the secret.
// A literal, not record.Deny: that runs fmt, in every start of the binary.
var errEchoedSecret = &record.Denial{Reason: record.ReasonUpstreamBadResponse, Detail: "the upstream's answer repeats a gateway route's credential; the answer was cut before it"}

// secretFilter passes an upstream's body on as it arrives, except the
// longest tail that could begin one of the secret's forms, held until the
// next bytes show it does not; the body, or its trailer, holding a form
// ends the read. Normal streams (server-sent events end in a newline,
// which no form holds) are held back by nothing.
type secretFilter struct {
	body  io.ReadCloser
	resp  *http.Response // its Trailer is read at the body's end
	forms [][]byte
	buf   []byte // what one read of the body takes
	held  []byte // the tail that may begin a form
	low   []byte // held in lower case
	out   []byte // released, not yet read
	err   error
}

func (f *secretFilter) Read(p []byte) (int, error) {
	for len(f.out) == 0 && f.err == nil {
		if f.buf == nil {
			f.buf = make([]byte, 32<<10)
		}
		n, err := f.body.Read(f.buf)
		f.held = append(f.held, f.buf[:n]...)
		f.low = lowerASCII(f.low, f.held)
		keep := 0
		for _, form := range f.forms {
			if bytes.Contains(f.low, form) {
				f.held, f.err = nil, errEchoedSecret
				break
			}
			keep = max(keep, prefixTail(f.low, form))
		}
		switch {
		case f.err != nil:
		case err != nil && f.trailerEchoes():
			f.held, f.err = nil, errEchoedSecret
		case err != nil:
			f.out, f.held, f.err = f.held, nil, err
		default:
			f.out = append(f.out, f.held[:len(f.held)-keep]...)
			f.held = append(f.held[:0], f.held[len(f.held)-keep:]...)
		}
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	if len(f.out) == 0 && f.err != nil {
		return n, f.err
	}
	return n, nil
}

func (f *secretFilter) Close() error { return f.body.Close() }

func (f *secretFilter) trailerEchoes() bool {
	for name, vs := range f.resp.Trailer {
		for _, v := range vs {
			if holdsForm(name, f.forms) || holdsForm(v, f.forms) {
				return true
			}
		}
	}
	return false
}

// prefixTail is the length of the longest end of b that begins form
// (shorter than form: the whole is found before this is asked).
func prefixTail(b, form []byte) int {
	for i := max(0, len(b)-len(form)+1); i < len(b); i++ {
		if b[i] == form[0] && bytes.HasPrefix(form, b[i:]) {
			return len(b) - i
		}
	}
	return 0
}

// redactSecret takes every form of the routes' secrets out of an error's
// detail, which may quote what the upstream sent (net/http quotes a
// malformed line): the detail reaches the Trial's answer and the record.
// An error of the exchange with the upstream loses all it quotes, from
// its first '"' on: quoting escapes bytes (a secret with a control byte
// after each of its own reads as none of its forms), so no search of the
// quote is enough. The wrapped error, which holds it too, is dropped.
func redactSecret(err error, forms [][]byte) error {
	if err == nil {
		return nil
	}
	d := &record.Denial{Reason: record.ReasonUpstreamBadResponse, Detail: err.Error()}
	var orig *record.Denial
	// Not a denial of the proxy's: a response cut while being relayed.
	exchange := !errors.As(err, &orig)
	if !exchange {
		d.Reason, d.Detail, d.DNS = orig.Reason, orig.Detail, orig.DNS
		exchange = orig.Reason == record.ReasonUpstreamBadResponse && orig.Err != nil // upstreamError's
	}
	quote := strings.IndexByte(d.Detail, '"')
	if (!exchange || quote < 0) && !holdsForm(d.Detail, forms) {
		return err
	}
	if exchange && quote >= 0 {
		d.Detail = d.Detail[:quote] + "[the upstream's bytes, not shown: they may hold the route's credential]"
	}
	for _, f := range forms {
		for {
			i := bytes.Index(lowerASCII(nil, []byte(d.Detail)), f)
			if i < 0 {
				break
			}
			d.Detail = d.Detail[:i] + "[secret]" + d.Detail[i+len(f):]
		}
	}
	return d
}
