// Package doccheck holds the tests that keep the repository true to
// itself where no compiler looks: the tests SECURITY.md names are where
// it says, docs/design.md's dependency graph is what the packages import,
// the README stays a first screen (at most 200 lines), and no test helper
// is defined in two packages.
package doccheck
