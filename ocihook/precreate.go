//go:build linux

package ocihook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/trialnet/trialnet/internal/agentwire"
)

// Preparer is what the precreate stage asks of the agent.
type Preparer interface {
	PrepareContainer(ctx context.Context, req agentwire.ContainerPrepare) (agentwire.PreparedContainer, error)
}

// IsConfig reports whether in, a hook's standard input, is a runtime
// config (podman's precreate stage, which runs before the runtime) and
// not a state (every OCI stage): a state has a status, a config none.
func IsConfig(in []byte) bool {
	var top map[string]json.RawMessage
	if json.Unmarshal(in, &top) != nil {
		return false
	}
	_, status := top["status"]
	_, process := top["process"]
	return !status && process
}

// Precreate is the hook at podman's precreate stage: before the runtime
// creates a container annotated trialnet.io/profile=NAME, the agent
// prepares its cgroup (agentwire.ContainerPrepare, with no container id:
// podman's config names none, and the hook's own process ends at once,
// so the entry waits for the container whose init the runtime puts in
// that cgroup, bounded in time). The config goes to out unchanged, as
// podman takes the stage's output for the config. Any failure refuses
// the container, whose runtime then never runs.
func Precreate(ctx context.Context, p Preparer, in []byte, out io.Writer) error {
	if int64(len(in)) > maxConfig {
		return fmt.Errorf("the config on standard input is larger than %d bytes", maxConfig)
	}
	var cfg struct {
		Annotations map[string]string `json:"annotations"`
		Linux       struct {
			CgroupsPath string `json:"cgroupsPath"`
		} `json:"linux"`
	}
	// As createRuntime reads config.json (readConfig): a key the runtime
	// would not read as spelt would leave a prepare for a cgroup, or a
	// profile, that the container never has.
	if err := decodeSpec(in, &cfg); err != nil {
		return fmt.Errorf("the config on standard input: %w", err)
	}
	// crun acts on some annotations before the createRuntime hook runs
	// (run.oci.hooks.stdout: it creates the host file first): refused
	// here, a claiming container's runtime never runs.
	if cl, err := claimOf(nil, cfg.Annotations); err != nil || cl.any() {
		if why := (&config{Annotations: cfg.Annotations}).runtimeAnnotationRefusals(); len(why) > 0 {
			return fmt.Errorf("refused container: %s", strings.Join(why, "; "))
		}
	}
	if profile := cfg.Annotations[AnnotationProfile]; profile != "" && cfg.Annotations[AnnotationTrial] == "" {
		req := agentwire.ContainerPrepare{Profile: profile, CgroupsPath: cfg.Linux.CgroupsPath}
		if _, err := p.PrepareContainer(ctx, req); err != nil {
			return fmt.Errorf("refused container: the agent could not prepare a Trial from profile %s for it: %w", profile, err)
		}
	}
	_, err := out.Write(in)
	return err
}
