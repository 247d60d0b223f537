//go:build linux

package ocihook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Annotations a container claims a Trial with.
const (
	AnnotationTrial   = "trialnet.io/trial"
	AnnotationProfile = "trialnet.io/profile"
	annotationPrefix  = "trialnet.io/"
)

// Bounds on what is read: a state is a few hundred bytes, a config a
// few kilobytes (podman's with a seccomp profile: about 20).
const (
	maxState  = 1 << 20
	maxConfig = 16 << 20
)

// State is the OCI runtime state a hook reads on its standard input.
type State struct {
	OCIVersion  string            `json:"ociVersion"`
	ID          string            `json:"id"`
	Status      string            `json:"status"`
	Pid         int               `json:"pid"`
	Bundle      string            `json:"bundle"`
	Annotations map[string]string `json:"annotations"`
}

// ParseState reads the runtime's state: bounded, every key once, and
// the fields every runtime writes present.
func ParseState(r io.Reader) (State, error) {
	b, err := readBounded(r, maxState, "the OCI state on standard input")
	if err != nil {
		return State{}, err
	}
	var st State
	if err := decodeStrict(b, &st); err != nil {
		return State{}, fmt.Errorf("the OCI state on standard input: %w", err)
	}
	switch {
	case st.OCIVersion == "":
		return State{}, errors.New("the OCI state on standard input has no ociVersion: is this run by an OCI runtime as a hook?")
	case st.ID == "":
		return State{}, errors.New("the OCI state on standard input has no container id")
	case !filepath.IsAbs(st.Bundle):
		return State{}, fmt.Errorf("the OCI state's bundle %q is not an absolute path", st.Bundle)
	}
	return st, nil
}

// claim is what a container's annotations ask of trialnet.
type claim struct {
	trial, profile string
	other          []string // trialnet.io/ keys this build does not know
}

func (c claim) any() bool { return c.trial != "" || c.profile != "" || len(c.other) > 0 }

// claimOf reads the trialnet.io/ annotations of the state and of the
// bundle's config; where both have a key they must agree, so that no
// runtime reading the other copy sees another claim.
func claimOf(state, config map[string]string) (claim, error) {
	merged := map[string]string{}
	for _, m := range []map[string]string{state, config} {
		for k, v := range m {
			if !strings.HasPrefix(strings.ToLower(k), annotationPrefix) {
				continue
			}
			if was, ok := merged[k]; ok && was != v {
				return claim{}, fmt.Errorf("annotation %s is %q in the state and %q in config.json", k, was, v)
			}
			merged[k] = v
		}
	}
	var c claim
	for k, v := range merged {
		if v == "" && (k == AnnotationTrial || k == AnnotationProfile) {
			// A template's unset variable (trialnet.io/profile=$PROFILE)
			// asks for a Trial all the same: read as no claim, the
			// container would start outside any.
			return claim{}, fmt.Errorf("annotation %s is empty: give it the name it asks for, or leave it out", k)
		}
		switch k {
		case AnnotationTrial:
			c.trial = v
		case AnnotationProfile:
			c.profile = v
		default:
			c.other = append(c.other, k)
		}
	}
	return c, nil
}

func readBounded(r io.Reader, max int64, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", what, max)
	}
	return b, nil
}

// decodeStrict decodes one JSON value with no key twice in any object.
// Go matches keys to fields without regard to case and keeps the last
// of two, other runtimes (crun's yajl) may keep another: a document that
// reads two ways is refused rather than read one of them.
func decodeStrict(b []byte, v any) error {
	return decodeChecked(b, v, nil)
}

// decodeSpec is decodeStrict for a document the OCI spec spells (a
// config): it also refuses a key that Go's decoder matches to a field of
// v's type without regard to case, but that is not spelt as the spec
// spells it. crun reads keys as written, so "Seccomp" or "Namespaces"
// would be read by the hook and not by the runtime.
func decodeSpec(b []byte, v any) error {
	return decodeChecked(b, v, reflect.TypeOf(v))
}

