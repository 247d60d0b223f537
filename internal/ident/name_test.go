package ident

import (
	"regexp"
	"strings"
	"testing"
)

var re = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

func TestValidIsTheRegexp(t *testing.T) {
	alphabet := []string{"a", "z", "0", "9", "-", "_", "A", ".", "/", " ", "\n", "é", "\x00"}
	var cases []string
	// Every string of up to three characters from the alphabet.
	var grow func(prefix string, n int)
	grow = func(prefix string, n int) {
		cases = append(cases, prefix)
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			grow(prefix+c, n-1)
		}
	}
	grow("", 3)
	for _, n := range []int{62, 63, 64, 100} {
		cases = append(cases, strings.Repeat("a", n), "a"+strings.Repeat("-", n-1), strings.Repeat("a", n-1)+"\n")
	}
	for _, s := range cases {
		if got, want := Valid(s), re.MatchString(s); got != want {
			t.Errorf("Valid(%q) = %v, the regexp says %v", s, got, want)
		}
	}
}
