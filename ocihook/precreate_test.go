//go:build linux

package ocihook

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/client"
)

type fakePreparer struct {
	got []client.ContainerPrepare
	err error
}

func (f *fakePreparer) PrepareContainer(_ context.Context, req client.ContainerPrepare) (client.PreparedContainer, error) {
	f.got = append(f.got, req)
	return client.PreparedContainer{}, f.err
}

// podman's precreate stage hands the hook the config, which it must give
// back unchanged; a profile container is prepared (no id: the config
// names none) and a refusal of the agent's refuses it; a state is told
// from a config by its status.
func TestPrecreate(t *testing.T) {
	cfg := `{"ociVersion":"1.0.0","process":{"args":["sh"]},"annotations":{"trialnet.io/profile":"claude"},"linux":{"cgroupsPath":"/trialnet/libpod-abc"}}`
	if !IsConfig([]byte(cfg)) || IsConfig([]byte(`{"ociVersion":"1.0.0","id":"x","status":"created","pid":1,"bundle":"/b"}`)) || IsConfig([]byte("nope")) {
		t.Fatal("IsConfig tells a config from a state wrongly")
	}
	var out bytes.Buffer
	p := &fakePreparer{}
	if err := Precreate(context.Background(), p, []byte(cfg), &out); err != nil {
		t.Fatal(err)
	}
	want := client.ContainerPrepare{Profile: "claude", CgroupsPath: "/trialnet/libpod-abc"}
	if out.String() != cfg || len(p.got) != 1 || p.got[0] != want {
		t.Errorf("out %q, prepared %+v", out.String(), p.got)
	}
	for name, in := range map[string]string{
		"joins a Trial": `{"ociVersion":"1.0.0","process":{},"annotations":{"trialnet.io/trial":"t"}}`,
		"no claim":      `{"ociVersion":"1.0.0","process":{}}`,
	} {
		p, out := &fakePreparer{}, bytes.Buffer{}
		if err := Precreate(context.Background(), p, []byte(in), &out); err != nil || out.String() != in || len(p.got) != 0 {
			t.Errorf("%s: %v, out %q, prepared %+v", name, err, out.String(), p.got)
		}
	}
	// crun creates run.oci.hooks.stdout's host file before the
	// createRuntime hook runs: a claiming container with it is refused
	// here, before the runtime; one that claims nothing is not judged.
	hooksOut := `{"ociVersion":"1.0.0","process":{},"annotations":{"trialnet.io/trial":"t","run.oci.hooks.stdout":"/etc/nologin"}}`
	p = &fakePreparer{}
	out.Reset()
	if err := Precreate(context.Background(), p, []byte(hooksOut), &out); err == nil || !strings.Contains(err.Error(), "its annotation run.oci.hooks.stdout: crun, as the host's root, creates") || out.Len() != 0 {
		t.Errorf("a Trial's container with run.oci.hooks.stdout: %v, out %q; want it refused", err, out.String())
	}
	unclaimed := `{"ociVersion":"1.0.0","process":{},"annotations":{"run.oci.hooks.stdout":"/var/log/h"}}`
	out.Reset()
	if err := Precreate(context.Background(), p, []byte(unclaimed), &out); err != nil || out.String() != unclaimed {
		t.Errorf("a container of no Trial with run.oci.hooks.stdout: %v, out %q", err, out.String())
	}
	p = &fakePreparer{err: errors.New("unknown profile")}
	out.Reset()
	if err := Precreate(context.Background(), p, []byte(cfg), &out); err == nil || !strings.Contains(err.Error(), "unknown profile") || out.Len() != 0 {
		t.Errorf("an agent that refused: %v, out %q", err, out.String())
	}
	entries, err := Entries("/usr/bin/trialnet", []string{"trialnet", "oci-hook"})
	var entry []byte
	if err == nil {
		entry, err = WithPrecreate(entries[HookFile])
	}
	if err != nil || !strings.Contains(string(entry), `"stages": [
    "precreate",
    "createRuntime"
  ]`) {
		t.Errorf("the entry with precreate: %v\n%s", err, entry)
	}
	dup := `{"ociVersion":"1.0.0","process":{},"annotations":{"trialnet.io/profile":"a","trialnet.io/profile":"b"}}`
	if err := Precreate(context.Background(), &fakePreparer{}, []byte(dup), &out); err == nil {
		t.Error("a config with a key twice passed")
	}
	// Go's decoder matches keys without regard to case, crun does not:
	// a prepare read from keys the runtime skips would be for a profile
	// or a cgroup the container never has.
	for name, in := range map[string]string{
		"Annotations": `{"ociVersion":"1.0.0","process":{},"Annotations":{"trialnet.io/profile":"claude"},"linux":{"cgroupsPath":"/trialnet/libpod-abc"}}`,
		"Linux":       `{"ociVersion":"1.0.0","process":{},"annotations":{"trialnet.io/profile":"claude"},"Linux":{"cgroupsPath":"/trialnet/libpod-abc"}}`,
		"CgroupsPath": `{"ociVersion":"1.0.0","process":{},"annotations":{"trialnet.io/profile":"claude"},"linux":{"CgroupsPath":"/trialnet/libpod-abc"}}`,
	} {
		p, out := &fakePreparer{}, bytes.Buffer{}
		err := Precreate(context.Background(), p, []byte(in), &out)
		if err == nil || !strings.Contains(err.Error(), "spelt") || len(p.got) != 0 || out.Len() != 0 {
			t.Errorf("a config with key %s: %v, prepared %+v, out %q; want it refused, nothing prepared", name, err, p.got, out.String())
		}
	}
}