func decodeChecked(b []byte, v any, spelt reflect.Type) error {
	ks := keyScan{b: b}
	err := ks.value(spelt, "", 0)
	if err != nil && !errors.Is(err, errMalformed) {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if derr := dec.Decode(v); derr != nil {
		return derr
	}
	if err != nil {
		// The scan read as malformed what the decoder read: refused
		// all the same, its keys unchecked.
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("more than one JSON value")
	}
	return nil
}

// errMalformed is a document that keyScan could not read: the decoder
// says why.
var errMalformed = errors.New("malformed JSON")

// errUnlikeC is a string that Go's decoder reads otherwise than crun's
// parser (yajl, which matches keys with strcmp): Go reads U+0000 and
// keeps it, yajl cuts the string there, so a key "seccomp\u0000" is
// crun's "seccomp" and Go's unknown key, a bind source
// "/run/trialnet\u0000x" crun's /run/trialnet and the hook's a path
// that is nowhere; Go reads bytes that are not UTF-8, and a surrogate
// escape not in a pair, as U+FFFD, yajl as written or as "?". No OCI
// string holds one (the kernel and exec take C strings).
func errUnlikeC(what, read string) error {
	return fmt.Errorf("a string holds %s, which a runtime in C (crun) reads %s, not as the hook reads it: leave it out", what, read)
}

// maxDepth bounds how deeply keyScan follows nested values, as the
// decoder bounds them.
const maxDepth = 10000

// keyScan walks a JSON document's bytes once, before the decoder reads
// it, and refuses an object that holds a key twice, compared without
// case, and, where a value is read into a struct, a key that matches a
// field's name only without regard to case. A scan of the bytes, not of
// json.Decoder's tokens: a config's hook waits on it, and the tokens
// (each one allocated) cost three times the decode itself. Keys are read
// as the decoder reads them: as written where they hold no escape, no
// control character and valid UTF-8 (its own fast path), otherwise
// through json.Unmarshal. Anything it cannot read is errMalformed.
type keyScan struct {
	b []byte
	i int
}

func (s *keyScan) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

// value scans the value at s.i, read into t (nil: no key in it is
// checked for its spelling); at is its path ("linux.seccomp.").
func (s *keyScan) value(t reflect.Type, at string, depth int) error {
	s.space()
	if s.i >= len(s.b) || depth > maxDepth {
		return errMalformed
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch s.b[s.i] {
	case '{':
		if t != nil && t.Kind() != reflect.Struct {
			t = nil // a map's keys are its own; another shape the decoder refuses
		}
		return s.object(t, at, depth)
	case '[':
		if t != nil && t.Kind() != reflect.Slice {
			t = nil
		}
		return s.array(t, at, depth)
	case '"':
		_, err := s.str()
		return err
	}
	// A number, true, false or null: the decoder checks which.
	start := s.i
	for s.i < len(s.b) && !strings.ContainsRune(",:]}\" \t\n\r{[", rune(s.b[s.i])) {
		s.i++
	}
	if s.i == start {
		return errMalformed
	}
	return nil
}

// array scans the array at s.i, read into slice t (or nil).
func (s *keyScan) array(t reflect.Type, at string, depth int) error {
	s.i++
	s.space()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return nil
	}
	var elem reflect.Type
	if t != nil {
		elem = t.Elem()
	}
	for n := 0; ; n++ {
		elemAt := "" // a path only where a key below may be refused by it
		if elem != nil {
			elemAt = at + strconv.Itoa(n) + "."
		}
		if err := s.value(elem, elemAt, depth+1); err != nil {
			return err
		}
		if end, err := s.next(']'); end || err != nil {
			return err
		}
	}
}

// object scans the object at s.i, read into struct t (or nil).
func (s *keyScan) object(t reflect.Type, at string, depth int) error {
	s.i++
	s.space()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	keys := map[string]bool{}
	for {
		s.space()
		raw, err := s.str()
		if err != nil {
			return err
		}
		k := string(raw[1 : len(raw)-1])
		if !plainKey(raw[1:len(raw)-1]) && json.Unmarshal(raw, &k) != nil {
			return errMalformed
		}
		// Go's json folds ſ to s and the Kelvin sign to k as well.
		lk := strings.ToLower(strings.ToUpper(k))
		if keys[lk] {
			return fmt.Errorf("key %q appears twice in one object", k)
		}
		keys[lk] = true
		var field reflect.Type
		if t != nil {
			for i := range t.NumField() {
				name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
				if !strings.EqualFold(k, name) {
					continue
				}
				if k != name {
					return fmt.Errorf("key %s%s is spelt %q in the OCI spec: a runtime that reads keys as written would not see what the hook reads", at, k, name)
				}
				field = t.Field(i).Type
			}
		}
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return errMalformed
		}
		s.i++
		fieldAt := ""
		if field != nil {
			fieldAt = at + k + "."
		}
		if err := s.value(field, fieldAt, depth+1); err != nil {
			return err
		}
		if end, err := s.next('}'); end || err != nil {
			return err
		}
	}
}

// next reads the comma before another member or element, or end, the
// end of the object or array.
func (s *keyScan) next(end byte) (bool, error) {
	s.space()
	switch {
	case s.i >= len(s.b):
		return false, errMalformed
	case s.b[s.i] == ',':
		s.i++
		return false, nil
	case s.b[s.i] == end:
		s.i++
		return true, nil
	}
	return false, errMalformed
}

// str scans the string at s.i and returns it as written, quotes and
// escapes included. A string that a runtime in C reads otherwise than
// Go's decoder is refused (errUnlikeC).
func (s *keyScan) str() ([]byte, error) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, errMalformed
	}
	high, wide := false, false // the escape just before is a high surrogate's; a byte past ASCII seen
	for j := s.i + 1; j < len(s.b); j++ {
		c := s.b[j]
		if c == '\\' && j+1 < len(s.b) && s.b[j+1] == 'u' {
			if j+5 >= len(s.b) {
				return nil, errMalformed
			}
			r, err := strconv.ParseUint(string(s.b[j+2:j+6]), 16, 16)
			switch low := r >= 0xdc00 && r <= 0xdfff; {
			case err != nil:
				return nil, errMalformed
			case r == 0:
				return nil, errUnlikeC("U+0000 (\\u0000)", "cut there")
			case low != high: // a low half with no high before it, or a high half's without one after
				return nil, errUnlikeC("a surrogate escape not in a pair", "another character")
			}
			high = r >= 0xd800 && r <= 0xdbff
			j += 5
			continue
		}
		if high {
			return nil, errUnlikeC("a surrogate escape not in a pair", "another character")
		}
		switch {
		case c == '\\':
			j++
		case c == '"':
			raw := s.b[s.i : j+1]
			if wide && !utf8.Valid(raw) {
				return nil, errUnlikeC("bytes that are not UTF-8", "as written")
			}
			s.i = j + 1
			return raw, nil
		case c >= utf8.RuneSelf:
			wide = true
		}
	}
	return nil, errMalformed
}

// plainKey: the decoder reads a key of these bytes as written (no
// escape, no control character, valid UTF-8).
func plainKey(b []byte) bool {
	for _, c := range b {
		if c < ' ' || c == '\\' {
			return false
		}
	}
	return utf8.Valid(b)
}
