//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// stepResult is what one step of the plan did in one guest.
type stepResult struct {
	Name    string
	Exit    int // -1: never ended (the guest died or timed out)
	Seconds float64
	Passed  []string
	Failed  []string
	Skipped []string
	GoTest  bool
}

// guestResult is one guest's results port, parsed.
type guestResult struct {
	Release string
	LSMs    string
	Done    bool // the guest reached the end of its plan
	Steps   []*stepResult
}

// A go test -test.v line that ends a test or subtest; its indentation
// says how deep it is.
var testEnd = regexp.MustCompile(`^(\s*)--- (PASS|FAIL|SKIP): (\S+) \(`)

// parseResults reads the framed output of a guest; output holds each
// step's raw text by name, for the failure report.
func parseResults(r io.Reader, gotest map[string]bool) (*guestResult, map[string]string) {
	g := &guestResult{}
	output := map[string]string{}
	var cur *stepResult
	var text strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		switch {
		case strings.HasPrefix(line, markHeader):
			rel, lsm, _ := strings.Cut(strings.TrimPrefix(line, markHeader), " lsm=")
			g.Release, g.LSMs = rel, lsm
		case line == markDone:
			g.Done = true
		case strings.HasPrefix(line, markBegin):
			name := strings.TrimPrefix(line, markBegin)
			cur = &stepResult{Name: name, Exit: -1, GoTest: gotest[name]}
			g.Steps = append(g.Steps, cur)
			text.Reset()
		case cur != nil && strings.HasPrefix(line, markEnd+cur.Name+" exit="):
			for _, f := range strings.Fields(strings.TrimPrefix(line, markEnd+cur.Name)) {
				k, v, _ := strings.Cut(f, "=")
				switch k {
				case "exit":
					cur.Exit, _ = strconv.Atoi(v)
				case "seconds":
					cur.Seconds, _ = strconv.ParseFloat(v, 64)
				}
			}
			output[cur.Name] = text.String()
			cur = nil
		case cur != nil:
			text.WriteString(line)
			text.WriteByte('\n')
			if m := testEnd.FindStringSubmatch(line); m != nil && cur.GoTest {
				// Top-level tests are counted; failed subtests are
				// named as well, as they say where.
				top := m[1] == ""
				switch {
				case m[2] == "FAIL":
					cur.Failed = append(cur.Failed, m[3])
				case m[2] == "PASS" && top:
					cur.Passed = append(cur.Passed, m[3])
				case m[2] == "SKIP" && top:
					cur.Skipped = append(cur.Skipped, m[3])
				}
			}
		}
	}
	if cur != nil {
		output[cur.Name] = text.String()
	}
	return g, output
}

// ok reports whether the step passed: it ended, with exit 0 and no
// failed test.
func (s *stepResult) ok() bool { return s.Exit == 0 && len(s.Failed) == 0 }

func (s *stepResult) counts() string {
	if !s.GoTest {
		return "-\t-\t-"
	}
	return fmt.Sprintf("%d\t%d\t%d", len(s.Passed), len(s.Failed), len(s.Skipped))
}
