//go:build linux

package ociruntime

import (
	"fmt"
	"strings"
	"sync"
)

// runc's global options (runc 1.1 and those containerd's go-runc
// passes), true for those that take a value. An option not here before
// the subcommand is refused: the wrapper could not tell which word is
// the subcommand, nor so whether it creates a container. Built at first
// use, as the other option tables: a package-level map is built by every
// start of the binary.
var globalOpts = sync.OnceValue(func() map[string]bool {
	return map[string]bool{
		"root": true, "log": true, "log-format": true, "criu": true, "rootless": true,
		"debug": false, "systemd-cgroup": false, "help": false, "h": false, "version": false, "v": false,
	}
})

// The options of runc create and runc run, true for those that take a
// value.
var createOpts = sync.OnceValue(func() map[string]bool {
	return map[string]bool{
		"bundle": true, "b": true, "console-socket": true, "pid-file": true, "preserve-fds": true,
		"no-pivot": false, "no-new-keyring": false, "detach": false, "d": false, "keep": false, "no-subreaper": false,
		"help": false, "h": false,
	}
})

// The options of runc restore (runc 1.1), true for those that take a
// value.
var restoreOpts = sync.OnceValue(func() map[string]bool {
	return map[string]bool{
		"bundle": true, "b": true, "console-socket": true, "pid-file": true, "image-path": true, "work-path": true,
		"manage-cgroups-mode": true, "empty-ns": true, "lsm-profile": true, "lsm-mount-context": true,
		"tcp-established": false, "ext-unix-sk": false, "shell-job": false, "file-locks": false, "detach": false, "d": false,
		"no-subreaper": false, "no-pivot": false, "auto-dedup": false, "lazy-pages": false, "help": false, "h": false,
	}
})

// invocation is one runc command line as the wrapper reads it.
type invocation struct {
	args    []string
	command string // "": none (runc --version)
	// Of create, run and restore only:
	bundle  string // "": the working directory
	id      string
	log     string // the --log file, where the caller looks for runc's last error
	systemd []int  // indexes of --systemd-cgroup in args
	root    string // --root: where runc keeps its state ("": runc's default)
	// Of exec only: its process file and --cap values.
	process string
	caps    []string
}

// creates: the command makes a container from a bundle.
func (inv *invocation) creates() bool { return inv.command == "create" || inv.command == "run" }

// restores: the command makes a container from a bundle and a
// checkpoint's image.
func (inv *invocation) restores() bool { return inv.command == "restore" }

// option reads the option at args[i] (one or two dashes, a value after
// = or in the next word, as Go's flag package and so runc's CLI read
// them), known says which take a value. It returns its name, value and
// the index of its last word.
func option(args []string, i int, known map[string]bool) (name, value string, last int, err error) {
	a := args[i]
	name = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
	if name == "" || strings.HasPrefix(name, "-") {
		return "", "", i, fmt.Errorf("runc option %q is malformed", a)
	}
	name, value, inline := strings.Cut(name, "=")
	takes, ok := known[name]
	if !ok {
		return "", "", i, fmt.Errorf("runc option %q is not one this wrapper knows", a)
	}
	if takes && !inline {
		if i+1 >= len(args) {
			return "", "", i, fmt.Errorf("runc option %q has no value", a)
		}
		return name, args[i+1], i + 1, nil
	}
	return name, value, i, nil
}

// parseArgs finds the subcommand and, for create, run and restore, the
// bundle, the container id and the log file. Every other subcommand
// passes on unread.
func parseArgs(args []string) (*invocation, error) {
	inv := &invocation{args: args}
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-") && args[i] != "-"; i++ {
		name, value, last, err := option(args, i, globalOpts())
		if err != nil {
			return nil, err
		}
		switch name {
		case "log":
			inv.log = value
		case "root":
			inv.root = value
		case "systemd-cgroup":
			inv.systemd = append(inv.systemd, i)
		}
		i = last
	}
	if i == len(args) {
		return inv, nil
	}
	inv.command = args[i]
	if inv.command == "exec" {
		return inv, inv.parseExec(args[i+1:])
	}
	opts := createOpts()
	switch {
	case inv.restores():
		opts = restoreOpts()
	case !inv.creates():
		return inv, nil
	}
	// runc reads options after the container id too (its CLI moves them
	// in front), up to a "--".
	for i++; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if i+1 < len(args) && inv.id == "" {
				inv.id = args[i+1]
			}
			i = len(args)
		case strings.HasPrefix(a, "-") && a != "-":
			name, value, last, err := option(args, i, opts)
			if err != nil {
				return nil, fmt.Errorf("runc %s: %w", inv.command, err)
			}
			if name == "bundle" || name == "b" {
				inv.bundle = value
			}
			i = last
		case inv.id == "":
			inv.id = a
		}
	}
	if inv.id == "" {
		return nil, fmt.Errorf("runc %s has no container id", inv.command)
	}
	return inv, nil
}

// withoutSystemd is the command line without --systemd-cgroup: a
// container placed under a Trial's cgroup has a cgroupfs path, which
// runc's systemd manager cannot take (runc keeps the choice in the
// container's state, so its later commands follow it).
func (inv *invocation) withoutSystemd() []string {
	out := make([]string, 0, len(inv.args))
	for i, a := range inv.args {
		drop := false
		for _, j := range inv.systemd {
			drop = drop || i == j
		}
		if !drop {
			out = append(out, a)
		}
	}
	return out
}
