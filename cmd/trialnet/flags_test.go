//go:build linux

package main

import (
	"github.com/trialnet/trialnet/internal/cli"

	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Flags are taken wherever they stand among the arguments, up to "--";
// nothing changes kind: a flag's value is taken whatever it looks like,
// and nothing after "--" is a flag.
func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		trial string
		cut   bool
		allow []string
		pos   []string
		fails bool
	}{
		{args: []string{"a.example.test:443", "--cut"}, cut: true, pos: []string{"a.example.test:443"}},
		{args: []string{"a.example.test:443", "--trial", "t1", "b.example.test:443", "-cut"}, trial: "t1", cut: true, pos: []string{"a.example.test:443", "b.example.test:443"}},
		{args: []string{"a.example.test:443", "--trial=t1", "--cut=false"}, trial: "t1", pos: []string{"a.example.test:443"}},
		{args: []string{"--allow", "x", "a", "--allow", "y"}, allow: []string{"x", "y"}, pos: []string{"a"}},
		{args: []string{"--trial", "--cut", "a"}, trial: "--cut", pos: []string{"a"}},
		{args: []string{"--trial", "--", "a", "--cut"}, trial: "--", cut: true, pos: []string{"a"}},
		{args: []string{"a", "--", "--cut", "-j"}, pos: []string{"a", "--cut", "-j"}},
		{args: []string{"--cut", "--", "--", "a"}, cut: true, pos: []string{"--", "a"}},
		{args: []string{"-", "a"}, pos: []string{"-", "a"}},
		{args: []string{"a", "--trial"}, fails: true},
		{args: []string{"a", "--bogus"}, fails: true},
		{args: []string{"a", "---cut"}, fails: true},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		trial := fs.String("trial", "", "")
		cut := fs.Bool("cut", false, "")
		var allow stringList
		fs.Var(&allow, "allow", "")
		err := cli.ParseInterspersed(fs, tc.args)
		if tc.fails {
			if err == nil {
				t.Errorf("%q: parsed, want an error", tc.args)
			}
			continue
		}
		if err != nil || *trial != tc.trial || *cut != tc.cut || !slices.Equal(allow, tc.allow) || !slices.Equal(fs.Args(), tc.pos) {
			t.Errorf("%q: trial %q cut %v allow %q args %q err %v; want %q %v %q %q", tc.args, *trial, *cut, allow, fs.Args(), err, tc.trial, tc.cut, tc.allow, tc.pos)
		}
	}
}

// A command that takes no arguments refuses a stray one, even with flags
// after it, instead of dropping it (and, before, the flags after it).
// Each points at an agent and a config that do not exist, so that even a
// broken parse cannot reach the host's agent or pins.
func TestFlagsOnlyCommandsRefuseArguments(t *testing.T) {
	dir := t.TempDir()
	none, missing := filepath.Join(dir, "none.sock"), filepath.Join(dir, "missing.yaml")
	for _, args := range [][]string{
		{"create", "--socket", none, "--id", "x", "--allow", "a.example.test:443", "b.example.test:443", "--strict"},
		{"list", "--socket", none, "extra", "-j"},
		{"stats", "--socket", none, "--trial", "x", "extra"},
		{"audit", "--socket", none, "--trial", "x", "extra"},
		{"reload", "--socket", none, "extra", "--reprofile"},
		{"doctor", "extra"},
		{"health", "--socket", none, "extra", "--live"},
		{"uninstall", "--config", missing, "extra", "--force"},
		{"agent", "--config", missing, "--socket", none, "extra"},
		{"proxy", "--config", missing, "--allow", "a.example.test:443", "extra"},
	} {
		code, out, errOut := trialnet(args...)
		if code != exitUsage || !strings.Contains(errOut, "unexpected argument") || !strings.Contains(errOut, "Usage: trialnet "+args[0]) {
			t.Errorf("%q: exit %d, %q %q; want a usage error naming the argument", args, code, out, errOut)
		}
	}
}

