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
)

// startProfiles records what docs/performance.md was measured with: a CPU
// profile, an execution trace, and block and mutex profiles (every event:
// this costs CPU, so it is for performance work only). stop writes them
// into dir as cpu.pprof, trace.out, block.pprof and mutex.pprof.
func startProfiles(dir string) (stop func() error, _ error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--pprof-dir: %w", err)
	}
	cpu, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		return nil, fmt.Errorf("--pprof-dir: %w", err)
	}
	tr, err := os.Create(filepath.Join(dir, "trace.out"))
	if err != nil {
		_ = cpu.Close()
		return nil, fmt.Errorf("--pprof-dir: %w", err)
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		_ = cpu.Close()
		_ = tr.Close()
		return nil, fmt.Errorf("--pprof-dir: %w", err)
	}
	if err := trace.Start(tr); err != nil {
		pprof.StopCPUProfile()
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
		errs := []error{tr.Close(), cpu.Close()}
		for _, name := range []string{"block", "mutex"} {
			f, err := os.Create(filepath.Join(dir, name+".pprof"))
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
