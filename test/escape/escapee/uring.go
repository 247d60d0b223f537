//go:build linux

package main

import (
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// io_uring ABI (include/uapi/linux/io_uring.h), only what a connect needs.
const (
	ioringOffSQRing   = 0
	ioringOffCQRing   = 0x8000000
	ioringOffSQEs     = 0x10000000
	ioringOpConnect   = 16
	ioringEnterGetEvt = 1
)

type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, Cqes, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

type uringParams struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFd uint32
	Resv                                                                   [3]uint32
	SQOff                                                                  sqringOffsets
	CQOff                                                                  cqringOffsets
}

type sqe struct {
	Opcode, Flags uint8
	Ioprio        uint16
	Fd            int32
	Off           uint64 // addr2: the sockaddr length for a connect
	Addr          uint64
	Len, OpFlags  uint32
	UserData      uint64
	BufIndex      uint16
	Personality   uint16
	SpliceFdIn    int32
	Addr3, Pad    uint64
}

type cqe struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// uringConnect connects a TCP socket to ap through io_uring, which does
// not go through the connect(2) system call.
func uringConnect(ap netip.AddrPort) error {
	var p uringParams
	ring, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return errSkip(fmt.Sprintf("io_uring unavailable here: %v", errno))
	}
	defer unix.Close(int(ring))
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)

	sqSize := int(p.SQOff.Array + p.SQEntries*4)
	cqSize := int(p.CQOff.Cqes + p.CQEntries*uint32(unsafe.Sizeof(cqe{})))
	sq, err := unix.Mmap(int(ring), ioringOffSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("mmap sq: %w", err)
	}
	defer unix.Munmap(sq)
	cq, err := unix.Mmap(int(ring), ioringOffCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("mmap cq: %w", err)
	}
	defer unix.Munmap(cq)
	sqes, err := unix.Mmap(int(ring), ioringOffSQEs, int(p.SQEntries)*int(unsafe.Sizeof(sqe{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("mmap sqes: %w", err)
	}
	defer unix.Munmap(sqes)

	sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Port: htons(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	*(*sqe)(unsafe.Pointer(&sqes[0])) = sqe{Opcode: ioringOpConnect, Fd: int32(fd), Off: uint64(unsafe.Sizeof(sa)), Addr: uint64(uintptr(unsafe.Pointer(&sa))), UserData: 1}
	tail := (*uint32)(unsafe.Pointer(&sq[p.SQOff.Tail]))
	mask := *(*uint32)(unsafe.Pointer(&sq[p.SQOff.RingMask]))
	t := atomic.LoadUint32(tail)
	*(*uint32)(unsafe.Pointer(&sq[p.SQOff.Array+(t&mask)*4])) = 0
	atomic.StoreUint32(tail, t+1)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, ring, 1, 1, ioringEnterGetEvt, 0, 0); errno != 0 {
		return fmt.Errorf("io_uring_enter: %w", errno)
	}
	head := atomic.LoadUint32((*uint32)(unsafe.Pointer(&cq[p.CQOff.Head])))
	cmask := *(*uint32)(unsafe.Pointer(&cq[p.CQOff.RingMask]))
	c := (*cqe)(unsafe.Pointer(&cq[p.CQOff.Cqes+(head&cmask)*uint32(unsafe.Sizeof(cqe{}))]))
	res := c.Res
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&cq[p.CQOff.Head])), head+1)
	runtime.KeepAlive(&sa)
	if res < 0 {
		return fmt.Errorf("io_uring connect: %w", syscall.Errno(-res))
	}
	_, _ = unix.Write(fd, []byte("escaped\n"))
	return nil
}
