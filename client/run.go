package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/trial"
)

// ExitTimeout is a run's exit code when its deadline passed: everything
// in the Trial was killed (timeout(1)'s code).
const ExitTimeout = 124

// RunSpec is one command in an ephemeral Trial.
type RunSpec struct {
	// Create describes the Trial; Run makes it owned, so that it ends
	// with this process however that ends (an in-process agent records
	// this process as its owner, for the next agent to see).
	Create trial.Request
	// Launch runs the command in the Trial once it is made (agent.Launch
	// does, with the sandbox); its proxy variables, socket rule and
	// process limit come from the Trial.
	Launch Launcher
	// Timeout bounds the run, wall clock, suspended or not (0: none).
	Timeout time.Duration
	// Signals, if set, starts forwarding signals to the command, from
	// when it starts until it ends (stop).
	Signals func() (sigs <-chan os.Signal, stop func())
	// OnDecision, if set, is called with each decision as it is made.
	OnDecision func(record.Event)
}

// A Launcher starts the command of a run in its Trial. It is the part of
// Run that needs the sandbox: this package leaves it to the caller
// (agent.Launch), so that a harness that only asks for Trials links none
// of it.
type Launcher interface {
	// Exec runs the command in the Trial info describes until it exits,
	// forwarding sigs to it, and returns its exit code. An error that is
	// a StartError means it never ran.
	Exec(ctx context.Context, info TrialInfo, sigs <-chan os.Signal) (int, error)
	// WatchDeadline starts what kills everything in the Trial once
	// deadline passes, even while this process is stopped (^Z) or
	// blocked; release ends the watch.
	WatchDeadline(info TrialInfo, deadline time.Time) (release func(), err error)
}

// StartError is a Launcher's error for a command that never ran
// (sandbox.StartError is one): StartCode is its exit code, a shell's for
// the same failure (126: not executable, 127: not found).
type StartError interface {
	error
	StartCode() int
}

// RunResult is how a run ended.
type RunResult struct {
	Info     TrialInfo
	Exit     int  // the command's exit code, ExitTimeout, or why it could not start (StartError's StartCode)
	TimedOut bool // Timeout passed: Exit is ExitTimeout
	// Err is what went wrong in running the command after it started,
	// DestroyErr what went wrong in tearing the Trial down.
	Err, DestroyErr error
	Stats           Stats // the final stats, with the signed receipt
	Took            time.Duration
}

// Run makes an owned Trial through t, has spec.Launch run its command
// until it exits or the timeout passes, and destroys the Trial, recording
// the exit in its receipt. The error is for a run that never got its
// command going: the Trial could not be made, the timeout's watchdog
// could not start, or the command could not start (a StartError, with
// Exit set and the Trial destroyed).
func Run(ctx context.Context, t Trials, spec RunSpec) (RunResult, error) {
	req := spec.Create
	req.Owned = true
	info, err := t.Create(ctx, req)
	if err != nil {
		return RunResult{}, err
	}
	res := RunResult{Info: info}
	start := time.Now()
	// Teardown is not the run's to cancel: a destroy after the deadline
	// or a cancelled run must still happen.
	bg := context.WithoutCancel(ctx)
	stopWatch := watchDecisions(bg, t, info.ID, spec.OnDecision)
	defer stopWatch()
	var deadline time.Time
	if spec.Timeout > 0 {
		deadline = start.Add(spec.Timeout)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
		// This process's own timer cannot fire while it is stopped (^Z)
		// or blocked: a process of its own enforces the deadline too.
		release, err := spec.Launch.WatchDeadline(info, deadline)
		if err != nil {
			_, derr := t.DestroyExit(bg, info.ID, nil)
			return res, errors.Join(fmt.Errorf("%w; a timeout needs it, so the command was not started (run without one to go without)", err), derr)
		}
		defer release()
	}
	var sigs <-chan os.Signal
	stopSignals := func() {}
	if spec.Signals != nil {
		sigs, stopSignals = spec.Signals()
	}
	res.Exit, res.Err = spec.Launch.Exec(ctx, info, sigs)
	stopSignals() // the command is over: signals are this process's again
	// Not ctx.Err(): continued by the watchdog after the deadline, this
	// process may get here before its own timer has fired.
	res.TimedOut = !deadline.IsZero() && !time.Now().Before(deadline)
	var se StartError
	switch {
	case errors.As(res.Err, &se):
		res.Exit = se.StartCode()
	case res.TimedOut:
		res.Exit = ExitTimeout
	}
	res.Stats, res.DestroyErr = t.DestroyExit(bg, info.ID, &res.Exit)
	res.Took = time.Since(start)
	stopWatch()
	if se != nil {
		return res, errors.Join(res.Err, res.DestroyErr)
	}
	return res, nil
}

// watchDecisions calls fn with each decision of Trial id until it is
// destroyed; stop waits (briefly) for the last of them. fn nil: nothing.
func watchDecisions(ctx context.Context, t Trials, id string, fn func(record.Event)) (stop func()) {
	if fn == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = t.Watch(ctx, id, fn)
	}()
	var once bool
	return func() {
		if once {
			return
		}
		once = true
		select {
		case <-done: // the Trial is gone and its last decision was seen
		case <-time.After(2 * time.Second):
		}
		cancel()
		<-done
	}
}
