//go:build linux && (amd64 || cgo)

package sandbox

import "os"

// initFiles are the Trial's init's descriptors from 3 on: the ready pipe,
// and the commands' seccomp filter, which init_early.c installs (it
// cannot assemble it, as Go's installSeccomp does).
func initFiles(ready *os.File) ([]*os.File, error) {
	filter, err := seccompFile(false)
	if err != nil {
		return nil, err
	}
	return []*os.File{ready, filter}, nil
}
