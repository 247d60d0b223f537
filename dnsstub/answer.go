//go:build linux

package dnsstub

import (
	"errors"
	"net/netip"
	"strings"
	"time"

	"github.com/trialnet/trialnet/wire"
	"golang.org/x/net/dns/dnsmessage"
)

// Why each answer (docs/transparent.md has the table):
//
//   - NXDOMAIN says the name does not exist, for this Trial: the answer
//     to a name the policy does not admit, and to reverse names. It is
//     final: a client gives up at once (getaddrinfo's EAI_NONAME, "Name
//     or service not known") instead of trying again.
//   - NOERROR with no answer (NODATA) says the name exists without
//     records of that type: what an admitted name gets for AAAA, TXT, MX,
//     HTTPS and the rest. NXDOMAIN there would deny the name itself
//     (RFC 8020), and a caching client would then refuse its A too.
//   - REFUSED says this stub will not answer the question at all: a class
//     other than IN, ANY and the zone-transfer and meta types, a name
//     that is no host name (binary labels, underscores, an IP address),
//     and a bound met (the rate, the pool).
//   - FORMERR and NOTIMP are what RFC 1035 gives malformed queries and
//     other opcodes. A packet without a whole header, or one that is
//     itself a response, gets nothing.

// answer builds the reply to query in out (reusing its storage), or nil
// when nothing is to be sent. oversize says the query was cut at
// maxQuery+1 bytes. It never allocates in proportion to the query, and
// nothing in the query reaches anything but the policy and the pool.
func (s *Server) answer(query []byte, oversize bool, out []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		s.count(statDropped)
		return nil
	}
	reply := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	switch {
	case !s.bucket.Take(time.Now()):
		s.count(statRateLimited)
		return build(out, reply, nil, dnsmessage.RCodeRefused, netip.Addr{})
	case oversize:
		s.count(statFormErr)
		return build(out, reply, nil, dnsmessage.RCodeFormatError, netip.Addr{})
	case h.OpCode != 0:
		s.count(statNotImp)
		return build(out, reply, nil, dnsmessage.RCodeNotImplemented, netip.Addr{})
	}
	q, err := p.Question()
	if err == nil {
		// Exactly one question: a second is an error, whatever it holds.
		if _, err2 := p.Question(); !errors.Is(err2, dnsmessage.ErrSectionDone) {
			err = errors.New("more than one question")
		}
	}
	if err != nil {
		s.count(statFormErr)
		return build(out, reply, nil, dnsmessage.RCodeFormatError, netip.Addr{})
	}
	rcode, addr := s.decide(q)
	return build(out, reply, &q, rcode, addr)
}

// decide answers one question: its rcode, and the address when it is an
// answer. Only here does a name meet the policy and the pool.
func (s *Server) decide(q dnsmessage.Question) (dnsmessage.RCode, netip.Addr) {
	name, err := wire.NormaliseName(q.Name.String())
	// Reverse names are never a Trial's: no policy admits them, learning
	// included, so that a PTR query carries nothing into a profile.
	reverse := err == nil && (name == "arpa" || strings.HasSuffix(name, ".arpa"))
	admitted := err == nil && !reverse && (s.learn != nil || s.admit(name))
	// A name off the Trial's list is a refused attempt, as a refused
	// CONNECT is, whatever type it is asked with: counted for the
	// receipt. Any resolver asks for reverse names and the root, so
	// those are not.
	if !admitted && !reverse && q.Name.String() != "." {
		s.count(statDenied)
	}
	switch {
	case q.Class != dnsmessage.ClassINET || metaType(q.Type) || err != nil:
		s.count(statRefused)
		return dnsmessage.RCodeRefused, netip.Addr{}
	case !admitted:
		s.count(statNXDomain)
		return dnsmessage.RCodeNameError, netip.Addr{}
	}
	if q.Type != dnsmessage.TypeA {
		s.count(statNoData)
		return dnsmessage.RCodeSuccess, netip.Addr{}
	}
	addr, fresh, err := s.pool.Assign(name)
	if err != nil {
		s.count(statPoolFull)
		return dnsmessage.RCodeRefused, netip.Addr{}
	}
	if fresh && s.learn != nil {
		s.learn(name)
	}
	s.count(statAnswered)
	return dnsmessage.RCodeSuccess, addr
}

// metaType reports the types that ask for more than one record set or
// are no record type at all: ANY, the zone transfers, MAILA/MAILB, and
// OPT, which belongs in the additional section, never in a question.
func metaType(t dnsmessage.Type) bool {
	return t == dnsmessage.TypeOPT || t == dnsmessage.TypeALL || t == dnsmessage.TypeAXFR ||
		t == 251 /* IXFR */ || t == 253 /* MAILB */ || t == 254 /* MAILA */
}

// build writes a reply: the header with rcode, the question when there
// is one (as the client spelt it: a resolver that varies the case of its
// names checks it comes back alike), and an A record when addr is valid.
// An error cannot happen with the sizes here (a question of at most 255
// bytes, one A record); it would leave no reply rather than a wrong one.
func build(out []byte, h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, addr netip.Addr) []byte {
	h.RCode = rcode
	h.Authoritative = rcode == dnsmessage.RCodeSuccess || rcode == dnsmessage.RCodeNameError
	b := dnsmessage.NewBuilder(out[:0], h)
	b.EnableCompression()
	if q == nil {
		msg, err := b.Finish()
		if err != nil {
			return nil
		}
		return msg
	}
	if b.StartQuestions() != nil || b.Question(*q) != nil {
		return nil
	}
	if addr.IsValid() {
		rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: answerTTL}
		if b.StartAnswers() != nil || b.AResource(rh, dnsmessage.AResource{A: addr.As4()}) != nil {
			return nil
		}
	}
	msg, err := b.Finish()
	if err != nil {
		return nil
	}
	return msg
}
