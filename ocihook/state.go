//go:build linux

package ocihook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
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
	if err := noDuplicateKeys(b); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("more than one JSON value")
	}
	return nil
}

// noDuplicateKeys walks the document's tokens and refuses an object
// that holds a key twice, compared without case.
func noDuplicateKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool // the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
		} else if top := last(stack); top != nil && top.object && top.key {
			k, _ := tok.(string)
			// Go's json folds ſ to s and the Kelvin sign to k as well.
			lk := strings.ToLower(strings.ToUpper(k))
			if top.keys[lk] {
				return fmt.Errorf("key %q appears twice in one object", k)
			}
			top.keys[lk] = true
			top.key = false
			continue
		} else if d == '{' || d == '[' {
			stack = append(stack, &frame{keys: map[string]bool{}, object: d == '{', key: d == '{'})
			continue
		}
		// A value ended: in an object the next token is a key.
		if top := last(stack); top != nil && top.object {
			top.key = true
		}
	}
}

func last[T any](s []*T) *T {
	if len(s) == 0 {
		return nil
	}
	return s[len(s)-1]
}
