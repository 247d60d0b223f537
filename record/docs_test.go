package record

import (
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// recordsPage is the reference page of the decision record.
const recordsPage = "../docs/records.md"

// recordKeys are the JSON keys of every record type, from their tags:
// the decision record and the objects a policy change and a summary
// carry. Each maps to the types that have it.
func recordKeys() map[string][]string {
	keys := make(map[string][]string)
	for _, t := range []reflect.Type{
		reflect.TypeFor[eventJSON](),
		reflect.TypeFor[PolicyChange](),
		reflect.TypeFor[Suppressed](),
		reflect.TypeFor[ReachedTarget](),
	} {
		for i := range t.NumField() {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			keys[name] = append(keys[name], t.Name())
		}
	}
	return keys
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// documentedKeys are the keys the page's key tables name: the
// backquoted words in the first column of every table whose first
// header cell is "key".
func documentedKeys(t *testing.T, page string) map[string]bool {
	t.Helper()
	keys := make(map[string]bool)
	lines := strings.Split(page, "\n")
	inKeyTable := false
	for i, l := range lines {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "|") {
			inKeyTable = false
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		first := strings.TrimSpace(cells[0])
		switch {
		case i == 0 || !strings.HasPrefix(strings.TrimSpace(lines[i-1]), "|"): // a header row
			inKeyTable = first == "key"
		case !inKeyTable || strings.Trim(first, "-: ") == "": // another table, or the delimiter row
		default:
			m := codeSpan.FindAllStringSubmatch(first, -1)
			if len(m) == 0 {
				t.Errorf("%s line %d: a key table row names no `key`: %s", recordsPage, i+1, l)
			}
			for _, s := range m {
				keys[s[1]] = true
			}
		}
	}
	return keys
}

// TestDocsNameEveryKey holds docs/records.md to the record types: every
// JSON key of a decision, policy-change or summary record is in one of
// its key tables, and every key its tables name is one a record has.
func TestDocsNameEveryKey(t *testing.T) {
	b, err := os.ReadFile(recordsPage)
	if err != nil {
		t.Fatal(err)
	}
	have := recordKeys()
	documented := documentedKeys(t, string(b))
	if len(documented) == 0 {
		t.Fatalf("%s has no key tables (a table whose first header cell is \"key\")", recordsPage)
	}
	var missing, unknown []string
	for k, types := range have {
		if !documented[k] {
			missing = append(missing, "`"+k+"` ("+strings.Join(types, ", ")+")")
		}
	}
	for k := range documented {
		if _, ok := have[k]; !ok {
			unknown = append(unknown, "`"+k+"`")
		}
	}
	sort.Strings(missing)
	sort.Strings(unknown)
	if len(missing) > 0 {
		t.Errorf("%s documents no row for these record keys: %s", recordsPage, strings.Join(missing, ", "))
	}
	if len(unknown) > 0 {
		t.Errorf("%s documents keys that no record type has: %s", recordsPage, strings.Join(unknown, ", "))
	}
}
