//go:build linux

package sandbox

import "golang.org/x/sys/unix"

// startSlack is the timer slack this process started with: read by the
// package's initialisation, which runs on the main thread before any
// thread's slack was changed (`run` widens the runtime monitor's later).
var startSlack, _ = unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)

// keepStartSlack gives the calling locked thread the slack the process
// started with, before it forks a Trial's process: a thread inherits its
// creator's slack, the runtime's monitor makes threads too, and a fork
// hands the forking thread's slack to the Trial, where its timers would
// fire late by the monitor's slack.
func keepStartSlack() {
	if startSlack > 0 {
		_ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(startSlack), 0, 0, 0)
	}
}
