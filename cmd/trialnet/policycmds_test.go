//go:build linux

package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/trialnet/trialnet/client"
	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/record"
)

// audit --from reads a saved decision log without an agent, keeps what
// reads past a torn last line, and --profile prints a loadable config.
func TestAuditFromFileProfile(t *testing.T) {
	var b strings.Builder
	for _, h := range []string{"a.pkg.example.test", "b.pkg.example.test", "c.pkg.example.test", "a.pkg.example.test"} {
		line, _ := json.Marshal(record.Event{Schema: record.EventSchema, Trial: "gone-1", Host: h, Port: 443, Decision: record.DecisionAllow,
			Reason: record.ReasonAllowed, Learning: true, WouldDeny: record.ReasonPolicyDenied})
		b.Write(append(line, '\n'))
	}
	line, _ := json.Marshal(record.Event{Schema: record.EventSchema, Trial: "gone-1", Host: "meta.example.test", Port: 80,
		Decision: record.DecisionDeny, Reason: record.ReasonAddressDenied, Learning: true, WouldDeny: record.ReasonPolicyDenied})
	b.Write(append(line, '\n'))
	b.WriteString(`{"schema":1,"trial":"gone-1","ho`) // torn by a crash
	path := filepath.Join(t.TempDir(), "decisions.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := trialnet("audit", "--from", path, "--profile", "pkgs")
	if code != exitOK || !strings.Contains(errOut, "warning") {
		t.Fatalf("audit --from --profile: exit %d, %q", code, errOut)
	}
	f, err := config.ParseFile([]byte(out))
	if err != nil {
		t.Fatalf("profile does not load: %v\n%s", err, out)
	}
	l, err := f.Allowlist([]string{"pkgs"}, nil, false)
	if err != nil {
		t.Fatalf("the profile's allowlist: %v", err)
	}
	if len(l.Entries()) != 3 || strings.Contains(out, "meta.") || !strings.Contains(out, `"a.pkg.example.test:443" # 0 allowed, 2 would_deny`) ||
		!strings.Contains(out, `# offered: - "*.pkg.example.test:443"`) {
		t.Fatalf("profile:\n%s", out)
	}
	if code, _, _ := trialnet("audit", "--from", path, "--trial", "x"); code != exitUsage {
		t.Fatalf("--from with --trial: exit %d, want usage", code)
	}
}

// allow, deny and destroy take their flags after their arguments too
// (deny --trial T1 api.example.test:443 --cut); after "--" a word that
// looks like a flag is an entry, refused as one, never a flag applied.
func TestPolicyCommandsFlagsAfterArguments(t *testing.T) {
	type call struct {
		method, path string
		change       client.AllowChange
	}
	var mu sync.Mutex
	var calls []call
	seen := func() []call {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := call{method: r.Method, path: r.URL.Path}
		_ = json.NewDecoder(r.Body).Decode(&c.change)
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
		if r.Method == http.MethodPatch {
			_ = json.NewEncoder(w).Encode(client.AllowChanged{Trial: client.TrialInfo{Spec: trialspec.Spec{ID: "t1"}}})
		} else {
			_ = json.NewEncoder(w).Encode(client.Stats{Trial: "t1"})
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	for _, tc := range []struct {
		args []string
		want call
	}{
		{[]string{"deny", "--trial", "t1", "api.example.test:443", "--cut"},
			call{"PATCH", "/v1/trials/t1/allow", client.AllowChange{Remove: []string{"api.example.test:443"}, Cut: true}}},
		{[]string{"deny", "api.example.test:443", "--trial", "t1", "b.example.test:443"},
			call{"PATCH", "/v1/trials/t1/allow", client.AllowChange{Remove: []string{"api.example.test:443", "b.example.test:443"}}}},
		{[]string{"allow", "--trial", "t1", "api.example.test:443", "--require-tls", "-j"},
			call{"PATCH", "/v1/trials/t1/allow", client.AllowChange{Add: []string{"api.example.test:443"}, RequireTLS: true}}},
		{[]string{"destroy", "t1", "-j"}, call{"DELETE", "/v1/trials/t1", client.AllowChange{}}},
	} {
		before := len(seen())
		code, out, errOut := trialnet(append([]string{tc.args[0], "--socket", sock}, tc.args[1:]...)...)
		if got := seen()[before:]; code != exitOK || len(got) != 1 || !reflect.DeepEqual(got[0], tc.want) {
			t.Errorf("%q: exit %d, %q %q; agent saw %+v, want %+v", tc.args, code, out, errOut, got, tc.want)
		}
		if slices.Contains(tc.args, "-j") && !json.Valid([]byte(out)) {
			t.Errorf("%q: -j after the arguments printed %q", tc.args, out)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"deny", "--trial", "t1", "--", "api.example.test:443", "--cut"}, `"--cut"`},
		{[]string{"allow", "--trial", "t1", "api.example.test:443", "--cut"}, "flag provided but not defined: -cut"},
		{[]string{"destroy", "t1", "t2"}, "exactly one"},
	} {
		before := len(seen())
		code, out, errOut := trialnet(append([]string{tc.args[0], "--socket", sock}, tc.args[1:]...)...)
		if got := seen()[before:]; code != exitUsage || !strings.Contains(out+errOut, tc.want) || len(got) != 0 {
			t.Errorf("%q: exit %d, %q %q, agent saw %+v; want a usage error with %q and no request", tc.args, code, out, errOut, got, tc.want)
		}
	}
}
