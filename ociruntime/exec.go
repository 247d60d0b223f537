//go:build linux

package ociruntime

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/trialnet/trialnet/ocihook"
)

// The options of runc exec, true for those that take a value.
var execOpts = sync.OnceValue(func() map[string]bool {
	return map[string]bool{
		"console-socket": true, "cwd": true, "env": true, "e": true, "user": true, "u": true,
		"additional-gids": true, "g": true, "process": true, "p": true, "pid-file": true,
		"process-label": true, "apparmor": true, "cap": true, "c": true, "preserve-fds": true,
		"cgroup": true, "tty": false, "t": false, "detach": false, "d": false, "no-new-privs": false,
		"ignore-paused": false, "help": false, "h": false,
	}
})

// defaultRoot is where runc keeps its containers' state without --root.
const defaultRoot = "/run/runc"

// parseExec reads runc exec's options: the container, the process file
// and the capabilities named on the command line.
func (inv *invocation) parseExec(args []string) error {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			if a == "--" {
				i++
			}
			if i < len(args) {
				inv.id = args[i]
			}
			break
		}
		name, value, last, err := option(args, i, execOpts())
		if err != nil {
			return fmt.Errorf("runc exec: %w", err)
		}
		switch name {
		case "process", "p":
			inv.process = value
		case "cap", "c":
			inv.caps = append(inv.caps, value)
		}
		i = last
	}
	if inv.id == "" {
		return fmt.Errorf("runc exec has no container id")
	}
	return nil
}

// checkExec refuses an exec into a container of a Trial that would give
// the new process a capability the hook refuses at the container's
// start: runc runs no hook for an exec, so docker exec --privileged or
// --cap-add would otherwise hand a process in the Trial the way out.
// The container's annotations are in runc's state as its labels; a
// state that cannot be read is refused, since the claim is unknown.
func (inv *invocation) checkExec() error {
	root := inv.root
	if root == "" {
		root = defaultRoot
	}
	var st struct {
		Config struct {
			Labels []string `json:"labels"`
		} `json:"config"`
	}
	b, err := os.ReadFile(filepath.Join(root, inv.id, "state.json"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		return fmt.Errorf("refused an exec: cannot tell whether container %s is in a Trial: %w", inv.id, err)
	}
	claimed := false
	for _, l := range st.Config.Labels {
		// In any case, as the hook reads a claim.
		claimed = claimed || strings.HasPrefix(strings.ToLower(l), "trialnet.io/")
	}
	if !claimed {
		return nil
	}
	caps := inv.caps
	if inv.process != "" {
		var p struct {
			Capabilities map[string][]string `json:"capabilities"`
		}
		b, err := os.ReadFile(inv.process)
		if err == nil {
			err = ocihook.DecodeStrict(b, &p)
		}
		if err != nil {
			return fmt.Errorf("refused an exec into container %s of a Trial: its process: %w", inv.id, err)
		}
		for _, set := range p.Capabilities {
			caps = append(caps, set...)
		}
	}
	if bad := ocihook.RefusedCaps(caps); len(bad) > 0 {
		return fmt.Errorf("refused an exec into container %s of a Trial: it would hold capabilities that let it leave its Trial (docker exec --privileged or --cap-add): %s", inv.id, strings.Join(bad, "; "))
	}
	if inv.process == "" {
		return nil
	}
	if err := trialProxyEnv(inv.process, st.Config.Labels); err != nil {
		return fmt.Errorf("refused an exec into container %s of a Trial: %w", inv.id, err)
	}
	return nil
}

// trialProxyEnv gives an exec's process (its process file) the proxy
// variables of the container's own process, as the wrapper wrote them
// into its bundle at create, replacing its own: Docker starts an exec
// with the environment it keeps for the container (the image's and
// docker run -e's), so a proxy the wrapper replaced (an operator's, its
// credentials in it) came back in every exec, where the Trial reads it.
// labels are the container's in runc's state, its bundle among them.
func trialProxyEnv(processFile string, labels []string) error {
	dir := ""
	for _, l := range labels {
		if v, ok := strings.CutPrefix(l, "bundle="); ok {
			dir = v
		}
	}
	if dir == "" {
		return fmt.Errorf("runc's state names no bundle, whose proxy variables its process is to have")
	}
	b, err := readBundle(dir)
	if err != nil {
		return fmt.Errorf("its bundle's proxy variables: %w", err)
	}
	var trial []any
	if p := object(b.doc, "process"); p != nil {
		env, _ := p["env"].([]any)
		trial = slices.DeleteFunc(slices.Clone(env), func(e any) bool { return !isProxyVar(e) })
	}
	proc, err := readJSONDoc(processFile)
	if err != nil {
		return err
	}
	env, _ := proc.doc["env"].([]any)
	proc.doc["env"] = append(slices.DeleteFunc(slices.Clone(env), isProxyVar), trial...)
	return proc.write()
}

// isProxyVar: env entry e sets one of proxyVars.
func isProxyVar(e any) bool {
	s, _ := e.(string)
	name, _, _ := strings.Cut(s, "=")
	return slices.Contains(proxyVars, name)
}
