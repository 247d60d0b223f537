//go:build linux

// Command firstbyte is the smallest Harness: it connects to a proxy
// (retrying while the sandbox's relay comes up), asks for a CONNECT to a
// target, sends one byte and waits for it to come back. Exit 0 on success.
//
//	firstbyte 127.0.0.1:3128 upstream.example.test:9000
package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "firstbyte:", err)
		os.Exit(1)
	}
}

func run(proxy, target string) error {
	var c net.Conn
	var err error
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(time.Millisecond) {
		if c, err = net.Dial("tcp", proxy); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("CONNECT: %s", resp.Status)
	}
	if _, err := c.Write([]byte{'x'}); err != nil {
		return err
	}
	b, err := br.ReadByte()
	if err != nil || b != 'x' {
		return fmt.Errorf("echo: %q %v", b, err)
	}
	return nil
}
