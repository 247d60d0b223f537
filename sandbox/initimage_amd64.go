//go:build linux && amd64

package sandbox

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// initELF is the Trial's init: init_early.c's set-up and reaper with
// init_main.c, a static binary of its own (68 KB, `make generate`), so
// that a Trial's PID 1 loads neither this 20 MB binary nor a dynamic
// loader, for its set-up and again for its reaper. It holds nothing of
// the host's: only the code and the tables it mounts with.
//
//go:embed init_amd64.elf
var initELF []byte

// initImage is the sealed memfd every Trial's init is executed from, made
// once per process. A Trial's PID 1 is uid 0: its /proc/1/exe is this
// memfd, never the trialnet binary on the host (runc's CVE-2019-5736 was
// a container writing through its init's /proc/self/exe), and the seals
// keep anyone from changing what the next Trial's init runs.
var initImage = sync.OnceValues(initMemfd)

// initSeals: no write, no resize, no further change to the seals.
const initSeals = unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL

func initMemfd() (*os.File, error) {
	if !bytes.HasPrefix(initELF, []byte("\x7fELF")) {
		return nil, errors.New("the Trial's init is missing from this build (sandbox/init_amd64.elf is empty or not an ELF binary): " +
			"run `make generate` (it needs musl-gcc: `make deps`) and build trialnet again")
	}
	// MFD_EXEC (Linux 6.3+) asks for an executable memfd where
	// vm.memfd_noexec would make it not; older kernels refuse the flag
	// and make every memfd executable.
	fd, err := unix.MemfdCreate("trialnet-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate("trialnet-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if errors.Is(err, unix.EACCES) {
		return nil, fmt.Errorf("make the memfd a Trial's init is executed from: %w (vm.memfd_noexec is 2 in this PID namespace, "+
			"which forbids executing any memfd: run trialnet where it is 0 or 1)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("make the memfd a Trial's init is executed from: %w", err)
	}
	f := os.NewFile(uintptr(fd), "trialnet-init")
	if _, err := f.Write(initELF); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("write the Trial's init into its memfd: %w", err)
	}
	// F_SEAL_EXEC (6.3+) keeps its mode too: its owner, uid 0, needs no
	// capability to chmod it.
	_, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, initSeals|unix.F_SEAL_EXEC)
	if errors.Is(err, unix.EINVAL) {
		_, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, initSeals)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("seal the memfd a Trial's init is executed from: %w", err)
	}
	return f, nil
}

// initCommand is the Trial's init with args and, from fd 3 on, files: the
// sealed image, passed as the descriptor after them and executed through
// it (an exec.Cmd cannot execveat). Like every descriptor past 3, it is
// closed as the set-up execs the reaper, from /proc/self/exe: the same
// memfd.
func initCommand(args []string, files ...*os.File) (*exec.Cmd, error) {
	image, err := initImage()
	if err != nil {
		return nil, err
	}
	files = append(slices.Clip(files), image)
	return &exec.Cmd{Path: "/proc/self/fd/" + strconv.Itoa(2+len(files)), Args: args, ExtraFiles: files}, nil
}
