//go:build linux

package main

import (
	"bytes"
	"debug/elf"
	"debug/gosym"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/internal/testkit"
)

func TestMain(m *testing.M) {
	// The test binary doubles as trialnet-oci, for a test that runs it as
	// the runtime would.
	if os.Getenv("TRIALNET_OCI_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// trialnet-oci is started for each container's hook and each of Docker's
// runtime calls, and Go runs the init of every linked package in each
// start: it must link none of what the agent, the sandbox or the proxy
// need. Read from this test binary, which links package main's imports
// and the tests' (which add none of these): its build info lists every
// module, its symbols every package of this module, so that it holds
// where no go command is (the VM matrix).
func TestTrialnetOCILinksNoAgentDeps(t *testing.T) {
	testkit.LinksNoModules(t, "trialnet-oci", "github.com/cilium/ebpf", "github.com/vishvananda/netlink", "github.com/vishvananda/netns",
		"github.com/miekg/dns", "go.yaml.in/yaml", "github.com/containerd", "github.com/prometheus", "google.golang.org/grpc")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// go test strips the symbol table; the function table (.gopclntab)
	// is always there.
	f, err := elf.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pcln, text := f.Section(".gopclntab"), f.Section(".text")
	if pcln == nil || text == nil {
		t.Fatal("the test binary has no .gopclntab or .text")
	}
	data, err := pcln.Data()
	if err != nil {
		t.Fatal(err)
	}
	table, err := gosym.NewTable(nil, gosym.NewLineTable(data, text.Addr))
	if err != nil {
		t.Fatalf("the test binary's function table: %v", err)
	}
	const mod = "github.com/trialnet/trialnet/"
	seen := map[string]bool{}
	for _, fn := range table.Funcs {
		if name, ok := strings.CutPrefix(fn.Name, mod); ok {
			pkg, _, _ := strings.Cut(name, ".")
			seen[pkg] = true
		}
	}
	for _, banned := range []string{"agent", "sandbox", "bpf", "netns", "proxy", "config", "guard", "resolve", "upstream",
		"dnsstub", "keeper", "handover", "ledger", "nriplugin"} {
		if seen[banned] {
			t.Errorf("trialnet-oci links %s%s", mod, banned)
		}
	}
	if !seen["internal/ocicmd"] {
		t.Errorf("no symbol of %sinternal/ocicmd among %d of this module's packages: is the binary stripped?", mod, len(seen))
	}
}

// It takes trialnet's command lines for its two commands, and says what
// to run for any other.
func TestTrialnetOCICommands(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"run", "--", "true"}, &out, &errOut); code != cli.ExitUsage || !strings.Contains(errOut.String(), "run trialnet run") {
		t.Errorf("run: exit %d, %q", code, errOut.String())
	}
	errOut.Reset()
	if code := run(nil, &out, &errOut); code != cli.ExitUsage || !strings.Contains(errOut.String(), "Usage: trialnet-oci oci-hook|oci-runtime") {
		t.Errorf("no command: exit %d, %q", code, errOut.String())
	}
}

// Its install commands write itself, by its real path, into hooks.d and
// daemon.json: the entries run the small binary.
func TestTrialnetOCIInstallsItself(t *testing.T) {
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"oci-hook", "install", "--print"}, &out, &errOut); code != cli.ExitOK ||
		!strings.Contains(out.String(), `"path": "`+self+`"`) || !strings.Contains(out.String(), `"oci-hook"`) {
		t.Errorf("oci-hook install --print: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	out.Reset()
	if code := run([]string{"oci-runtime", "install", "--print"}, &out, &errOut); code != cli.ExitOK {
		t.Fatalf("oci-runtime install --print: exit %d\n%s", code, errOut.String())
	}
	var frag struct {
		Runtimes map[string]struct {
			Path        string   `json:"path"`
			RuntimeArgs []string `json:"runtimeArgs"`
		} `json:"runtimes"`
	}
	if err := json.Unmarshal(out.Bytes(), &frag); err != nil || frag.Runtimes["trialnet"].Path != self || frag.Runtimes["trialnet"].RuntimeArgs[0] != "oci-runtime" {
		t.Errorf("oci-runtime install --print: %v\n%s", err, out.String())
	}
}
