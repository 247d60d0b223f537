//go:build linux && !amd64

package main

func keyctlI386() error { return errSkip("no i386 entry on this architecture") }

func vsockI386() error { return errSkip("no i386 entry on this architecture") }
