//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"

	"golang.org/x/sys/unix"
)

// startProfiles records what docs/performance.md was measured with: a CPU
// profile, an execution trace, and block and mutex profiles (every event:
// this costs CPU, so it is for performance work only). stop writes them
// into dir as cpu.pprof, trace.out, block.pprof and mutex.pprof.
func startProfiles(dir string) (stop func() error, _ error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--pprof-dir: %w", err)
	}
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("--pprof-dir: %w", err)
	}
	cpu, err := createNew(d, "cpu.pprof")
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	tr, err := createNew(d, "trace.out")
	if err != nil {
		_ = d.Close()
		_ = cpu.Close()
		return nil, err
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		_ = d.Close()
		_ = cpu.Close()
		_ = tr.Close()
		return nil, fmt.Errorf("--pprof-dir: %w", err)
	}
	if err := trace.Start(tr); err != nil {
		pprof.StopCPUProfile()
		_ = d.Close()
		_ = cpu.Close()
		_ = tr.Close()
		return nil, fmt.Errorf("--pprof-dir: %w", err)
	}
	runtime.SetBlockProfileRate(1)
	runtime.SetMutexProfileFraction(1)
	return func() error {
		trace.Stop()
		pprof.StopCPUProfile()
		defer runtime.SetBlockProfileRate(0)
		defer runtime.SetMutexProfileFraction(0)
		defer d.Close()
		errs := []error{tr.Close(), cpu.Close()}
		for _, name := range []string{"block", "mutex"} {
			f, err := createNew(d, name+".pprof")
			if err == nil {
				err = errors.Join(pprof.Lookup(name).WriteTo(f, 0), f.Close())
			}
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("--pprof-dir: %w", err)
		}
		return nil
	}, nil
}

// createNew makes name in dir anew, never writing through what was there:
// the directory may be one others can write (/tmp/prof, as the docs
// show), where a symlink or hard link planted at the name would have a
// proxy run as root truncate and overwrite the file it leads to. What is
// at the name is removed first (an earlier run's profile, or a planted
// link, which only loses the link); one planted again before the create
// makes it fail rather than be followed.
func createNew(dir *os.File, name string) (*os.File, error) {
	dfd := int(dir.Fd())
	if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("--pprof-dir: remove the old %s: %w", filepath.Join(dir.Name(), name), err)
	}
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--pprof-dir: create %s: %w (something else made it meanwhile: give a directory only you can write)", filepath.Join(dir.Name(), name), err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir.Name(), name)), nil
}
