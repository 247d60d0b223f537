//go:build linux && cgo

package sandbox

import (
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
)

// startCommand hands the command the environment exec.Cmd would: the last
// of each name, and nothing with a NUL.
func TestDedupEnv(t *testing.T) {
	got, err := dedupEnv([]string{"A=1", "PATH=/x", "B", "A=2", "=C=1", "=C=2", ""})
	if want := []string{"PATH=/x", "B", "A=2", "=C=2"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("dedupEnv = %q, %v; want %q", got, err, want)
	}
	if _, err := dedupEnv([]string{"A=1\x00B=2"}); err == nil {
		t.Error("dedupEnv took a variable with a NUL")
	}
}

// What startCommand cannot do as exec.Cmd would is refused, not dropped.
func TestStartCommandRefusesWhatItCannotDo(t *testing.T) {
	for _, attr := range []*syscall.SysProcAttr{{Credential: &syscall.Credential{Uid: 1}}, {Pdeathsig: syscall.SIGKILL}, {Setpgid: true}} {
		cmd := &exec.Cmd{Args: []string{execArg0}, ExtraFiles: []*os.File{os.Stdin, os.Stdin, os.Stdin}, SysProcAttr: attr}
		if _, err := startCommand(cmd); err == nil {
			t.Errorf("startCommand took %+v", attr)
		}
	}
}
