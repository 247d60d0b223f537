package wire

import (
	"bufio"
	"bytes"
	"net/url"
	"strings"

	"github.com/trialnet/trialnet/record"
)

// ParseGatewayHead validates a peeked head sent to the credential
// gateway: the same strict lines, methods, versions and framing as
// ParseHTTPHead, and an origin-form target ("/route/rest?query") whose
// path holds no '.' or '..' segment, no encoded '/', '\' or '.', and no
// backslash, so that the route its prefix names is the route the
// upstream serves it under. The Host field is not judged: the upstream
// is the route's. The returned Request carries the method, target and
// version; its host and port are the route's, which the caller sets.
func ParseGatewayHead(raw []byte) (*Request, error) {
	h, err := readHead(bufio.NewReader(bytes.NewReader(raw)))
	if h == nil {
		return nil, err
	}
	req := &Request{Method: h.method, Target: h.target, Version: h.version}
	if err != nil {
		return req, err
	}
	if !forwardedMethods[h.method] {
		return req, record.Deny(record.ReasonMethodNotAllowed, "method %q: the gateway forwards %s", Truncate(h.method), forwardedMethodList)
	}
	if err := checkVersion(h.version); err != nil {
		return req, err
	}
	if err := checkGatewayPath(h.target); err != nil {
		return req, err
	}
	return req, checkFraming(h)
}

// checkGatewayPath refuses a target that is not a plain origin-form path.
func checkGatewayPath(target string) error {
	path, _, _ := strings.Cut(target, "?")
	switch {
	case !strings.HasPrefix(target, "/"):
		return record.Deny(record.ReasonBadTarget, "target %q: the gateway takes a path starting with '/' ($TRIALNET_GATEWAY/route/...)", Truncate(target))
	case strings.ContainsAny(target, "#\\"):
		return record.Deny(record.ReasonBadTarget, "target %q holds a fragment or a backslash", Truncate(target))
	}
	// What net/http would refuse (a bad percent-escape among it) never
	// reaches the upstream as something else.
	if _, err := url.ParseRequestURI(target); err != nil {
		return record.Deny(record.ReasonBadTarget, "target %q is not a valid request target: %v", Truncate(target), err)
	}
	lower := strings.ToLower(path)
	for _, enc := range []string{"%2f", "%5c", "%2e"} {
		if strings.Contains(lower, enc) {
			return record.Deny(record.ReasonBadTarget, "target %q: an encoded '/', '\\' or '.' in the path", Truncate(target))
		}
	}
	for _, seg := range strings.Split(path, "/") {
		if seg == "." || seg == ".." {
			return record.Deny(record.ReasonBadTarget, "target %q: a '.' or '..' segment in the path", Truncate(target))
		}
	}
	return nil
}
