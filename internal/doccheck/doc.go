// Package doccheck holds the tests that keep the repository's documents
// true to its code: the tests SECURITY.md names are where it says,
// docs/design.md's dependency graph is what the packages import, and no
// test helper is defined in two packages, as docs/design.md promises.
package doccheck
