//go:build linux

package ocihook

import (
	"encoding/json"
	"os"
	"runtime"
	"strings"
	"testing"
)

// refuseAll is a rule that refuses the three key calls without conditions.
const refuseAll = `{"names":["keyctl","add_key","request_key"],"action":"SCMP_ACT_ERRNO","errnoRet":38}`

// The hook's judgement of a profile: the key calls are refused for every
// argument, or the container is refused, with each call's reason.
func TestKeyCallsLetThrough(t *testing.T) {
	for _, tc := range []struct {
		name, seccomp string
		want          []string // substrings of the reasons; none: refused
	}{
		{"no profile", ``, []string{"no seccomp profile"}},
		{"null profile", `null`, []string{"no seccomp profile"}},
		{"default allow, no rules", `{"defaultAction":"SCMP_ACT_ALLOW"}`, []string{"add_key: the default action SCMP_ACT_ALLOW", "keyctl:", "request_key:"}},
		{"no default action", `{"syscalls":[]}`, []string{`default action "" lets it run`}},
		{"default errno (Docker's)", `{"defaultAction":"SCMP_ACT_ERRNO","defaultErrnoRet":1,"syscalls":[{"names":["read","write"],"action":"SCMP_ACT_ALLOW"}]}`, nil},
		{"default kill", `{"defaultAction":"SCMP_ACT_KILL_PROCESS"}`, nil},
		{"errno for all three over default allow", `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[` + refuseAll + `]}`, nil},
		{"trap and kill rules", `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["keyctl"],"action":"SCMP_ACT_TRAP"},{"names":["add_key","request_key"],"action":"SCMP_ACT_KILL_THREAD"}]}`, nil},
		{"two of three", `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["keyctl","add_key"],"action":"SCMP_ACT_ERRNO"}]}`, []string{"request_key: the default action SCMP_ACT_ALLOW"}},
		{"allowed among others (podman's)", `{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","keyctl","add_key","request_key"],"action":"SCMP_ACT_ALLOW"}]}`, []string{"keyctl: rule 0 (SCMP_ACT_ALLOW) lets it run", "add_key:", "request_key:"}},
		{"allowed with conditions", `{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["keyctl"],"action":"SCMP_ACT_ALLOW","args":[{"index":0,"value":0,"op":"SCMP_CMP_EQ"}]}]}`, []string{"keyctl: rule 0 (SCMP_ACT_ALLOW) lets it run for some arguments"}},
		{"refused with conditions only, default allow", `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[` + refuseAll + `,{"names":["keyctl"],"action":"SCMP_ACT_ERRNO","args":[{"index":0,"value":11,"op":"SCMP_CMP_EQ"}]}]}`, nil},
		{"conditional refusal alone", `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["keyctl","add_key","request_key"],"action":"SCMP_ACT_ERRNO","args":[{"index":0,"value":11,"op":"SCMP_CMP_EQ"}]}]}`, []string{"keyctl: refused only for some arguments"}},
		{"conditional refusal, default refuses", `{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["keyctl","add_key","request_key"],"action":"SCMP_ACT_ERRNO","args":[{"index":0,"value":11,"op":"SCMP_CMP_EQ"}]}]}`, nil},
		{"ALLOW re-added after the refusal", `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[` + refuseAll + `,{"names":["keyctl"],"action":"SCMP_ACT_ALLOW"}]}`, []string{"keyctl: rule 1 (SCMP_ACT_ALLOW)"}},
		{"ALLOW before the refusal", `{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["add_key"],"action":"SCMP_ACT_ALLOW"},` + refuseAll + `]}`, []string{"add_key: rule 0 (SCMP_ACT_ALLOW)"}},
		{"log", `{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["keyctl"],"action":"SCMP_ACT_LOG"}]}`, []string{"keyctl: rule 0 (SCMP_ACT_LOG)"}},
		{"notify", `{"defaultAction":"SCMP_ACT_ERRNO","listenerPath":"/run/agent.sock","syscalls":[{"names":["request_key"],"action":"SCMP_ACT_NOTIFY"}]}`, []string{"request_key: rule 0 (SCMP_ACT_NOTIFY)"}},
		{"trace", `{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["keyctl"],"action":"SCMP_ACT_TRACE"}]}`, []string{"keyctl: rule 0 (SCMP_ACT_TRACE)"}},
		{"default log", `{"defaultAction":"SCMP_ACT_LOG"}`, []string{"keyctl: the default action SCMP_ACT_LOG"}},
		{"unknown default action", `{"defaultAction":"SCMP_ACT_ERRNO_PLEASE"}`, []string{"keyctl: the default action SCMP_ACT_ERRNO_PLEASE"}},
		{"unknown rule action", `{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["keyctl"],"action":"SCMP_ACT_MAYBE"}]}`, []string{"keyctl: rule 0 (SCMP_ACT_MAYBE)"}},
		{"lower-case action", `{"defaultAction":"scmp_act_errno"}`, []string{"keyctl: the default action scmp_act_errno"}},
		{"names of another case do not refuse", `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["KEYCTL","Add_Key","request_key "],"action":"SCMP_ACT_ERRNO"}]}`, []string{"keyctl:", "add_key:", "request_key:"}},
		{"every architecture of the host", `{"defaultAction":"SCMP_ACT_ALLOW","architectures":["SCMP_ARCH_X86_64","SCMP_ARCH_X86","SCMP_ARCH_X32","SCMP_ARCH_AARCH64","SCMP_ARCH_ARM"],"syscalls":[` + refuseAll + `]}`, nil},
		{"several architectures, allowed", `{"defaultAction":"SCMP_ACT_ALLOW","architectures":["SCMP_ARCH_X86_64","SCMP_ARCH_X86","SCMP_ARCH_X32"]}`, []string{"keyctl: the default action SCMP_ACT_ALLOW"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := `{"linux":{}}`
			if tc.seccomp != "" {
				doc = `{"linux":{"seccomp":` + tc.seccomp + `}}`
			}
			var c config
			if err := decodeStrict([]byte(doc), &c); err != nil {
				t.Fatal(err)
			}
			got := c.seccomp().keyCallsLetThrough()
			all := strings.Join(got, "\n")
			if len(tc.want) == 0 && len(got) > 0 {
				t.Fatalf("a profile that refuses the key calls is judged to let them through: %s", all)
			}
			if len(tc.want) > 0 && len(got) == 0 {
				t.Fatalf("a profile that lets the key calls through is judged to refuse them")
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("reasons %q lack %q", all, w)
				}
			}
		})
	}
}