// Each flag's help shows one default: the flag package's "(default X)"
// is not printed beside a text that describes the real default.
func TestHelpShowsOneDefault(t *testing.T) {
	flagLine := regexp.MustCompile(`^  -(\S+)`)
	for _, c := range commands {
		if c.name == "nri" { // an exec of trialnet-nri, whose own test checks its help
			continue
		}
		code, _, help := trialnet(c.name, "-h")
		if code != exitUsage || !strings.Contains(help, "Usage: trialnet "+c.name) {
			t.Fatalf("%s -h: exit %d\n%s", c.name, code, help)
		}
		var name, text string
		check := func() {
			if n := strings.Count(text, "default"); n > 1 {
				t.Errorf("%s -%s shows %d defaults:%s", c.name, name, n, text)
			}
		}
		for _, l := range strings.Split(help, "\n") {
			if m := flagLine.FindStringSubmatch(l); m != nil {
				check()
				name, text = m[1], ""
			}
			text += "\n" + l
		}
		check()
	}
	if _, _, help := trialnet("run", "-h"); !strings.Contains(help, "-uid N\n") || !strings.Contains(help, "-gid N\n") {
		t.Errorf("run -h: --uid and --gid shown without their N:\n%s", help)
	}
}

// --max-procs takes 1 to the kernel's PID_MAX_LIMIT; anything else is a
// usage error naming the flag and the range, before any agent is asked.
func TestMaxProcsFlag(t *testing.T) {
	none := filepath.Join(t.TempDir(), "none.sock")
	for _, v := range []string{"0", "-1", "4194305", "99999999999999999999", "lots"} {
		for _, args := range [][]string{
			{"create", "--socket", none, "--max-procs", v},
			{"exec", "--socket", none, "--trial", "x", "--uid", "65534", "--max-procs", v, "--", "true"},
			{"run", "--socket", none, "--uid", "65534", "--max-procs", v, "--", "true"},
		} {
			code, _, errOut := trialnet(args...)
			want := "give 1 to 4194304"
			if v == "lots" {
				want = "not a number"
			}
			if code != exitUsage || !strings.Contains(errOut, "-max-procs") || !strings.Contains(errOut, want) {
				t.Errorf("%q: exit %d, %q; want a usage error saying %q", args, code, errOut, want)
			}
		}
	}
	var f procsFlag
	if err := f.Set("4194304"); err != nil || f != 4194304 {
		t.Errorf("Set(4194304): %v, %d", err, f)
	}
}

// run notes the arguments that name something in the host's /tmp,
// /var/tmp or /dev/shm, which a Trial has its own of.
func TestHostOwnDirPaths(t *testing.T) {
	dir := t.TempDir() // under the host's /tmp
	file := filepath.Join(dir, "script.py")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := hostOwnDirPaths([]string{"python3", file, "--out=" + dir, "/tmp", "/usr/bin/env", "/tmp/trialnet-no-such-file", "relative/tmp"})
	if want := []string{file, dir}; !slices.Equal(got, want) {
		t.Errorf("hostOwnDirPaths: %q, want %q", got, want)
	}
}

// A negative drain timeout is refused before the agent touches anything:
// no socket, no keeper started.
func TestAgentRefusesNegativeDrainTimeout(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	code, _, errOut := trialnet("agent", "--config", filepath.Join(dir, "missing.yaml"), "--socket", sock, "--drain-timeout", "-1s")
	if code != exitUsage || !strings.Contains(errOut, "--drain-timeout must be positive") {
		t.Errorf("agent --drain-timeout -1s: exit %d, %q; want a usage error", code, errOut)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
}

// --no-transparent reaches the request (run's; create's is built the
// same way from its flag) and is offered by both; without it the request
// leaves transparent mode on.
func TestNoTransparentFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"--no-transparent", "--", "true"}, true},
		{[]string{"--", "true"}, false},
	} {
		fs := cli.NewFlags("run", runUsage, "", io.Discard)
		var f runFlags
		f.register(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		spec, _, err := f.spec(fs, "x", 65534, 65534, io.Discard)
		if err != nil || spec.Create.NoTransparent != c.want {
			t.Errorf("run %q: NoTransparent %v (%v), want %v", c.args, spec.Create.NoTransparent, err, c.want)
		}
	}
	for _, cmd := range []string{"create", "run"} {
		if _, _, help := trialnet(cmd, "-h"); !strings.Contains(help, "[--no-transparent]") || !strings.Contains(help, "-no-transparent\n") {
			t.Errorf("%s -h does not offer --no-transparent:\n%s", cmd, help)
		}
	}
}
