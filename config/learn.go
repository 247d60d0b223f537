package config

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/publicsuffix"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/internal/ident"
	"github.com/trialnet/trialnet/internal/termsafe"
	"github.com/trialnet/trialnet/record"
)

// DefaultWildcardHosts is how many distinct hosts under one suffix Learn
// wants seen before it offers a wildcard for them.
const DefaultWildcardHosts = 3

// Learned is what a Trial used, read back from its decision records: the
// basis of a profile that allows exactly that.
type Learned struct {
	Trials    []string // the Trials the records came from, sorted
	Records   int      // decisions read, a summary's suppressed ones included (policy changes not counted)
	Changes   int      // policy changes among the records
	Entries   []LearnedEntry
	Wildcards []LearnedWildcard
}

// LearnedEntry is one host:port the Trial was let through to.
type LearnedEntry struct {
	Entry     allow.Entry // Entry.RequireTLS: every record that let it through applied that requirement
	Allowed   int         // let through by an allowlist entry
	WouldDeny int         // let through only because the Trial was learning
}

// LearnedWildcard is a "*.suffix:port" entry that would cover several
// hosts seen, offered, never chosen, in place of their exact entries.
type LearnedWildcard struct {
	Entry allow.Entry
	Hosts []string // the hosts seen that it covers, sorted
}

// Learn reads decision records: every request that was let through
// (tunnelled or forwarded, by a rule or by learning) gives its exact
// host:port. Refusals are left out, a learning Trial's included (the
// address guard refused them whatever the allowlist said). A wildcard is
// offered for hosts of one port that lie under one registrable domain
// (publicsuffix.EffectiveTLDPlusOne), when at least minHosts distinct
// hosts seen lie under their longest common suffix and ParseEntry accepts
// the wildcard (so never over a public suffix). minHosts < 2 means
// DefaultWildcardHosts.
func Learn(recs []record.Event, minHosts int) Learned {
	if minHosts < 2 {
		minHosts = DefaultWildcardHosts
	}
	var l Learned
	seen := map[string]*LearnedEntry{}
	trials := map[string]bool{}
	for i := range recs {
		r := &recs[i]
		if r.Trial != "" {
			trials[r.Trial] = true
		}
		switch r.Decision {
		case record.DecisionPolicyChange:
			l.Changes++
			continue
		case record.DecisionSuppressed:
			if s := r.Suppressed; s != nil { // decisions made, their records not written
				l.Records += int(s.Records)
				for _, rt := range s.Reached {
					// A log read with --from is anyone's: counts clamped.
					req := min(rt.Requests, math.MaxInt32)
					wd := min(rt.WouldDeny, req)
					saw(seen, rt.Host, rt.Port, rt.RequireTLS, int(req-wd), int(wd))
				}
			}
			continue
		}
		l.Records++
		if r.Decision != record.DecisionAllow {
			continue
		}
		if r.WouldDeny != "" {
			saw(seen, r.Host, r.Port, r.RequireTLS, 0, 1)
		} else {
			saw(seen, r.Host, r.Port, r.RequireTLS, 1, 0)
		}
	}
	for t := range trials {
		l.Trials = append(l.Trials, t)
	}
	slices.Sort(l.Trials)
	for _, le := range seen {
		l.Entries = append(l.Entries, *le)
	}
	slices.SortFunc(l.Entries, func(x, y LearnedEntry) int { return strings.Compare(x.Entry.String(), y.Entry.String()) })
	l.Wildcards = offerWildcards(l.Entries, minHosts)
	return l
}

// saw counts requests let through to host:port under requireTLS.
func saw(seen map[string]*LearnedEntry, host string, port uint16, requireTLS bool, allowed, wouldDeny int) {
	if host == "" || port == 0 {
		return
	}
	e, err := allow.ParseEntry(host + ":" + strconv.Itoa(int(port)))
	if err != nil {
		return // cannot happen for a name the proxy let through
	}
	le := seen[e.String()]
	if le == nil {
		e.RequireTLS = true // until a record let it through without
		le = &LearnedEntry{Entry: e}
		seen[e.String()] = le
	}
	le.Entry.RequireTLS = le.Entry.RequireTLS && requireTLS
	le.Allowed += allowed
	le.WouldDeny += wouldDeny
}

// offerWildcards groups hosts by port and registrable domain and offers
// the longest common suffix of each large enough group.
func offerWildcards(entries []LearnedEntry, minHosts int) []LearnedWildcard {
	type key struct {
		domain string
		port   uint16
	}
	groups := map[key][]string{}
	var keys []key
	for _, le := range entries {
		d, err := publicsuffix.EffectiveTLDPlusOne(le.Entry.Name)
		if err != nil {
			continue
		}
		k := key{d, le.Entry.Port}
		if groups[k] == nil {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], le.Entry.Name)
	}
	var out []LearnedWildcard
	for _, k := range keys {
		hosts := groups[k]
		if len(hosts) < minHosts {
			continue
		}
		suffix := commonSuffix(hosts)
		e, err := allow.ParseEntry("*." + suffix + ":" + strconv.Itoa(int(k.port)))
		if err != nil {
			continue // too broad, or never a single owner's: not offered
		}
		w := LearnedWildcard{Entry: e}
		for _, h := range hosts {
			if allow.WildcardCovers(h, suffix) {
				w.Hosts = append(w.Hosts, h)
			}
		}
		if len(w.Hosts) >= minHosts {
			slices.Sort(w.Hosts)
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(x, y LearnedWildcard) int { return strings.Compare(x.Entry.String(), y.Entry.String()) })
	return out
}

