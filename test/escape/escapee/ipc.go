//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// What a same-uid process outside a Trial shares with the kernel rather
// than through a socket: System V shared memory, a POSIX shared memory
// file, a POSIX message queue and its uid's user keyring. The victim
// makes one of each; a Trial process that reaches one leaves a mark the
// test finds outside (or, for the keyring, reads a secret only the
// victim and the test know).

// ipcMark is what the Trial writes into what it reached.
const ipcMark = "trialnet-pwned"

// victimIPCObjects makes the victim's objects and describes them as
// "shmid,shmfile,mqname,keydesc" for the boundary attempts.
func victimIPCObjects(secret string) (string, error) {
	id, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
	if err != nil {
		return "", fmt.Errorf("shmget: %w", err)
	}
	// Attached for the victim's life, and gone with it: Linux still lets
	// a segment marked for removal be attached by id.
	if _, err := unix.SysvShmAttach(id, 0, 0); err != nil {
		return "", fmt.Errorf("shmat: %w", err)
	}
	if _, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil); err != nil {
		return "", fmt.Errorf("shmctl IPC_RMID: %w", err)
	}
	file := fmt.Sprintf("/dev/shm/trialnet-victim-%d", os.Getpid())
	if err := os.WriteFile(file, []byte("victim"), 0o600); err != nil {
		return "", err
	}
	mq := fmt.Sprintf("/trialnet-victim-%d", os.Getpid())
	fd, err := mqOpen(mq, unix.O_CREAT|unix.O_RDWR)
	if err != nil {
		return "", err
	}
	_ = fd // held open: the queue lives until the test unlinks it
	desc := fmt.Sprintf("trialnet-victim-%d", os.Getpid())
	key, err := unix.AddKey("user", desc, []byte(secret), unix.KEY_SPEC_USER_KEYRING)
	if err != nil {
		return "", fmt.Errorf("add_key: %w", err)
	}
	// The user keyring outlives the victim: the key expires by itself.
	_, _ = unix.KeyctlInt(unix.KEYCTL_SET_TIMEOUT, key, 120, 0, 0)
	return strings.Join([]string{strconv.Itoa(id), file, mq, desc}, ","), nil
}

func mqOpen(name string, flags int) (int, error) {
	p, err := unix.BytePtrFromString(strings.TrimPrefix(name, "/"))
	if err != nil {
		return -1, err
	}
	fd, _, errno := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), uintptr(flags), 0o600, 0, 0, 0)
	if errno != 0 {
		return -1, fmt.Errorf("mq_open %s: %w", name, errno)
	}
	return int(fd), nil
}

// ipcAttempts reaches for the victim's objects from inside the Trial.
func ipcAttempts(enc *json.Encoder) {
	f := strings.Split(*victimIPC, ",")
	if len(f) != 4 {
		fmt.Fprintln(os.Stderr, "boundary needs -victim-ipc shmid,shmfile,mqname,keydesc")
		os.Exit(2)
	}
	report(enc, "ipc-sysv-shm", func() error {
		id, err := strconv.Atoi(f[0])
		if err != nil {
			return err
		}
		b, err := unix.SysvShmAttach(id, 0, 0)
		if err != nil {
			return fmt.Errorf("shmat %d: %w", id, err)
		}
		copy(b, ipcMark)
		return unix.SysvShmDetach(b)
	}())
	report(enc, "ipc-posix-shm", func() error {
		file, err := os.OpenFile(f[1], os.O_WRONLY, 0) // the victim's, not a new one
		if err != nil {
			return err
		}
		_, err = file.WriteString(ipcMark)
		return errors.Join(err, file.Close())
	}())
	report(enc, "ipc-mqueue", func() error {
		fd, err := mqOpen(f[2], unix.O_WRONLY|unix.O_NONBLOCK)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		msg := []byte(ipcMark)
		if _, _, errno := unix.Syscall6(unix.SYS_MQ_TIMEDSEND, uintptr(fd), uintptr(unsafe.Pointer(&msg[0])), uintptr(len(msg)), 0, 0, 0); errno != 0 {
			return fmt.Errorf("mq_timedsend: %w", errno)
		}
		return nil
	}())
	keyAttempts(enc, f[3])
}

// keyAttempts reaches for the user keyring of the process's uid, and for
// the kernel's request-key callout: desc is the description of a key
// there (the victim's) or of none.
func keyAttempts(enc *json.Encoder, desc string) {
	report(enc, "keyring-read", func() error {
		// Linked into its own process keyring, so that it possesses the
		// key and may read it, as any same-uid process may.
		id, err := unix.KeyctlSearch(unix.KEY_SPEC_USER_KEYRING, "user", desc, unix.KEY_SPEC_PROCESS_KEYRING)
		if err != nil {
			return fmt.Errorf("search the user keyring: %w", err)
		}
		buf := make([]byte, 128)
		n, err := unix.KeyctlBuffer(unix.KEYCTL_READ, id, buf, 0)
		if err != nil {
			return fmt.Errorf("read the key: %w", err)
		}
		// The payload goes into the report: the test compares it with the
		// secret it gave the victim.
		return errEscaped("read " + string(buf[:min(n, len(buf))]))
	}())
	report(enc, "keyctl-i386", inChild("keyctl-i386"))
	// A key the kernel lacks makes it run /sbin/request-key as root in
	// the host's namespaces, with this description: any answer but the
	// filter's ENOSYS means the key service took the request.
	report(enc, "request-key-upcall", func() error {
		_, err := unix.RequestKey("user", "trialnet-escape-upcall", "callout", unix.KEY_SPEC_PROCESS_KEYRING)
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
			return err
		}
		return nil
	}())
}
