//go:build linux

// Package timerslack widens the kernel's timer slack of every thread of
// this process.
//
// Why: while a Go process is busy, the runtime's sysmon thread sleeps in
// 20 µs steps, and every network syscall after an idle moment wakes it
// from its deep sleep. A proxy that serves one CONNECT at a time goes
// idle and busy several times per CONNECT, so sysmon wakes about ten
// times per tunnel; on a VM each wake is a timer exit and two context
// switches. A 1 ms slack lets the kernel fire those sleeps late and
// together. Measured on the 2-core VM of the benchmark: 14.7 → 9.4
// context switches and −13 % CPU per sequential tunnel.
//
// The cost is that this process's timers may fire up to the slack late.
// The proxy's timers are deadlines of seconds and a 250 ms fallback, so
// that is invisible. The slack is inherited by child processes: only
// processes that start none (the agent, the standalone proxy) set it.
package timerslack

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Proxy is the slack the serving processes use.
const Proxy = time.Millisecond

// Monitor is the slack `trialnet proxy` gives the runtime's monitor
// thread alone (SetMonitor): its longest sleep, 10 ms. After each wake
// from its deep sleep, sysmon then sleeps once, about that long, instead
// of every millisecond until the process is idle again at one of its
// checks; the wakes and sleeps the proxy pays per sequential CONNECT
// mostly go. Every other thread keeps Proxy: the scheduler's own short
// sleeps (a few µs before it steals work) last up to a thread's slack,
// and 10 ms on all threads cost 0.86× the tunnels/s with 64 clients.
// What a slower monitor delays: handing the P of a goroutine blocked in
// a system call to another (the proxy's are non-blocking but for its
// records' writes), and preempting a goroutine that runs 10 ms.
const Monitor = 10 * time.Millisecond

// Set gives every thread of this process the slack d. Threads that Go
// starts later inherit it from the thread that starts them. Changing
// another thread's slack needs CAP_SYS_NICE; a process started with d
// (systemd's TimerSlackNSec) needs nothing. Without either, the error says so
// and the process keeps the default slack, which is only slower.
func Set(d time.Duration) error {
	// Go never changes a thread's slack, and every thread descends from
	// the first: if this one already has d, the process was started with
	// it (systemd's TimerSlackNSec) and every thread has it.
	if cur, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0); err == nil && int64(cur) == d.Nanoseconds() {
		return nil
	}
	ns := []byte(strconv.FormatInt(d.Nanoseconds(), 10))
	done := map[string]bool{}
	// A thread started during a pass may inherit the old slack from a
	// thread not yet changed: pass again until no thread is new.
	for pass := 0; pass < 10; pass++ {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("timer slack: list this process's threads: %w", err)
		}
		fresh := 0
		for _, t := range tasks {
			if done[t.Name()] {
				continue
			}
			// /proc/<tid>/timerslack_ns: the task/ directories have no such file.
			err := os.WriteFile("/proc/"+t.Name()+"/timerslack_ns", ns, 0)
			if err != nil && !os.IsNotExist(err) && !errors.Is(err, syscall.ESRCH) { // gone: nothing to set
				return fmt.Errorf("set thread %s's timer slack: %w (needs CAP_SYS_NICE, or a process started with the slack: systemd-run -p TimerSlackNSec=%s)", t.Name(), err, d)
			}
			done[t.Name()] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
	}
	return fmt.Errorf("timer slack: threads kept starting while it was being set")
}

// Launcher is the slack `run` gives the monitor thread alone: a run's
// many short system calls keep sysmon in its 20 µs sleeps, 6 % of an
// embedded `run -- true`'s CPU on the benchmark's VM (each sleep a timer
// exit there). A quarter millisecond lets those sleeps end together and
// delays the handing over of a P from a blocked system call by at most
// that; Monitor's 10 ms made the run half again as long.
const Launcher = 250 * time.Microsecond

// SetMonitor gives the runtime's monitor thread (sysmon) the slack d.
// It is the process's first thread after the main one: the runtime
// starts it before anything else (runtime.main), with one thread
// running. Were it another thread, that one's timers would be late by
// up to d: slower, nothing else.
func SetMonitor(d time.Duration) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("timer slack: list this process's threads: %w", err)
	}
	monitor := monitorThread(os.Getpid(), tasks)
	if monitor == 0 {
		return fmt.Errorf("timer slack: this process has no thread but its first, so no monitor thread")
	}
	ns := strconv.FormatInt(d.Nanoseconds(), 10)
	if err := os.WriteFile("/proc/"+strconv.Itoa(monitor)+"/timerslack_ns", []byte(ns), 0); err != nil {
		return fmt.Errorf("set the monitor thread %d's timer slack: %w (needs CAP_SYS_NICE)", monitor, err)
	}
	return nil
}

// monitorThread picks the thread started first after the main one: the
// one whose id follows the process's id most closely. Ids are handed out
// in turn and wrap at pid_max (at most 2^22), so the distance is taken
// modulo 2^22: a thread whose id wrapped past pid_max counts as later.
func monitorThread(pid int, tasks []os.DirEntry) int {
	const idSpace = 1 << 22
	monitor, nearest := 0, idSpace
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil || tid == pid {
			continue
		}
		if dist := (tid - pid + idSpace) % idSpace; dist < nearest {
			monitor, nearest = tid, dist
		}
	}
	return monitor
}