// commonSuffix is the longest run of whole labels that every name ends in.
func commonSuffix(names []string) string {
	common := strings.Split(names[0], ".")
	for _, n := range names[1:] {
		labels := strings.Split(n, ".")
		i := 0
		for i < len(common) && i < len(labels) && common[len(common)-1-i] == labels[len(labels)-1-i] {
			i++
		}
		common = common[len(common)-i:]
	}
	return strings.Join(common, ".")
}

// tlsProfileSuffix names the second profile Profile writes when some
// entries were let through under require_tls and others not.
const tlsProfileSuffix = "_tls"

// Profile writes l as a configuration file holding one profile, name,
// that allows exactly the entries seen, with the TLS requirement they
// were let through under (when some were and some were not, those that
// were go in a second profile, name+"_tls"); counts and offered wildcards
// are comments. It is checked with ParseFile before it is returned, so that
// it can be pasted into (or used as) a configuration.
func (l Learned) Profile(name string) ([]byte, error) {
	if !ident.Valid(name) {
		return nil, fmt.Errorf("profile name %q: use lower-case letters, digits, '-' and '_'", name)
	}
	if len(l.Entries) == 0 {
		return nil, fmt.Errorf("the %d decision records let nothing through: there is no profile to make", l.Records)
	}
	var b bytes.Buffer
	trials := make([]string, len(l.Trials))
	for i, t := range l.Trials {
		trials[i] = termsafe.String(t) // a comment, one line, whatever a log read with --from says
	}
	fmt.Fprintf(&b, "# Learned by trialnet audit from Trial %s: %d decision records, %d policy changes.\n", strings.Join(trials, ", "), l.Records, l.Changes)
	fmt.Fprintf(&b, "# Exactly the host:port entries let through; counts are requests allowed by a rule\n# and let through only because the Trial was learning (would_deny).\n")
	// An entry let through only under require_tls keeps it: a profile
	// is never weaker than what its Trial ran under. The requirement is
	// per profile, so a mix is written as two.
	var plain, tls []LearnedEntry
	for _, le := range l.Entries {
		if le.Entry.RequireTLS {
			tls = append(tls, le)
		} else {
			plain = append(plain, le)
		}
	}
	if len(plain) > 0 && len(tls) > 0 && !ident.Valid(name+tlsProfileSuffix) {
		return nil, fmt.Errorf("profile name %q: some entries need TLS and some do not, and %q, the second profile's name, is not valid: use a shorter name", name, name+tlsProfileSuffix)
	}
	if len(plain) > 0 && len(tls) > 0 {
		fmt.Fprintf(&b, "# Entries let through only with their TLS requirement are in %s%s: use both profiles.\n", name, tlsProfileSuffix)
	}
	b.WriteString("profiles:\n")
	for _, p := range []struct {
		name    string
		entries []LearnedEntry
		tls     bool
	}{{name, plain, false}, {name + tlsProfileSuffix, tls, true}} {
		if len(p.entries) == 0 {
			continue
		}
		if len(plain) == 0 { // all of them want TLS: one profile still
			p.name = name
		}
		fmt.Fprintf(&b, "  %s:\n", p.name)
		if p.tls {
			b.WriteString("    require_tls: true\n")
		}
		b.WriteString("    allow:\n")
		for _, le := range p.entries {
			fmt.Fprintf(&b, "      - %q # %d allowed, %d would_deny\n", le.Entry.String(), le.Allowed, le.WouldDeny)
		}
		for _, w := range l.Wildcards {
			// Offered only where every host it covers is, so that it never
			// carries a TLS host into the plain profile.
			if !slices.ContainsFunc(w.Hosts, func(h string) bool {
				return !slices.ContainsFunc(p.entries, func(le LearnedEntry) bool { return le.Entry.Name == h && le.Entry.Port == w.Entry.Port })
			}) {
				fmt.Fprintf(&b, "      # offered: - %q # covers %d hosts seen (%s) and every other name under %s; replace their entries with it if that is meant\n",
					w.Entry.String(), len(w.Hosts), strings.Join(w.Hosts, ", "), w.Entry.Name)
			}
		}
	}
	if _, err := ParseFile(b.Bytes()); err != nil {
		return nil, fmt.Errorf("learned profile does not load: %w", err)
	}
	return b.Bytes(), nil
}
