package config

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/trial"
)

// Spec makes the description of the Trial that req asks for under f
// (nil: no file), with its allowlist parsed: entries from req and from
// the profiles it names (one f does not define wraps ErrUnknownProfile;
// a bad entry is allow's error), learning or nesting if req or one of
// its profiles asks, transparent mode unless req or one of them turns
// it off, the limits req gives or else those of f (the
// proxy's at their defaults) with req's process limit, and cidrs, the
// allowed CIDRs in force, which a reload will not widen for it. The
// caller checks the id, nonce, report path and process limit, and names
// the owner.
func (f *File) Spec(req trial.Request, cidrs []netip.Prefix) (trial.Spec, *allow.List, error) {
	list, err := f.Allowlist(req.Profiles, req.Allow, req.RequireTLS)
	if err != nil {
		return trial.Spec{}, nil, err
	}
	gw, err := f.gatewayOf(req.Profiles)
	if err != nil {
		return trial.Spec{}, nil, err
	}
	var lim trial.Limits
	if f != nil {
		lim = f.Limits
	}
	lim.ProxyLimits = lim.ProxyLimits.WithDefaults()
	if req.Limits != nil {
		lim = *req.Limits
	}
	if req.MaxProcesses != 0 {
		lim.MaxProcesses = req.MaxProcesses
	}
	hosts, err := f.hostServices(req.Profiles)
	if err != nil {
		return trial.Spec{}, nil, err
	}
	return trial.Spec{
		Schema:   trial.Schema,
		ID:       req.ID,
		Strict:   req.Strict,
		UnixOpen: req.UnixOpen,
		Nested:   req.Nested || f.nests(req.Profiles),
		// On unless asked off: by the request or by any of its profiles.
		Transparent:  !req.NoTransparent && !f.opaque(req.Profiles),
		Gateway:      gw,
		UnixAllow:    slices.Clone(req.UnixAllow),
		Learning:     req.Learn || f.learns(req.Profiles),
		Allow:        AllowEntries(list),
		Profiles:     slices.Clone(req.Profiles),
		AllowCIDRs:   slices.Clone(cidrs),
		Limits:       &lim,
		Created:      time.Now().UTC(),
		Nonce:        req.Nonce,
		Report:       req.Report,
		HostServices: hosts,
	}, list, nil
}

// hostServices gathers the host services of the named profiles; two
// that give one port different addresses are refused, not guessed
// between.
func (f *File) hostServices(profiles []string) ([]trial.HostService, error) {
	if f == nil {
		return nil, nil
	}
	var out []trial.HostService
	from := map[uint16]string{}
	for _, name := range profiles {
		hs, _, err := f.Profiles[name].hostServices(name)
		if err != nil {
			return nil, err
		}
		for _, h := range hs {
			i := slices.IndexFunc(out, func(o trial.HostService) bool { return o.Port == h.Port })
			switch {
			case i < 0:
				out = append(out, h)
				from[h.Port] = name
			case out[i].Address != h.Address:
				return nil, fmt.Errorf("profiles %q and %q give host service port %d different addresses (%s, %s): one Trial reaches one service per port", from[h.Port], name, h.Port, out[i].Address, h.Address)
			}
		}
	}
	return out, nil
}

// AllowEntries is an allowlist as a Trial's description keeps it.
func AllowEntries(l *allow.List) []trial.AllowEntry {
	var out []trial.AllowEntry
	for _, e := range l.Entries() {
		out = append(out, trial.AllowEntry{Entry: e.String(), RequireTLS: e.RequireTLS, Profile: e.Profile})
	}
	return out
}
