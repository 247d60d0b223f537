package lname

import (
	"slices"
	"testing"
)

// Each name goes on the wire as the string an earlier build writes and
// reads back as itself.
func TestNameWire(t *testing.T) {
	for _, c := range []struct {
		n    Name
		wire string
	}{
		{MetricsName(), "metrics"},
		{EndpointName("t1", 0), "trial:t1:0"},
		{EndpointName("a-b_c", 12), "trial:a-b_c:12"},
		{CountsName(""), "counts"},
		{CountsName("t1"), "counts:t1"},
		{TransparentName("t1", StubUDP), "trial:t1:dns-udp"},
		{TransparentName("t1", StubTCP), "trial:t1:dns-tcp"},
		{TransparentName("t1", Steered), "trial:t1:steer"},
	} {
		if got := c.n.String(); got != c.wire {
			t.Errorf("%+v is %q on the wire, want %q", c.n, got, c.wire)
		}
		back, err := Parse(c.wire)
		if err != nil || back != c.n {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.wire, back, err, c.n)
		}
	}
}

// Parse takes only what String writes: a name it does not know, or one
// whose Trial id could not be a Trial's (a path, another separator), is
// refused, and its file is closed by whoever got it.
func TestNameParseRefuses(t *testing.T) {
	for _, s := range []string{
		"", "metrics:", "metrics:x", "Metrics", "control", "trial", "trial:", "trial:t1",
		"trial:t1:", "trial::0", "trial:t1:-1", "trial:t1:01", "trial:t1:+1", "trial:t1:1:2",
		"trial:T1:0", "trial:../x:0", "trial:t1:0x1", "counts:", "counts:../x", "counts:t1:0",
		"trial:t1: 1", " metrics", "trial:t1:dns", "trial:T1:steer", "trial::steer", "trial:t1:steer:0", "counts:t1:steer",
	} {
		if n, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) = %+v; want a refusal", s, n)
		}
	}
}

// Less puts a Trial's endpoints together in index order, 2 before 10.
func TestNameLess(t *testing.T) {
	got := []Name{EndpointName("b", 10), CountsName("a"), EndpointName("b", 2), MetricsName(), EndpointName("a", 1)}
	slices.SortFunc(got, func(x, y Name) int {
		if Less(x, y) {
			return -1
		}
		if Less(y, x) {
			return 1
		}
		return 0
	})
	want := []Name{MetricsName(), EndpointName("a", 1), EndpointName("b", 2), EndpointName("b", 10), CountsName("a")}
	if !slices.Equal(got, want) {
		t.Errorf("sorted: %v, want %v", got, want)
	}
}
