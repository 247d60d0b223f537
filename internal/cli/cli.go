//go:build linux

// Package cli holds what every trialnet command line shares, so that
// trialnet and trialnet-oci (the OCI hook and Docker runtime wrapper,
// a binary of its own for its start time) parse, fail and exit alike:
// the exit codes, a command's flag set and usage, flags among
// arguments, the control socket's flag, and the one error of a command.
package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/trialnet/trialnet/internal/agentwire"
	"github.com/trialnet/trialnet/internal/termsafe"
)

// Exit codes of trialnet itself; a command run in a Trial passes its own.
const (
	ExitOK      = 0
	ExitUsage   = 2   // bad flags or arguments
	ExitFailure = 125 // trialnet refused or failed before or around CMD
)

// NewFlags is a command's flag set: errors and -h on stderr, with its
// usage line and an example.
func NewFlags(name, usage, example string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: trialnet %s\n\n", usage)
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\nExample:\n  %s\n", example)
	}
	return fs
}

// SocketFlag is --socket, the agent's control socket.
func SocketFlag(fs *flag.FlagSet) *string {
	return fs.String("socket", agentwire.DefaultSocket, "the agent's control socket")
}

// ParseInterspersed parses a command's flags wherever they stand among
// its arguments (deny --trial ID pypi.org:443 --cut), up to a "--" after
// which everything is an argument. Nothing changes kind: an argument
// starting with '-' is a flag (no Trial id or HOST:PORT entry can start
// with one), and a flag that takes a value takes the next argument,
// whatever it looks like, as the flag package does. run and exec do not
// use it: everything from CMD on is CMD's.
func ParseInterspersed(fs *flag.FlagSet, args []string) error {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name, _, inline := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		if f := fs.Lookup(name); f != nil && !inline && !isBool(f) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	if err := fs.Parse(flags); err != nil {
		return err
	}
	// A second Parse, of "--" and the arguments, is how a FlagSet is told
	// its arguments without reading any of them as a flag.
	return fs.Parse(append([]string{"--"}, pos...))
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// ParseNoArgs is ParseInterspersed for a command that takes no arguments.
// It refuses any, as the flag package refuses an unknown flag: a stray
// word (create --allow a.example.com:443 b.example.com:443) would
// otherwise be dropped without a word.
func ParseNoArgs(fs *flag.FlagSet, args []string) error {
	if err := ParseInterspersed(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("%s: unexpected argument %q: it takes flags only", fs.Name(), fs.Arg(0))
		fmt.Fprintf(fs.Output(), "trialnet: %v\n", err)
		fs.Usage()
		return err
	}
	return nil
}

// PrintJSON writes v as json.Encoder does, one line, with what a terminal
// could act on escaped (termsafe.JSON): the JSON holds the same values.
func PrintJSON(w io.Writer, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	_, _ = w.Write(append(termsafe.JSON(b), '\n'))
}

// Fail reports err once, as JSON under -j (bpftool's convention) or as a
// line on stderr, and returns the exit code.
func Fail(stdout, stderr io.Writer, asJSON bool, code int, err error) int {
	if asJSON {
		PrintJSON(stdout, map[string]string{"error": err.Error()})
	} else {
		fmt.Fprintf(stderr, "trialnet: %v\n", err)
	}
	return code
}
