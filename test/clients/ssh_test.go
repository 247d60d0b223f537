//go:build linux

package clients

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const sshdPath = "/usr/sbin/sshd"

// sshClient is ssh (and git over ssh), which reads no proxy variable: it
// reaches an allowed host:22 through the CONNECT endpoint with
// ProxyCommand and OpenBSD netcat's CONNECT support. The server is
// Debian's sshd, run by the test on the test host.
func sshClient(w *world) client {
	return client{
		name: "ssh", port: 22,
		missing: func() string {
			if why := need("ssh", "nc", "ssh-keygen")(); why != "" {
				return why
			}
			if _, err := os.Stat(sshdPath); err != nil {
				return "openssh-server is not installed ('make test-deps' installs it): " + err.Error()
			}
			if out, _ := exec.Command("nc", "-h").CombinedOutput(); !bytes.Contains(out, []byte("OpenBSD")) {
				return "nc is not OpenBSD netcat (no -X connect); 'make test-deps' installs netcat-openbsd"
			}
			return ""
		},
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			argv := append([]string{"ssh"}, sshOptions(tc, proxied)...)
			return tc.run(proxied, nil, append(argv, "root@"+host, "echo", "ssh-ok")...)
		},
		works: func(t *testing.T, tc *trial, out string) {
			if !strings.Contains(out, "ssh-ok") {
				t.Errorf("ssh: %q", out)
			}
			// git over ssh, the same way.
			dir := tc.workdir("ssh-clone")
			head := tc.w.commit()
			code, out := tc.run(true, []string{"GIT_SSH_COMMAND=ssh " + strings.Join(quoted(sshOptions(tc, true)), " ")},
				"git", "clone", "-q", "ssh://root@ssh."+domain+filepath.Join(tc.w.gitRoot, "demo.git"), dir)
			if code != 0 {
				t.Fatalf("git clone over ssh: exit %d\n%s", code, out)
			}
			if _, out := tc.run(false, nil, "git", "-C", dir, "rev-parse", "HEAD"); strings.TrimSpace(out) != head {
				t.Errorf("git over ssh cloned %q, want %s", out, head)
			}
			t.Logf("git clone over ssh through the CONNECT endpoint: %s", head)
		},
		setup: func(t *testing.T, tc *trial) { w.startSSHD(t, tc) },
	}
}

// sshOptions: no config, the Trial's key, no host key prompts, and, when
// proxied, the ProxyCommand through the Trial's CONNECT endpoint.
func sshOptions(tc *trial, proxied bool) []string {
	opts := []string{"-F", "/dev/null", "-i", filepath.Join(tc.home, "id_ed25519"), "-o", "UserKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "LogLevel=ERROR"}
	if proxied {
		endpoint := strings.TrimPrefix(tc.info.ProxyURL, "http://")
		opts = append(opts, "-o", "ProxyCommand=nc -X connect -x "+endpoint+" %h %p")
	}
	return opts
}

func quoted(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return out
}

// startSSHD runs sshd on the test host's port 22, accepting the Trial's
// key for root (it runs `echo` and git-upload-pack in the test's own
// files), until the test ends.
func (w *world) startSSHD(t *testing.T, tc *trial) {
	t.Helper()
	dir := filepath.Join(w.dir, "sshd")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	keygen := func(path string) {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trialnet-test", "-f", path).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v\n%s", err, out)
		}
	}
	keygen(filepath.Join(dir, "host_ed25519"))
	clientKey := filepath.Join(tc.home, "id_ed25519")
	keygen(clientKey)
	if err := os.Chown(clientKey, int(tc.uid), int(tc.uid)); err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(clientKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`ListenAddress %s:22
HostKey %s
AuthorizedKeysFile %s
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PidFile none
`, w.host.Addr4, filepath.Join(dir, "host_ed25519"), filepath.Join(dir, "authorized_keys"))
	if err := os.WriteFile(filepath.Join(dir, "sshd_config"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// sshd insists on its privilege separation directory.
	if _, err := os.Stat("/run/sshd"); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir("/run/sshd", 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove("/run/sshd") })
	}
	var log bytes.Buffer
	cmd := exec.Command(sshdPath, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	cmd.Stdout, cmd.Stderr = &log, &log
	// Started from a thread in the test host's namespace, sshd lives there.
	if err := w.host.NS.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sshd:\n%s", log.String())
		}
	})
	// Ready when it accepts, from the host's side of the veth.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", w.host.Addr4.String()+":22", time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd did not listen: %v\n%s", err, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
