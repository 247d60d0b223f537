// Package allow is a Trial's allowlist: entries of a name (or a
// "*." wildcard that stops at public suffixes) and a port, each perhaps
// requiring TLS, matched before any DNS.
package allow

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/trialnet/trialnet/wire"
	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
)

// Entry is one allowlist entry: an exact name or a "*.suffix" wildcard,
// and one port. A wildcard stops at public suffixes; see wildcardCovers.
type Entry struct {
	Name       string // normalised; for a wildcard, the suffix without "*."
	Wildcard   bool   // matches names with at least one more label, never Name itself, never across a public suffix
	Port       uint16
	RequireTLS bool // the first bytes through the tunnel must be a ClientHello
	// Profile is the configuration profile the entry came from; empty for
	// an entry given directly. An entry that several profiles list (or a
	// profile and a direct entry) keeps the first profile in name order
	// (see New), so the choice does not depend on request order.
	Profile string
}

func (e Entry) String() string {
	n := e.Name
	if e.Wildcard {
		n = "*." + n
	}
	return n + ":" + strconv.Itoa(int(e.Port))
}

// ParseEntry parses "host:port" or "*.suffix:port". Names are compared in
// lower case, without one trailing dot, and in their ASCII (punycode)
// form; a Unicode name in configuration is converted. Entries that name
// an IP address are refused, and so are wildcards that are too broad or
// could only match other owners' names (see checkWildcard).
func ParseEntry(s string) (Entry, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return Entry{}, fmt.Errorf("allowlist entry %q: want host:port (for example api.anthropic.com:443)", s)
	}
	host, portStr := s[:i], s[i+1:]
	port, err := wire.ParsePort(portStr)
	if err != nil {
		return Entry{}, fmt.Errorf("allowlist entry %q: %v", s, err)
	}
	e := Entry{Port: port}
	if host == "*" {
		return Entry{}, fmt.Errorf("allowlist entry %q is too broad: it would allow every name", s)
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		e.Wildcard, host = true, rest
	}
	if strings.Contains(host, "*") {
		return Entry{}, fmt.Errorf("allowlist entry %q: a wildcard is only allowed as a leading \"*.\"", s)
	}
	ascii, err := idna.Lookup.ToASCII(strings.TrimSuffix(host, "."))
	if err != nil {
		return Entry{}, fmt.Errorf("allowlist entry %q: invalid internationalised name: %v", s, err)
	}
	name, err := wire.NormaliseName(ascii)
	if err != nil {
		return Entry{}, fmt.Errorf("allowlist entry %q: %v", s, err)
	}
	if e.Wildcard {
		if err := checkWildcard(name); err != nil {
			return Entry{}, fmt.Errorf("allowlist entry %q: %w", s, err)
		}
	}
	if !strings.Contains(name, ".") {
		return Entry{}, fmt.Errorf("allowlist entry %q: %q is not a fully qualified name", s, name)
	}
	e.Name = name
	return e, nil
}

// List is an immutable set of entries, matched before any DNS.
type List struct {
	exact    map[string]Entry // "name:port"
	wildcard []Entry
}

// New builds an allowlist from parsed entries. An empty allowlist
// allows nothing. Entries for the same name and port are merged: an exact
// entry requires TLS if any of them does, and keeps the first non-empty
// profile in name order; wildcards merge when they also agree on TLS.
func New(entries ...Entry) *List {
	a := &List{exact: make(map[string]Entry)}
	for _, e := range entries {
		if e.Wildcard {
			i := slices.IndexFunc(a.wildcard, func(w Entry) bool {
				return w.Name == e.Name && w.Port == e.Port && w.RequireTLS == e.RequireTLS
			})
			if i < 0 {
				a.wildcard = append(a.wildcard, e)
			} else {
				a.wildcard[i].Profile = firstProfile(a.wildcard[i].Profile, e.Profile)
			}
			continue
		}
		k := e.String()
		if old, ok := a.exact[k]; ok {
			e.RequireTLS = e.RequireTLS || old.RequireTLS
			e.Profile = firstProfile(old.Profile, e.Profile)
		}
		a.exact[k] = e
	}
	return a
}

// firstProfile is the first of two profile names in name order, an empty
// name (no profile) counting last.
func firstProfile(x, y string) string {
	if x == "" || (y != "" && y < x) {
		return y
	}
	return x
}

// Parse parses entries with ParseEntry; they carry no profile.
func Parse(entries []string, requireTLS bool) (*List, error) {
	return ParseProfile(entries, requireTLS, "")
}

// parseAllowlist parses entries, all from one profile ("" for none).
func ParseProfile(entries []string, requireTLS bool, profile string) (*List, error) {
	var es []Entry
	for _, s := range entries {
		e, err := ParseEntry(s)
		if err != nil {
			return nil, err
		}
		e.RequireTLS, e.Profile = requireTLS, profile
		es = append(es, e)
	}
	return New(es...), nil
}

// Match returns the entry allowing host:port. host must already be
// normalised (Request.Host is). When an exact and a wildcard entry both
// match, the one requiring TLS wins.
func (a *List) Match(host string, port uint16) (Entry, bool) {
	var found Entry
	ok := false
	if a == nil {
		return found, false
	}
	if e, hit := a.exact[host+":"+strconv.Itoa(int(port))]; hit {
		found, ok = e, true
	}
	for _, e := range a.wildcard {
		if e.Port == port && (!ok || e.RequireTLS) && WildcardCovers(host, e.Name) {
			found, ok = e, true
		}
	}
	return found, ok
}