// What the hook cannot read in a profile, it does not vouch for: a key
// it does not know, in the profile or in a rule, refuses the config; so
// does a key spelt otherwise than the spec spells it, which Go would
// read and crun would not (a "Seccomp" crun skips is no filter at all).
func TestSeccompParsedStrictly(t *testing.T) {
	for _, tc := range []struct{ name, doc, err string }{
		{"unknown key in the profile", `{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ERRNO","defaultActionOverride":"SCMP_ACT_ALLOW"}}}`, "unknown field"},
		{"unknown key in a rule", `{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["keyctl"],"action":"SCMP_ACT_ERRNO","includes":{"caps":["CAP_SYS_ADMIN"]}}]}}}`, "unknown field"},
		{"a rule's single name (Docker's file form)", `{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"name":"keyctl","action":"SCMP_ACT_ERRNO"}]}}}`, "unknown field"},
		{"errnoRet not a number", `{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["keyctl"],"action":"SCMP_ACT_ERRNO","errnoRet":"ENOSYS"}]}}}`, "cannot unmarshal"},
		{"seccomp spelt otherwise", `{"linux":{"Seccomp":{"defaultAction":"SCMP_ACT_ERRNO"}}}`, `key linux.Seccomp is spelt "seccomp"`},
		{"linux spelt otherwise", `{"LINUX":{"seccomp":{"defaultAction":"SCMP_ACT_ERRNO"}}}`, `key LINUX is spelt "linux"`},
		{"defaultAction spelt otherwise", `{"linux":{"seccomp":{"defaultaction":"SCMP_ACT_ERRNO"}}}`, `key linux.seccomp.defaultaction is spelt "defaultAction"`},
		{"a rule's action spelt otherwise", `{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["keyctl"],"ACTION":"SCMP_ACT_ERRNO"}]}}}`, `key linux.seccomp.syscalls.0.ACTION is spelt "action"`},
		{"namespaces spelt otherwise", `{"linux":{"Namespaces":[{"type":"pid"}]}}`, `is spelt "namespaces"`},
		{"seccomp spelt otherwise by an escape", `{"linux":{"\u0053eccomp":{"defaultAction":"SCMP_ACT_ERRNO"}}}`, `key linux.Seccomp is spelt "seccomp"`},
		{"a second rule's action spelt otherwise", `{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["read"],"action":"SCMP_ACT_ALLOW"},{"names":["keyctl"],"Action":"SCMP_ACT_ERRNO"}]}}}`, `key linux.seccomp.syscalls.1.Action is spelt "action"`},
		{"as the spec spells it", `{"linux":{"seccomp":{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["keyctl"],"action":"SCMP_ACT_ERRNO","args":[{"index":0,"value":1,"valueTwo":0,"op":"SCMP_CMP_EQ"}]}]},"namespaces":[{"type":"pid"}]},"unknownTopLevel":1}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(dir+"/config.json", []byte(tc.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := readConfig(dir)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("readConfig: %v, want %q", err, tc.err)
			}
		})
	}
}

// The profile install writes from podman's default is that profile with
// the key calls refused: judged refused by the hook once in OCI form,
// and every other rule kept.
func TestSeccompProfileFromBase(t *testing.T) {
	base := `{"defaultAction":"SCMP_ACT_ERRNO","defaultErrnoRet":38,"archMap":[{"architecture":"SCMP_ARCH_X86_64","subArchitectures":["SCMP_ARCH_X86"]}],
"syscalls":[{"names":["read","keyctl","write"],"action":"SCMP_ACT_ALLOW"},{"names":["add_key"],"action":"SCMP_ACT_ALLOW","includes":{"caps":["CAP_SYS_ADMIN"]}},
{"name":"request_key","action":"SCMP_ACT_ALLOW"},{"names":["personality"],"action":"SCMP_ACT_ALLOW","args":[{"index":0,"value":8,"valueTwo":0,"op":"SCMP_CMP_EQ"}]}]}`
	out, err := SeccompProfile([]byte(base), runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		DefaultErrnoRet json.Number `json:"defaultErrnoRet"`
		ArchMap         []any       `json:"archMap"`
		Syscalls        []struct {
			Names  []string `json:"names"`
			Action string   `json:"action"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	// socket, socketcall(SYS_SOCKET) and io_uring refused (RefuseVsock),
	// the key calls last.
	if p.DefaultErrnoRet != "38" || len(p.ArchMap) != 1 || len(p.Syscalls) != 6 ||
		strings.Join(p.Syscalls[0].Names, ",") != "read,write" || p.Syscalls[1].Names[0] != "personality" ||
		p.Syscalls[2].Names[0] != "socket" || p.Syscalls[3].Names[0] != "socketcall" ||
		strings.Join(p.Syscalls[4].Names, ",") != strings.Join(UringCalls, ",") ||
		strings.Join(p.Syscalls[5].Names, ",") != strings.Join(KeyCalls, ",") || p.Syscalls[5].Action != "SCMP_ACT_ERRNO" {
		t.Errorf("the profile from podman's:\n%s", out)
	}
	if _, err := SeccompProfile([]byte(`{"syscalls":{}}`), runtime.GOARCH); err == nil {
		t.Error("a base whose syscalls is not a list was taken")
	}
	if _, err := SeccompProfile([]byte(`{"defaultAction":"A","defaultAction":"B"}`), runtime.GOARCH); err == nil {
		t.Error("a base with a key twice was taken")
	}
	// Without a base: the least profile, valid OCI, judged refused.
	least, err := SeccompProfile(nil, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	var c config
	if err := decodeStrict([]byte(`{"linux":{"seccomp":`+string(least)+`}}`), &c); err != nil {
		t.Fatal(err)
	}
	if why := c.seccomp().keyCallsLetThrough(); len(why) > 0 {
		t.Errorf("the least profile lets the key calls through: %v\n%s", why, least)
	}
}
