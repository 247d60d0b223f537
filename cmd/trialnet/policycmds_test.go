//go:build linux

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/proxy"
)

// audit --from reads a saved decision log without an agent, keeps what
// reads past a torn last line, and --profile prints a loadable config.
func TestAuditFromFileProfile(t *testing.T) {
	var b strings.Builder
	for _, h := range []string{"a.pkg.example.test", "b.pkg.example.test", "c.pkg.example.test", "a.pkg.example.test"} {
		line, _ := json.Marshal(proxy.Event{Schema: proxy.EventSchema, Trial: "gone-1", Host: h, Port: 443, Decision: proxy.DecisionAllow,
			Reason: proxy.ReasonAllowed, Learning: true, WouldDeny: proxy.ReasonPolicyDenied})
		b.Write(append(line, '\n'))
	}
	line, _ := json.Marshal(proxy.Event{Schema: proxy.EventSchema, Trial: "gone-1", Host: "meta.example.test", Port: 80,
		Decision: proxy.DecisionDeny, Reason: proxy.ReasonAddressDenied, Learning: true, WouldDeny: proxy.ReasonPolicyDenied})
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
	f, err := proxy.ParseFile([]byte(out))
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