// AdmitsName reports whether some entry, on any port, matches host: the
// question a DNS answer asks, before there is a port to ask about. The
// port is judged when the connection comes. host must be normalised.
func (a *List) AdmitsName(host string) bool {
	if a == nil {
		return false
	}
	for _, e := range a.exact {
		if e.Name == host {
			return true
		}
	}
	for _, e := range a.wildcard {
		if WildcardCovers(host, e.Name) {
			return true
		}
	}
	return false
}

// Entries lists the allowlist, exact entries first, each group sorted.
func (a *List) Entries() []Entry {
	if a == nil {
		return nil
	}
	var out []Entry
	for _, e := range a.exact {
		out = append(out, e)
	}
	sortEntries(out)
	w := slices.Clone(a.wildcard)
	sortEntries(w)
	return append(out, w...)
}

func sortEntries(es []Entry) {
	slices.SortFunc(es, func(x, y Entry) int { return strings.Compare(x.String(), y.String()) })
}

// Union merges allowlists; a name needing TLS in any of them needs it in
// the result.
func Union(lists ...*List) *List {
	var all []Entry
	for _, l := range lists {
		all = append(all, l.Entries()...)
	}
	return New(all...)
}

// wildcardProbe is a label no public suffix rule names: if probe.S is a
// public suffix, a wildcard rule "*.S" makes every child of S one.
const wildcardProbe = "trialnet-wildcard-probe"

// checkWildcard decides at load whether "*.name" is a usable wildcard,
// using the public suffix list (golang.org/x/net/publicsuffix, ICANN and
// private sections together). It is refused when
//
//   - name is itself a public suffix ("*.com", "*.co.uk", "*.github.io",
//     "*.s3.amazonaws.com", an unlisted top-level name like "*.internal"):
//     its children belong to unrelated owners;
//   - every direct child of name is a public suffix by a wildcard rule
//     ("*.kawasaki.jp", "*.compute.amazonaws.com"): under the matching
//     rule of wildcardCovers the entry could only ever match those
//     children themselves, each the suffix of other owners, and nothing
//     below them. Exceptions to such a rule ("!city.kawasaki.jp") are
//     not worth a wildcard: list those names.
func checkWildcard(name string) error {
	if ps, icann := publicsuffix.PublicSuffix(name); ps == name {
		return fmt.Errorf("too broad: %q is a public suffix (%s), so the wildcard would match names of unrelated owners", name, section(icann))
	}
	probe := wildcardProbe + "." + name
	if ps, icann := publicsuffix.PublicSuffix(probe); ps == probe {
		return fmt.Errorf("can never match a single owner's host: every name directly under %q is itself a public suffix (rule *.%s, %s), and the wildcard does not reach across a public suffix; list exact names instead", name, name, section(icann))
	}
	return nil
}

func section(icann bool) string {
	if icann {
		return "ICANN section of the public suffix list"
	}
	return "private section of the public suffix list, or no rule at all"
}

// WildcardCovers reports whether host matches "*.suffix": host must end
// in "."+suffix, and no public suffix may lie strictly between host and
// suffix. So "*.amazonaws.com" matches "foo.amazonaws.com" and the host
// "s3.amazonaws.com" itself, but not "x.s3.amazonaws.com", which sits
// under the public suffix "s3.amazonaws.com" and so belongs to another
// owner. host must be normalised.
func WildcardCovers(host, suffix string) bool {
	if !strings.HasSuffix(host, "."+suffix) {
		return false
	}
	// Walk the ancestors of host that are strictly below suffix.
	n := host
	for {
		i := strings.IndexByte(n, '.')
		if i < 0 {
			return false // cannot happen: host ends in "."+suffix
		}
		n = n[i+1:]
		if n == suffix {
			return true
		}
		if ps, _ := publicsuffix.PublicSuffix(n); ps == n {
			return false
		}
	}
}

// Has reports whether e (by name, wildcard and port) is an entry of a.
func (a *List) Has(e Entry) bool {
	if a == nil {
		return false
	}
	if e.Wildcard {
		return slices.ContainsFunc(a.wildcard, func(w Entry) bool { return w.String() == e.String() })
	}
	_, ok := a.exact[e.String()]
	return ok
}

// Change returns a new allowlist: a without the entries remove names (by
// name, wildcard and port, whatever their TLS requirement or profile),
// with add. Removing an entry that a does not hold is an error, so that a
// typo, or a name allowed only through a wildcard, is not mistaken for a
// refusal. a is unchanged.
func (a *List) Change(add, remove []Entry) (*List, error) {
	gone := make(map[string]bool, len(remove))
	for _, e := range remove {
		if !a.Has(e) {
			if m, ok := a.Match(e.Name, e.Port); ok && !e.Wildcard {
				return nil, fmt.Errorf("%s is not an entry of this allowlist: it is allowed by %s; remove that entry", e, m)
			}
			return nil, fmt.Errorf("%s is not an entry of this allowlist", e)
		}
		gone[e.String()] = true
	}
	var keep []Entry
	for _, e := range a.Entries() {
		if !gone[e.String()] {
			keep = append(keep, e)
		}
	}
	return New(append(keep, add...)...), nil
}

// Strings are entries as their String spells them (never nil: a record
// lists none as []).
func Strings(es []Entry) []string {
	out := []string{}
	for _, e := range es {
		out = append(out, e.String())
	}
	return out
}
