package ocihook

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzDecodeStrictRefusesEveryDuplicate holds the key scan to the
// decoder's own tokens: a document decodeStrict accepts has no object
// with a key twice, compared without case, at any depth, as
// json.Decoder reads its keys.
func FuzzDecodeStrictRefusesEveryDuplicate(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"A":2}`, `{"a":{"b":1,"b":2}}`, `[{"x":1},{"x":1,"X":1}]`, `{"\u0061":1,"a":2}`,
		`{"ſ":1,"s":2}`, `{"K":1,"k":2}`, `{"a\"":1,"a\\\"":2}`, `{"a":[1,{"b":{"c":1,"C":2}}]}`,
		`{"mounts":[],"mounts\u0000":[]}`, "{\"a\xff\":1,\"a\":2}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var v any
		if decodeStrict(b, &v) != nil {
			return
		}
		if dup := duplicateKey(b); dup != "" {
			t.Fatalf("decodeStrict accepted %q, whose object holds %q twice", b, dup)
		}
	})
}

// duplicateKey is a key that an object of b holds twice without regard
// to case, by json.Decoder's tokens; "" for none (or a document the
// decoder does not read).
func duplicateKey(b []byte) string {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct {
		obj  bool
		keys []string
		key  bool // the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) || err != nil {
			return ""
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if s, ok := tok.(string); ok && top != nil && top.obj && top.key {
			for _, k := range top.keys {
				if strings.EqualFold(k, s) {
					return s
				}
			}
			top.keys = append(top.keys, s)
			top.key = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, key: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the next string of an object is its key.
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].key = true
		}
	}
}

// The fuzz target's reference finds what it is there to find.
func TestDuplicateKeyReference(t *testing.T) {
	for doc, want := range map[string]string{
		`{"a":1,"A":2}`: "A", `{"a":{"b":"x","c":1,"B":2}}`: "B", `[{"x":1},{"y":[1,"x"],"Y":1}]`: "Y",
		`{"a":1,"b":{"a":2}}`: "", `["a","a"]`: "", `{"a":"b","b":1}`: "",
	} {
		if got := duplicateKey([]byte(doc)); got != want {
			t.Errorf("duplicateKey(%s) = %q, want %q", doc, got, want)
		}
	}
}
