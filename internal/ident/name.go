// Package ident checks the names trialnet turns into file and cgroup names
// (Trial ids, profile names).
package ident

// Valid reports whether s is 1-63 characters from a-z, 0-9, '-' and '_',
// starting with a letter or digit: the regular expression
// ^[a-z0-9][a-z0-9_-]{0,62}$, written out because compiling that at
// package init took ~0.3 ms of every start of the binary, the Trial's
// re-executed helpers included.
func Valid(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '-' || c == '_') && i > 0:
		default:
			return false
		}
	}
	return true
}
