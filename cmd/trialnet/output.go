//go:build linux

package main

// Printing, in one place: tables (newTable), a Trial's stats, run's
// summary line and refusal lines (JSON and the one error of a command
// are internal/cli's, which trialnet-oci shares). Everything a Trial
// could have written (a target, an error's text) goes through termsafe
// first.

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/termsafe"
	"github.com/trialnet/trialnet/record"
)

// newTable is the one table layout of every command's plain output:
// columns two spaces apart; flush it when done.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// printStats prints a Trial's counters in aligned columns, bpftool-style,
// ending with the verdict line. Every string goes through termsafe.
func printStats(w io.Writer, st client.Stats) {
	q := termsafe.String
	fmt.Fprintf(w, "trial %s (%s)\n", q(st.Trial), mode(st.Learning))
	tw := newTable(w)
	names := make([]string, 0, len(st.Kernel))
	for n := range st.Kernel {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(tw, "\tkernel\t%s\t%d\n", q(n), st.Kernel[n])
	}
	p := st.Proxy
	fmt.Fprintf(tw, "\tproxy\ttunnels_allowed\t%d\n\tproxy\ttunnels_denied\t%d\n\tproxy\ttunnels_active\t%d\n\tproxy\tdns_failures\t%d\n\tproxy\tbytes_up\t%d\n\tproxy\tbytes_down\t%d\n",
		p.Allowed, p.Denied, p.Active, p.DNSFailures, p.BytesUp, p.BytesDown)
	if st.Learning {
		fmt.Fprintf(tw, "\tproxy\twould_deny\t%d\n", p.WouldDeny)
	}
	if d := st.DNS; d != nil {
		fmt.Fprintf(tw, "\tdns\tanswered\t%d\n\tdns\tnames_denied\t%d\n", d.Answered, d.Denied)
	}
	for _, r := range slices.Sorted(maps.Keys(p.ByReason)) {
		fmt.Fprintf(tw, "\tproxy\treason:%s\t%d\n", q(string(r)), p.ByReason[r])
	}
	for _, u := range st.Pools {
		if u.Max == 0 {
			fmt.Fprintf(tw, "\tpool\t%s\tunbounded (%s)\n", q(u.Pool), q(u.Bound))
			continue
		}
		fmt.Fprintf(tw, "\tpool\t%s\t%d now, %d at peak, of %d; %d %s\n", q(u.Pool), u.Current, u.Peak, u.Max, u.Events, poolEvents(u.Pool))
	}
	_ = tw.Flush()
	for _, t := range st.TopRefused {
		fmt.Fprintf(w, "refused %s: %d\n", q(t.Target), t.Count)
	}
	fmt.Fprintln(w, q(st.Layers.String()))
	fmt.Fprintln(w, q(st.Verdict))
}

// poolEvents names what a pool's events count.
func poolEvents(pool string) string {
	if pool == "pids" {
		return "forks refused at the bound"
	}
	return "OOM kills"
}

func mode(learning bool) string {
	if learning {
		return "learning"
	}
	return "enforcing"
}

// summary is the one line run prints when CMD ends, kept short: the
// Trial, CMD's exit code and time, tunnels allowed and refused with the
// most refused targets, and the verdict in a few words. The layers and
// the reasons are -v's, stats' and the report's.
func summary(st client.Stats, code int, took time.Duration) string {
	var top []string
	for i, t := range st.TopRefused {
		if i == summaryTargets {
			top = append(top, "…")
			break
		}
		top = append(top, fmt.Sprintf("%s ×%d", termsafe.String(shorten(t.Target, summaryTargetLen)), t.Count))
	}
	refused := fmt.Sprintf("%d refused", st.Proxy.Denied)
	if len(top) > 0 {
		refused += " (" + strings.Join(top, ", ") + ")"
	}
	// A transparent Trial's client that ignores the proxy is refused at
	// its lookup, before any tunnel: said beside the tunnels.
	names := ""
	if st.DNS != nil && st.DNS.Denied > 0 {
		names = fmt.Sprintf("names: %d refused by the DNS stub; ", st.DNS.Denied)
	}
	return fmt.Sprintf("trialnet: Trial %s: exit %d after %s; tunnels: %d allowed, %s; %s%s%s",
		termsafe.String(st.Trial), code, took.Round(time.Millisecond), st.Proxy.Allowed, refused, names, kernelRefused(st.Kernel), st.Brief())
}

// kernelRefused says what the kernel refused the Trial, by counter: a
// client that ignores the proxy (a direct connect, a datagram sent
// anywhere) is stopped there, before any tunnel or lookup, and is as much
// a refused attempt as a refused CONNECT. "" when it refused nothing.
func kernelRefused(kernel map[string]uint64) string {
	var total uint64
	var by []bpf.Field
	for name, n := range kernel {
		if n == 0 || !strings.HasSuffix(name, "_denied") {
			continue
		}
		total += n
		by = append(by, bpf.Field{Name: name, Value: n})
	}
	if total == 0 {
		return ""
	}
	slices.SortFunc(by, func(x, y bpf.Field) int {
		if x.Value != y.Value {
			return cmp.Compare(y.Value, x.Value)
		}
		return strings.Compare(x.Name, y.Name)
	})
	each := make([]string, len(by))
	for i, f := range by {
		each[i] = fmt.Sprintf("%s ×%d", termsafe.String(f.Name), f.Value)
	}
	return fmt.Sprintf("kernel: %d refused (%s); ", total, strings.Join(each, ", "))
}

// shorten cuts s to at most n runes, marking the cut.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// refusalLine is one refusal, or a summary of suppressed records, as
// --show-refusals prints it.
func refusalLine(ev record.Event) string {
	if ev.Decision == record.DecisionSuppressed {
		return "trialnet: " + termsafe.String(ev.Detail) + suppressedReasons(ev.Suppressed)
	}
	line := fmt.Sprintf("trialnet: refused %s %s: %s", termsafe.String(ev.Method), termsafe.String(ev.Target), termsafe.String(string(ev.Reason)))
	if ev.Detail != "" {
		line += " (" + termsafe.String(ev.Detail) + ")"
	}
	return line
}

// suppressedReasons is what a summary counts, by reason: " (bad_target
// ×55, rate_limited ×3)".
func suppressedReasons(s *record.Suppressed) string {
	if s == nil || len(s.ByReason) == 0 {
		return ""
	}
	var by []string
	for r, n := range s.ByReason {
		by = append(by, fmt.Sprintf("%s ×%d", termsafe.String(string(r)), n))
	}
	slices.Sort(by)
	return " (" + strings.Join(by, ", ") + ")"
}

// How many refused targets the summary names, and how much of each.
const (
	summaryTargets   = 3
	summaryTargetLen = 48
)
