//go:build linux

package clients

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/sandbox"
	"github.com/trialnet/trialnet/test/ctr"
)

// The real-client suite inside a Debian container in a Trial: every case
// of TestPrivilegedClients and TestPrivilegedTransparentClients, with the
// same checks, each command run in a container of one runtime (podman
// with crun where it runs, else a runc bundle) that joins the case's
// Trial as docs/containers.md says, from a root that binds the host's
// Debian /usr and /etc read-only.
func TestPrivilegedContainerClients(t *testing.T) {
	privtest.Require(t)
	// A world each, as the two tests have: each ssh case starts its sshd.
	world := func(t *testing.T) *world {
		w := newAgentWorld(t)
		w.ctr = ctr.New(t, w.sock).Runners(t)[0]
		t.Logf("the clients run in containers of %s", w.ctr.Name())
		return w
	}
	t.Run("proxy", func(t *testing.T) {
		w := world(t)
		eachClient(t, append(clients, sshClient(w)), true, func(t *testing.T, c client) { exercise(t, w, c) })
	})
	t.Run("transparent", func(t *testing.T) {
		w := world(t)
		eachClient(t, transparentClients(w), false, func(t *testing.T, c client) { exerciseTransparent(t, w, c) })
	})
}

// runInContainer runs c, as tc.run would through the launch path, in a
// container of tc.ctr in tc's Trial: the world's directory (homes, the
// CA, the git root) bound writable, a command or PATH directory outside
// /usr (a pinned Node, a rustup toolchain, transprobe) read-only, and in
// a transparent Trial its resolv.conf, naming the stub.
func (tc *trial) runInContainer(ctx context.Context, c sandbox.Command, out *bytes.Buffer) (int, string) {
	tc.t.Helper()
	cc := ctr.Cmd{Trial: tc.info, Args: c.Args, Env: c.Env, UID: int(c.UID), GID: int(c.GID), Dir: c.Dir,
		Binds: []string{tc.w.dir}, Stdout: out, ErrOut: out}
	if c.ProxyURL != "" {
		cc.Env = append(slices.Clone(c.Env), ctr.ProxyEnv(tc.info)...)
	}
	dirs := []string{filepath.Dir(c.Args[0])}
	for _, kv := range c.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			dirs = append(dirs, filepath.SplitList(v)...)
		}
	}
	for _, d := range dirs {
		if !filepath.IsAbs(d) || under(d, "/usr") || under(d, tc.w.dir) || d == "/bin" || d == "/sbin" {
			continue
		}
		if filepath.Base(d) == "bin" {
			d = filepath.Dir(d) // the toolchain's top: its lib/ too
		}
		if _, err := os.Stat(d); err == nil && !slices.Contains(cc.ReadOnly, d) {
			cc.ReadOnly = append(cc.ReadOnly, d)
		}
	}
	if tc.info.Transparent {
		cc.ResolvConf = filepath.Join(tc.w.dir, "resolv.conf")
		if err := os.WriteFile(cc.ResolvConf, []byte(trialspec.ResolvConf), 0o644); err != nil {
			tc.t.Fatal(err)
		}
	}
	code, err := tc.ctr.Run(ctx, cc)
	if err != nil {
		tc.t.Fatalf("%s in a container: %v\n%s", c.Args[0], err, out.String())
	}
	return code, out.String()
}

func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}
