//go:build linux

package sandbox

import (
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/netns"
)

// BenchmarkCheckRoot: the chroot check as CheckRoot makes it, from the
// look taken before the runtime started (rootcheck.c), against the same
// look on a thread made for it and discarded (netns.RootIsNamespaceRoot),
// which is what CheckRoot does where the early look cannot be used.
func BenchmarkCheckRoot(b *testing.B) {
	privtest.Require(b)
	if _, ok := earlyRoot(); !ok {
		b.Skip("no look before the runtime in this process (not root, or a CGO_ENABLED=0 build)")
	}
	b.Run("early", func(b *testing.B) {
		for b.Loop() {
			if err := CheckRoot(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("thread", func(b *testing.B) {
		for b.Loop() {
			if same, err := netns.RootIsNamespaceRoot(); err != nil || !same {
				b.Fatal(same, err)
			}
		}
	})
}
