//go:build linux

package containers

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/test/ctr"
	"github.com/trialnet/trialnet/trial"
)

// BenchmarkContainerStart puts a runc container's whole run (runc run of
// a bundle whose process exits at once, then runc delete) side by side
// in one run, alternating: with no Trial and no hook; joining a live
// Trial by id (the hook at createRuntime and poststop: look-up, checks,
// record); with a Trial made around it from a profile (the hook at
// createRuntime only, as trialnet oci-hook install's entries run it:
// the Trial adopted there, destroyed with its receipt when the agent
// sees the container's init exit); and the same with the hook at
// poststop too, as a hand-written bundle may run it. Beside them, a
// Trial's create+destroy alone through the same agent, which is what a
// profile container's extra time is to be compared with. The agent
// runs in this process; the hook is trialnet-oci, started by runc, as
// the installed entries run it, and in profile-trialnet trialnet itself,
// as entries written before trialnet-oci run it. What a user faces
// without the annotation is the CLI's Trial: cli-create-destroy is
// trialnet create --profile then trialnet destroy, each a process of
// its own, and cli-trial the same around the container joined by id,
// so that a profile container's extra time can be read against a
// Trial's create+destroy as a user pays it, beside the in-agent one;
// cli-create is the create of that pair alone. TRIALNET_BASELINE_BIN
// names another build's trialnet: its trialnet-oci is then the hook of
// a profile-baseline row, run beside the profile row in each round (in
// turn first and second), so that a change to the hook is measured
// against the build before it under the same load.
func BenchmarkContainerStart(b *testing.B) {
	requireRuntimes(b, false, "runc")
	w := newContainerTrial(b, "ctr-bench")
	w.t.Cleanup(func() { ctr.RemoveV1Cgroups(w.cgroup) })
	state := b.TempDir()
	plain := testenv.PlainCgroup(b, "ctr-bench")
	mount := strings.TrimSuffix(w.info.Cgroup, w.cgroup)
	b.Cleanup(func() { ctr.RemoveV1Cgroups(strings.TrimPrefix(plain, mount)) })
	both := []string{"createRuntime", "poststop"}
	run := func(name string, o bundleOpts) error {
		bundle := w.bundleWith(name, o)
		out, err := exec.Command("runc", "--root", state, "run", "--bundle", bundle, name).CombinedOutput()
		_ = exec.Command("runc", "--root", state, "delete", "--force", name).Run()
		if err != nil || !strings.Contains(string(out), started) {
			return fmt.Errorf("%s: %v\n%s", name, err, out)
		}
		return nil
	}
	script := "echo " + started
	baseline := os.Getenv("TRIALNET_BASELINE_BIN")
	var cliCreate []time.Duration // the create alone, of cli-create-destroy
	type kind struct {
		name string
		once func(i int) error
		lat  []time.Duration
	}
	kinds := []kind{
		{name: "plain", once: func(i int) error {
			n := fmt.Sprintf("plain-%d", i)
			return run(n, bundleOpts{cgroupsPath: strings.TrimPrefix(plain, mount) + "/" + n, script: script})
		}},
		{name: "by-id", once: func(i int) error {
			n := fmt.Sprintf("byid-%d", i)
			return run(n, bundleOpts{netns: w.info.Netns, cgroupsPath: w.cgroup + "/" + n, script: script, hooks: both,
				annotations: map[string]string{"trialnet.io/trial": w.info.ID}})
		}},
		{name: "profile", once: func(i int) error {
			n := fmt.Sprintf("prof-%d", i)
			return run(n, w.profileBundle(n, script, "createRuntime"))
		}},
		{name: "profile-trialnet", once: func(i int) error {
			n := fmt.Sprintf("proftn-%d", i)
			o := w.profileBundle(n, script, "createRuntime")
			o.hookBin = w.bin
			return run(n, o)
		}},
		{name: "profile-baseline", once: func(i int) error {
			n := fmt.Sprintf("profbase-%d", i)
			o := w.profileBundle(n, script, "createRuntime")
			o.hookBin = filepath.Join(filepath.Dir(baseline), "trialnet-oci")
			return run(n, o)
		}},
		// A hand-written bundle's hook at both stages: what the installed
		// entries' poststop cut saves, in the same run.
		{name: "profile-poststop", once: func(i int) error {
			n := fmt.Sprintf("profpost-%d", i)
			return run(n, w.profileBundle(n, script, both...))
		}},
		{name: "cli-create-destroy", once: func(i int) error {
			start := time.Now()
			info, err := w.cliCreate(fmt.Sprintf("clicd-%d", i))
			cliCreate = append(cliCreate, time.Since(start))
			if err == nil {
				err = w.cliDestroy(info.ID)
			}
			return err
		}},
		{name: "cli-trial", once: func(i int) error {
			info, err := w.cliCreate(fmt.Sprintf("clitr-%d", i))
			if err != nil {
				return err
			}
			n := fmt.Sprintf("clictr-%d", i)
			err = run(n, bundleOpts{netns: info.Netns, cgroupsPath: strings.TrimPrefix(info.Cgroup, mount) + "/" + n, script: script, hooks: both,
				annotations: map[string]string{"trialnet.io/trial": info.ID}})
			if derr := w.cliDestroy(info.ID); err == nil {
				err = derr
			}
			return err
		}},
		{name: "create-destroy", once: func(i int) error {
			info, err := w.agent.Create(context.Background(), trial.Request{ID: fmt.Sprintf("cd-%d", i), Profiles: []string{profile}})
			if err == nil {
				_, err = w.agent.Destroy(context.Background(), info.ID)
			}
			return err
		}},
	}
	if baseline == "" {
		kinds = slices.DeleteFunc(kinds, func(k kind) bool { return k.name == "profile-baseline" })
	}
	prof := slices.IndexFunc(kinds, func(k kind) bool { return k.name == "profile" })
	b.ResetTimer()
	for i := range b.N {
		for k := range kinds {
			if baseline != "" && i%2 == 1 && (k == prof || k == prof+1) {
				k = 2*prof + 1 - k // the baseline's hook first in odd rounds
			}
			start := time.Now()
			if err := kinds[k].once(i); err != nil {
				b.Fatal(err)
			}
			kinds[k].lat = append(kinds[k].lat, time.Since(start))
		}
	}
	b.StopTimer()
	// Each round's profile container less the plain one of the same
	// round: the load of a shared host drifts over a run, and moves the
	// two rows' p50s apart by more than a hook's cost.
	byName := map[string][]time.Duration{}
	for _, k := range kinds {
		byName[k.name] = k.lat
	}
	var extra []time.Duration
	for i, plain := range byName["plain"] {
		extra = append(extra, byName["profile"][i]-plain)
	}
	slices.Sort(extra)
	p50 := map[string]float64{}
	for _, k := range kinds {
		slices.Sort(k.lat)
		p50[k.name] = float64(k.lat[len(k.lat)/2].Microseconds()) / 1000
		b.ReportMetric(p50[k.name], k.name+"-p50-ms")
		b.ReportMetric(float64(k.lat[len(k.lat)*99/100].Microseconds())/1000, k.name+"-p99-ms")
	}
	b.ReportMetric(p50["by-id"]/p50["plain"], "by-id/plain")
	b.ReportMetric(p50["profile"]/p50["plain"], "profile/plain")
	b.ReportMetric(p50["profile"]/p50["profile-trialnet"], "profile/profile-trialnet")
	b.ReportMetric(p50["profile-poststop"]/p50["plain"], "profile-poststop/plain")
	// What a profile adds over a plain container, in Trial create+destroys:
	// the agent's own, and the CLI's as a user runs them.
	b.ReportMetric((p50["profile"]-p50["plain"])/p50["create-destroy"], "profile-extra/create-destroy")
	b.ReportMetric((p50["profile"]-p50["plain"])/p50["cli-create-destroy"], "profile-extra/cli-create-destroy")
	b.ReportMetric(p50["profile"]/p50["cli-trial"], "profile/cli-trial")
	slices.Sort(cliCreate)
	create := float64(cliCreate[len(cliCreate)/2].Microseconds()) / 1000
	b.ReportMetric(create, "cli-create-p50-ms")
	b.ReportMetric((p50["profile"]-p50["plain"])/create, "profile-extra/cli-create")
	paired := float64(extra[len(extra)/2].Microseconds()) / 1000
	b.ReportMetric(paired, "profile-extra-paired-p50-ms")
	b.ReportMetric(paired/create, "profile-extra-paired/cli-create")
	if baseline != "" {
		b.ReportMetric((p50["profile"]-p50["plain"])/(p50["profile-baseline"]-p50["plain"]), "profile-extra/baseline-extra")
		var diff []time.Duration
		for i, base := range byName["profile-baseline"] {
			diff = append(diff, byName["profile"][i]-base)
		}
		slices.Sort(diff)
		b.ReportMetric(float64(diff[len(diff)/2].Microseconds())/1000, "profile-minus-baseline-paired-ms")
	}
}

// cliCreate makes Trial id from the test's profile with trialnet
// create, as a user would, and returns what it printed.
func (w *world) cliCreate(id string) (client.TrialInfo, error) {
	var info client.TrialInfo
	out, err := exec.Command(w.bin, "create", "--socket", w.sock, "--id", id, "--profile", profile, "-j").Output()
	if err != nil {
		return info, fmt.Errorf("trialnet create: %w\n%s", err, out)
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return info, fmt.Errorf("trialnet create printed %q: %w", out, err)
	}
	return info, nil
}

// cliDestroy destroys Trial id with trialnet destroy.
func (w *world) cliDestroy(id string) error {
	if out, err := exec.Command(w.bin, "destroy", "--socket", w.sock, id).CombinedOutput(); err != nil {
		return fmt.Errorf("trialnet destroy %s: %w\n%s", id, err, out)
	}
	return nil
}
