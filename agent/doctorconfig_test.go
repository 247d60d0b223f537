//go:build linux

package agent

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/config"
)

// The doctor says whether the upstream proxy and each host service are
// there, and why not.
func TestConfigChecks(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	gone, _ := net.Listen("tcp", "127.0.0.1:0")
	gonePort := gone.Addr().(*net.TCPAddr).Port
	_ = gone.Close()
	cred := filepath.Join(t.TempDir(), "cred")
	if err := os.WriteFile(cred, []byte("u:p\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf(`
upstream_proxy: {address: %q, credentials_file: %q}
profiles:
  up: {host_services: [{port: %d}]}
  down: {host_services: [{port: %d}]}
  far: {host_services: [{port: 80, address: 192.0.2.1}]}
`, up.Addr().String(), cred, up.Addr().(*net.TCPAddr).Port, gonePort)
	f, err := config.ParseFile([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]error{}
	for _, c := range ConfigChecks(f) {
		if c.Required {
			t.Errorf("%s is required", c.Name)
		}
		got[c.Name] = c.Err
	}
	want := map[string]string{
		"upstream proxy " + up.Addr().String() + ": configuration and credentials file":                   "",
		"upstream proxy " + up.Addr().String() + " accepts connections":                                   "",
		fmt.Sprintf("host service 127.0.0.1:%d (profile up) is listening", up.Addr().(*net.TCPAddr).Port): "",
		fmt.Sprintf("host service 127.0.0.1:%d (profile down) is listening", gonePort):                    "connection refused",
		"host service 192.0.2.1:80 (profile far) is listening":                                            "not one of this host's addresses",
	}
	for name, w := range want {
		err, ok := got[name]
		switch {
		case !ok:
			t.Errorf("no check %q in %v", name, got)
		case w == "" && err != nil, w != "" && (err == nil || !strings.Contains(err.Error(), w)):
			t.Errorf("%s: %v, want %q", name, err, w)
		}
	}
	if err := os.Chmod(cred, 0o644); err != nil {
		t.Fatal(err)
	}
	if c := ConfigChecks(f)[0]; c.Err == nil || !strings.Contains(c.Err.Error(), "chmod 600") {
		t.Errorf("a readable credentials file: %v", c.Err)
	}
}
