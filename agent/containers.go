//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/trialnet/trialnet/client"
)

// maxContainerField bounds each string of a client.Container: the
// record is kept on disk for the Trial's life, its fields are the
// runtime's names.
const maxContainerField = 1024

// AddContainer records a container that trialnet oci-hook let into a
// live Trial, so that its layers say whose process boundary holds it.
// With a data directory the record is a line of
// <data_dir>/<id>/containers.jsonl, which a restarted or succeeding
// agent reads as it is; without one, the count lives with the Trial.
func (a *Agent) AddContainer(_ context.Context, id string, c client.Container) (client.TrialInfo, error) {
	leave, err := a.enter()
	if err != nil {
		return client.TrialInfo{}, err
	}
	defer leave()
	lt, err := a.lookup(id)
	if err != nil {
		return client.TrialInfo{}, err
	}
	if err := checkContainer(c); err != nil {
		return client.TrialInfo{}, errf(client.CodeBadRequest, "container of Trial %s: %v", id, err)
	}
	if err := a.keepContainer(lt, id, c); err != nil {
		return client.TrialInfo{}, errf(client.CodeInternal, "record container %s of %s: %v", c.ID, id, err)
	}
	a.log.Info("container joined trial", "trial", id, "container", c.ID, "pid", c.PID, "seccomp", c.Seccomp, "user_namespace", c.UserNamespace)
	return a.info(lt), nil
}

// keepContainer appends c to lt's record, or counts it without one.
func (a *Agent) keepContainer(lt *trial, id string, c client.Container) error {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if a.cfg.DataDir == "" {
		lt.containers++
		return nil
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(a.containersFile(id), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func checkContainer(c client.Container) error {
	if c.ID == "" || c.PID <= 0 {
		return fmt.Errorf("needs an id and a pid (got %q, %d)", c.ID, c.PID)
	}
	for _, s := range append([]string{c.ID, c.Bundle}, c.Capabilities...) {
		if len(s) > maxContainerField || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			return fmt.Errorf("a field longer than %d bytes or not printable: %q", maxContainerField, s)
		}
	}
	return nil
}

func (a *Agent) containersFile(id string) string {
	return filepath.Join(a.cfg.DataDir, id, "containers.jsonl")
}

// containers is how many containers joined lt: the lines of its record
// when there is a data directory (which outlives this process), else
// this process's count.
func (a *Agent) containers(lt *trial, id string) int {
	if a.cfg.DataDir == "" {
		lt.mu.Lock()
		defer lt.mu.Unlock()
		return lt.containers
	}
	b, err := os.ReadFile(a.containersFile(id))
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte{'\n'})
}
