//go:build linux

package main

import (
	"fmt"
	"io"
)

// cpioWriter writes the "newc" cpio format, the one the kernel unpacks as
// an initramfs: a 110-byte ASCII header per entry, the name and the data
// each padded to 4 bytes, and a TRAILER!!! entry at the end.
type cpioWriter struct {
	w   io.Writer
	n   int64
	ino uint32
	err error
}

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// entry writes one file, directory or device node. mode carries the file
// type bits (0o040000 directory, 0o100000 regular, 0o020000 char device).
func (c *cpioWriter) entry(name string, mode uint32, data []byte, rdevMajor, rdevMinor uint32) {
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad()
	c.write(data)
	c.pad()
}

func (c *cpioWriter) dir(name string)                         { c.entry(name, 0o040755, nil, 0, 0) }
func (c *cpioWriter) file(name string, b []byte, perm uint32) { c.entry(name, 0o100000|perm, b, 0, 0) }
func (c *cpioWriter) chardev(name string, major, minor uint32) {
	c.entry(name, 0o020600, nil, major, minor)
}

// close writes the trailer and reports the first error.
func (c *cpioWriter) close() error {
	c.ino = 0
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	return c.err
}
