//go:build linux

package clients

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
)

// What coding agents run that talks over the Trial's own unix sockets:
// each tool, in its own Trial, works end to end, while a host socket the
// Trial was not given stays refused (and counted), and no packet leaves
// directly.
var unixTools = []struct {
	name  string
	bins  []string
	files map[string]string // written into the Trial's home first
	// script runs under sh in the Trial, as nobody, with HOME set; its
	// output must hold want.
	script string
	want   []string
}{
	{
		name: "tmux", bins: []string{"tmux"},
		script: `set -e
export TERM=xterm SHELL=/bin/sh  # nobody's login shell is nologin, which tmux would run
tmux new-session -d -s work sh                          # /tmp/tmux-UID/default
tmux send-keys -t work 'echo "hello from $((6*7))"' Enter
for i in $(seq 50); do tmux capture-pane -p -t work | grep -q 'hello from 42' && break; sleep 0.1; done
tmux capture-pane -p -t work | grep 'hello from 42'
tmux -S /tmp/other new-session -d -s second 'sleep 60'   # a socket by path
tmux -S /tmp/other ls
tmux -S /tmp/other kill-server
tmux kill-server
echo tmux-done`,
		want: []string{"hello from 42", "second: 1 windows", "tmux-done"},
	},
	{
		name: "ssh-agent", bins: []string{"ssh-agent", "ssh-add", "ssh-keygen"},
		script: `set -e
eval "$(ssh-agent -s)" >/dev/null                       # $TMPDIR or /tmp/ssh-XXXX/agent.PID
ssh-keygen -q -t ed25519 -N '' -C trial-key -f /tmp/key
ssh-add /tmp/key 2>&1
ssh-add -l
ssh-agent -k >/dev/null
echo agent-done`,
		want: []string{"Identity added", "trial-key (ED25519)", "agent-done"},
	},
	{
		name: "git-credential-cache", bins: []string{"git"},
		script: `set -e
cred() { printf 'protocol=https\nhost=git.example\n%s' "$1" | git credential "$2"; }
# A fresh home in the Trial's own /tmp: the daemon's default socket,
# ~/.cache/git/credential/socket, is then the Trial's.
mkdir /tmp/home && HOME=/tmp/home && export HOME
git config --global credential.helper cache
cred 'username=trial
password=s3cret
' approve
cred '' fill
# In a home the host shares, a socket would be a way in: there the
# daemon is told where (a socket in /tmp).
git config --global credential.helper 'cache --socket /tmp/git-cred/socket'
cred 'username=trial2
password=other
' approve
cred '' fill
git credential-cache exit
git credential-cache --socket /tmp/git-cred/socket exit
echo git-done`,
		want: []string{"password=s3cret", "password=other", "git-done"},
	},
	{
		name: "python-multiprocessing", bins: []string{"/usr/bin/python3"},
		files: map[string]string{"mp.py": `import multiprocessing as mp, socket

def square(x):
    return x * x

if __name__ == "__main__":
    for method in ("fork", "spawn", "forkserver"):
        with mp.get_context(method).Pool(2) as pool:
            print(method, sum(pool.map(square, range(10))))
    with mp.Manager() as m:  # a server on a unix socket in /tmp
        d = m.dict()
        d["k"] = 42
        print("manager", d["k"])
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.send(b"dgram-pair")
    print(b.recv(64).decode())
    r = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    r.bind("/tmp/dgram.sock")
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"dgram-named", "/tmp/dgram.sock")
    print(r.recv(64).decode())
`},
		script: `/usr/bin/python3 "$HOME/mp.py"`,
		want:   []string{"fork 285", "spawn 285", "forkserver 285", "manager 42", "dgram-pair", "dgram-named"},
	},
	{
		name: "redis", bins: []string{"redis-server", "redis-cli"},
		script: `set -e
redis-server --port 0 --unixsocket /tmp/redis.sock --unixsocketperm 700 --dir /tmp --save '' --daemonize yes --pidfile /tmp/redis.pid --logfile /tmp/redis.log
for i in $(seq 50); do redis-cli -s /tmp/redis.sock ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
redis-cli -s /tmp/redis.sock set answer 42
redis-cli -s /tmp/redis.sock get answer
redis-cli -s /tmp/redis.sock shutdown nosave || true
echo redis-done`,
		want: []string{"OK", "42", "redis-done"},
	},
}

// hostSocket serves a unix socket of the host that any uid may open, in
// a directory every Trial sees, counting the connections it accepts: a
// Trial that was not given it must not reach it.
func hostSocket(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	path := filepath.Join(privtest.SharedDir(t, "hostsock-"), "host.sock")
	return path, privtest.ServeUnix(t, path, "")
}

func TestPrivilegedOwnUnixTools(t *testing.T) {
	privtest.Require(t)
	w := newAgentWorld(t)
	host, reached := hostSocket(t)
	for _, tool := range unixTools {
		t.Run(tool.name, func(t *testing.T) {
			for _, b := range tool.bins {
				privtest.RequireTool(t, b)
			}
			tc := w.newTrial(t, tool.name, nobody, "allowed."+domain+":443")
			for name, body := range tool.files {
				tc.write(filepath.Join(tc.home, name), body)
			}
			code, out := tc.run(false, []string{"TMPDIR=/tmp"}, "/bin/sh", "-c", tool.script)
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			for _, want := range tool.want {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			t.Logf("%s in a Trial:\n%s", tool.name, strings.TrimSpace(out))

			// Off the list: a host socket the Trial was not given.
			refused, _ := tc.kernel()
			accepts := w.accepts.Load()
			code, out = tc.run(false, nil, "/usr/bin/python3", "-c",
				"import socket; socket.socket(socket.AF_UNIX).connect("+pyString(host)+")")
			tc.failedClosed("a host unix socket", code, out, accepts, refused)
			// And a host off the allowlist, through the proxy.
			if code, out := tc.run(true, nil, "curl", "-sS", "-o", "/dev/null", url(deniedHost, "/")); code == 0 {
				t.Errorf("curl to %s: exit 0, want refused:\n%s", deniedHost, out)
			}
			if _, ok := tc.waitDecision(deniedHost, 443, record.DecisionDeny, ""); !ok {
				t.Errorf("no deny decision for %s", deniedHost)
			}
			if _, egress := tc.kernel(); egress != 0 {
				t.Errorf("%d direct egress packets", egress)
			}
			if n := reached.Load(); n != 0 {
				t.Errorf("the host socket accepted %d connections from Trials", n)
			}
		})
	}
}

// pyString quotes s for Python source.
func pyString(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}
