//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/record"
)

func learnFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("learn", false, "learning Trial: let names off the allowlist through and record them as would_deny (the address guard, TLS name check and kernel layers still enforce); see 'audit --profile'")
}

// auditRecords reads decision records from the agent, or from a saved
// log. A saved log may end in a line an agent crash tore: what reads is
// used, and the rest reported.
func auditRecords(ctx context.Context, id, from, socket string, stderr io.Writer) ([]record.Event, int, error) {
	if from == "" {
		recs, err := client.NewClient(socket).Audit(ctx, id)
		if err != nil {
			return nil, agentCode(err), err
		}
		return recs, exitOK, nil
	}
	recs, err := record.ReadFile(from)
	if err != nil && len(recs) == 0 {
		return nil, exitFailure, err
	}
	if err != nil {
		fmt.Fprintf(stderr, "trialnet: warning: %v; the records that read are used\n", err)
	}
	return recs, exitOK, nil
}

// printProfile prints the profile the records show the Trial used.
func printProfile(stdout, stderr io.Writer, asJSON bool, name string, recs []record.Event) int {
	l := config.Learn(recs, config.DefaultWildcardHosts)
	y, err := l.Profile(name)
	if err != nil {
		return cli.Fail(stdout, stderr, asJSON, exitFailure, err)
	}
	if asJSON {
		type entry struct {
			Entry     string `json:"entry"`
			Allowed   int    `json:"allowed"`
			WouldDeny int    `json:"would_deny"`
		}
		type wildcard struct {
			Entry string   `json:"entry"`
			Hosts []string `json:"hosts"`
		}
		out := struct {
			Profile   string     `json:"profile"`
			YAML      string     `json:"yaml"`
			Entries   []entry    `json:"entries"`
			Wildcards []wildcard `json:"offered_wildcards"`
		}{Profile: name, YAML: string(y), Entries: []entry{}, Wildcards: []wildcard{}}
		for _, e := range l.Entries {
			out.Entries = append(out.Entries, entry{e.Entry.String(), e.Allowed, e.WouldDeny})
		}
		for _, w := range l.Wildcards {
			out.Wildcards = append(out.Wildcards, wildcard{w.Entry.String(), w.Hosts})
		}
		cli.PrintJSON(stdout, out)
		return exitOK
	}
	_, _ = stdout.Write(y)
	return exitOK
}

func cmdAllow(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return changeAllow(ctx, "allow", args, stdout, stderr)
}

func cmdDeny(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return changeAllow(ctx, "deny", args, stdout, stderr)
}

// changeAllow is allow and deny: one PATCH of the Trial's allowlist.
func changeAllow(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) int {
	usage, example := "allow --trial ID [--require-tls] [-j] HOST:PORT...", "sudo trialnet allow --trial eval-42 pypi.org:443 files.pythonhosted.org:443"
	if verb == "deny" {
		usage, example = "deny --trial ID [--cut] [-j] HOST:PORT...", "sudo trialnet deny --trial eval-42 --cut pypi.org:443"
	}
	fs := cli.NewFlags(verb, usage, example, stderr)
	id := fs.String("trial", "", "the live Trial")
	var requireTLS, cut *bool
	if verb == "allow" {
		requireTLS = fs.Bool("require-tls", false, "the first bytes through tunnels to these entries must be a TLS ClientHello naming the host")
	} else {
		cut = fs.Bool("cut", false, "also end the open tunnels these entries allowed (default: only new CONNECTs are refused)")
	}
	socket := cli.SocketFlag(fs)
	asJSON := jsonFlag(fs)
	if err := cli.ParseInterspersed(fs, args); err != nil {
		return exitUsage
	}
	if *id == "" || fs.NArg() == 0 {
		fs.Usage()
		return cli.Fail(stdout, stderr, *asJSON, exitUsage, usageError{verb + ": give --trial ID and HOST:PORT entries"})
	}
	for _, s := range fs.Args() {
		if _, err := allow.ParseEntry(s); err != nil {
			return cli.Fail(stdout, stderr, *asJSON, exitUsage, usageError{fmt.Sprintf("%s: %v", verb, err)})
		}
	}
	ch := client.AllowChange{}
	if verb == "allow" {
		ch.Add, ch.RequireTLS = fs.Args(), *requireTLS
	} else {
		ch.Remove, ch.Cut = fs.Args(), *cut
	}
	res, err := client.NewClient(*socket).ChangeAllow(ctx, *id, ch)
	if err != nil {
		return cli.Fail(stdout, stderr, *asJSON, agentCode(err), err)
	}
	if *asJSON {
		cli.PrintJSON(stdout, res)
		return exitOK
	}
	var allow []string
	for _, e := range res.Trial.Allow {
		allow = append(allow, e.Entry)
	}
	tw := newTable(stdout)
	fmt.Fprintf(tw, "trial\t%s\nmode\t%s\nallow\t%s\n", res.Trial.ID, mode(res.Trial.Learning), strings.Join(allow, ","))
	if verb == "deny" {
		fmt.Fprintf(tw, "tunnels_cut\t%d\n", res.TunnelsCut)
	}
	if res.Note != "" {
		fmt.Fprintf(tw, "note\t%s\n", res.Note)
	}
	_ = tw.Flush()
	return exitOK
}
