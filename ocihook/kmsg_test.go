//go:build linux

package ocihook

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestKmsgRecord(t *testing.T) {
	long := strings.Repeat("é", kmsgMax)
	for _, tc := range []struct{ msg, want string }{
		{"refused container c1: it is on the host's network", "<3>trialnet oci-hook: refused container c1: it is on the host's network\n"},
		// A newline in an annotation key must not make a second record
		// that reads as the kernel's; nor may ESC, DEL or a C1 control
		// reach a console.
		{"annotations trialnet.io/x\n<0>forged are not known", "<3>trialnet oci-hook: annotations trialnet.io/x?<0>forged are not known\n"},
		{"a\r\x1b[2Jb\x7fc\u0085d\u2028e", "<3>trialnet oci-hook: a??[2Jb?c?d\u2028e\n"},
		{"bad \xff\xfe utf-8", "<3>trialnet oci-hook: bad ?? utf-8\n"},
	} {
		if got := string(KmsgRecord(tc.msg)); got != tc.want {
			t.Errorf("KmsgRecord(%q) = %q, want %q", tc.msg, got, tc.want)
		}
	}
	for _, msg := range []string{long, "x" + long, strings.Repeat("x", kmsgMax-len(kmsgPrefix)-1)} {
		got := KmsgRecord(msg)
		if len(got) > kmsgMax || !utf8.Valid(got) || strings.Count(string(got), "\n") != 1 || !strings.HasSuffix(string(got), "\n") {
			t.Errorf("a message of %d bytes: a record of %d bytes (bound %d), valid UTF-8 %v, %q...",
				len(msg), len(got), kmsgMax, utf8.Valid(got), got[:40])
		}
	}
	if got := KmsgRecord(strings.Repeat("x", kmsgMax-len(kmsgPrefix)-1)); strings.HasSuffix(string(got), "...\n") {
		t.Error("a message that fits was cut")
	}
	if got := KmsgRecord(long); !strings.HasSuffix(string(got), "...\n") {
		t.Error("a cut message does not say so")
	}
}
