//go:build linux

package promtext

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// GoFamilies returns the Go runtime's families under the names, types
// and help texts the client library's default Go collector gives them
// (collectors.NewGoCollector in client_golang 1.25), with the same
// values: the go_memstats_* from runtime.ReadMemStats, which the runtime
// computes from the sources the collector reads through runtime/metrics.
func GoFamilies() []Family {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gc := debug.GCStats{PauseQuantiles: make([]time.Duration, 5)}
	debug.ReadGCStats(&gc)
	rm := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}, {Name: "/sched/gomaxprocs:threads"}}
	metrics.Read(rm)
	threads, _ := runtime.ThreadCreateProfile(nil)
	summary := Series{Sum: gc.PauseTotal.Seconds(), Count: uint64(gc.NumGC)}
	for i, q := range gc.PauseQuantiles {
		summary.Quantiles = append(summary.Quantiles, Quantile{Quantile: float64(i) / 4, Value: q.Seconds()})
	}
	gauge := func(name, help string, v float64) Family {
		return Family{Name: name, Help: help, Type: Gauge, Series: []Series{{Value: v}}}
	}
	counter := func(name, help string, v float64) Family {
		return Family{Name: name, Help: help, Type: Counter, Series: []Series{{Value: v}}}
	}
	return []Family{
		{Name: "go_gc_duration_seconds", Help: "A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.", Type: Summary, Series: []Series{summary}},
		gauge("go_gc_gogc_percent", "Heap size target percentage configured by the user, otherwise 100. This value is set by the GOGC environment variable, and the runtime/debug.SetGCPercent function. Sourced from /gc/gogc:percent.", rmValue(rm[0])),
		gauge("go_gc_gomemlimit_bytes", "Go runtime memory limit configured by the user, otherwise math.MaxInt64. This value is set by the GOMEMLIMIT environment variable, and the runtime/debug.SetMemoryLimit function. Sourced from /gc/gomemlimit:bytes.", rmValue(rm[1])),
		gauge("go_goroutines", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine())),
		{Name: "go_info", Help: "Information about the Go environment.", Type: Gauge, Series: []Series{{Labels: []Label{{"version", runtime.Version()}}, Value: 1}}},
		gauge("go_memstats_alloc_bytes", "Number of bytes allocated in heap and currently in use. Equals to /memory/classes/heap/objects:bytes.", float64(ms.Alloc)),
		counter("go_memstats_alloc_bytes_total", "Total number of bytes allocated in heap until now, even if released already. Equals to /gc/heap/allocs:bytes.", float64(ms.TotalAlloc)),
		gauge("go_memstats_buck_hash_sys_bytes", "Number of bytes used by the profiling bucket hash table. Equals to /memory/classes/profiling/buckets:bytes.", float64(ms.BuckHashSys)),
		counter("go_memstats_frees_total", "Total number of heap objects frees. Equals to /gc/heap/frees:objects + /gc/heap/tiny/allocs:objects.", float64(ms.Frees)),
		gauge("go_memstats_gc_sys_bytes", "Number of bytes used for garbage collection system metadata. Equals to /memory/classes/metadata/other:bytes.", float64(ms.GCSys)),
		gauge("go_memstats_heap_alloc_bytes", "Number of heap bytes allocated and currently in use, same as go_memstats_alloc_bytes. Equals to /memory/classes/heap/objects:bytes.", float64(ms.HeapAlloc)),
		gauge("go_memstats_heap_idle_bytes", "Number of heap bytes waiting to be used. Equals to /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.", float64(ms.HeapIdle)),
		gauge("go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes", float64(ms.HeapInuse)),
		gauge("go_memstats_heap_objects", "Number of currently allocated objects. Equals to /gc/heap/objects:objects.", float64(ms.HeapObjects)),
		gauge("go_memstats_heap_released_bytes", "Number of heap bytes released to OS. Equals to /memory/classes/heap/released:bytes.", float64(ms.HeapReleased)),
		gauge("go_memstats_heap_sys_bytes", "Number of heap bytes obtained from system. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes + /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.", float64(ms.HeapSys)),
		gauge("go_memstats_last_gc_time_seconds", "Number of seconds since 1970 of last garbage collection.", float64(gc.LastGC.UnixNano())/1e9),
		counter("go_memstats_mallocs_total", "Total number of heap objects allocated, both live and gc-ed. Semantically a counter version for go_memstats_heap_objects gauge. Equals to /gc/heap/allocs:objects + /gc/heap/tiny/allocs:objects.", float64(ms.Mallocs)),
		gauge("go_memstats_mcache_inuse_bytes", "Number of bytes in use by mcache structures. Equals to /memory/classes/metadata/mcache/inuse:bytes.", float64(ms.MCacheInuse)),
		gauge("go_memstats_mcache_sys_bytes", "Number of bytes used for mcache structures obtained from system. Equals to /memory/classes/metadata/mcache/inuse:bytes + /memory/classes/metadata/mcache/free:bytes.", float64(ms.MCacheSys)),
		gauge("go_memstats_mspan_inuse_bytes", "Number of bytes in use by mspan structures. Equals to /memory/classes/metadata/mspan/inuse:bytes.", float64(ms.MSpanInuse)),
		gauge("go_memstats_mspan_sys_bytes", "Number of bytes used for mspan structures obtained from system. Equals to /memory/classes/metadata/mspan/inuse:bytes + /memory/classes/metadata/mspan/free:bytes.", float64(ms.MSpanSys)),
		gauge("go_memstats_next_gc_bytes", "Number of heap bytes when next garbage collection will take place. Equals to /gc/heap/goal:bytes.", float64(ms.NextGC)),
		gauge("go_memstats_other_sys_bytes", "Number of bytes used for other system allocations. Equals to /memory/classes/other:bytes.", float64(ms.OtherSys)),
		gauge("go_memstats_stack_inuse_bytes", "Number of bytes obtained from system for stack allocator in non-CGO environments. Equals to /memory/classes/heap/stacks:bytes.", float64(ms.StackInuse)),
		gauge("go_memstats_stack_sys_bytes", "Number of bytes obtained from system for stack allocator. Equals to /memory/classes/heap/stacks:bytes + /memory/classes/os-stacks:bytes.", float64(ms.StackSys)),
		gauge("go_memstats_sys_bytes", "Number of bytes obtained from system. Equals to /memory/classes/total:byte.", float64(ms.Sys)),
		gauge("go_sched_gomaxprocs_threads", "The current runtime.GOMAXPROCS setting, or the number of operating system threads that can execute user-level Go code simultaneously. Sourced from /sched/gomaxprocs:threads.", rmValue(rm[2])),
		gauge("go_threads", "Number of OS threads created.", float64(threads)),
	}
}

func rmValue(s metrics.Sample) float64 {
	switch s.Value.Kind() {
	case metrics.KindUint64:
		return float64(s.Value.Uint64())
	case metrics.KindFloat64:
		return s.Value.Float64()
	}
	return 0
}

// userHZ is the kernel's clock tick for /proc's times (USER_HZ, 100 on
// every architecture Linux exposes to user space), as procfs assumes.
const userHZ = 100

// ProcessFamilies returns this process's families under the names,
// types and help texts of the client library's process collector, read
// from /proc as its procfs reads them. A file that cannot be read leaves
// its families out, as the collector does when it reports no errors.
func ProcessFamilies() []Family {
	gauge := func(name, help string, v float64) Family {
		return Family{Name: name, Help: help, Type: Gauge, Series: []Series{{Value: v}}}
	}
	var out []Family
	if st, ok := procStat(); ok {
		out = append(out,
			Family{Name: "process_cpu_seconds_total", Help: "Total user and system CPU time spent in seconds.", Type: Counter, Series: []Series{{Value: st.cpu}}},
			gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", st.vsize),
			gauge("process_resident_memory_bytes", "Resident memory size in bytes.", st.rss))
		if boot, ok := bootTime(); ok {
			out = append(out, gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", boot+st.start))
		}
	}
	if fds, ok := openFDs(); ok {
		out = append(out, gauge("process_open_fds", "Number of open file descriptors.", fds))
	}
	if files, space, ok := limits(); ok {
		out = append(out,
			gauge("process_max_fds", "Maximum number of open file descriptors.", files),
			gauge("process_virtual_memory_max_bytes", "Maximum amount of virtual memory available in bytes.", space))
	}
	if in, out2, ok := ipOctets(); ok {
		out = append(out,
			Family{Name: "process_network_receive_bytes_total", Help: "Number of bytes received by the process over the network.", Type: Counter, Series: []Series{{Value: in}}},
			Family{Name: "process_network_transmit_bytes_total", Help: "Number of bytes sent by the process over the network.", Type: Counter, Series: []Series{{Value: out2}}})
	}
	return out
}

// openFDs counts this process's descriptors as procfs does: the size
// of /proc/self/fd (Linux 6.2+), else its entries, the directory's own
// descriptor, open while it is read, among them.
func openFDs() (float64, bool) {
	if fi, err := os.Stat("/proc/self/fd"); err == nil && fi.Size() > 0 {
		return float64(fi.Size()), true
	}
	fds, err := os.ReadDir("/proc/self/fd")
	return float64(len(fds)), err == nil
}

type stat struct{ cpu, vsize, rss, start float64 }

// procStat reads /proc/self/stat: utime and stime (fields 14, 15),
// starttime (22), vsize (23) and rss in pages (24), counted from the
// first field after the command, which may hold spaces and parentheses.
func procStat() (stat, bool) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return stat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, false
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, the state
	if len(f) < 22 {
		return stat{}, false
	}
	n := func(field int) float64 {
		v, _ := strconv.ParseUint(f[field-3], 10, 64)
		return float64(v)
	}
	return stat{
		cpu:   (n(14) + n(15)) / userHZ,
		start: n(22) / userHZ,
		vsize: n(23),
		rss:   n(24) * float64(os.Getpagesize()),
	}, true
}

// bootTime is /proc/stat's btime.
func bootTime() (float64, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			t, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return float64(t), err == nil
		}
	}
	return 0, false
}

// limits reads the soft limits on open files and address space from
// /proc/self/limits ("unlimited": the largest uint64, as procfs reads it).
func limits() (files, space float64, ok bool) {
	f, err := os.Open("/proc/self/limits")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	var gotFiles, gotSpace bool
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		var dst *float64
		var got *bool
		switch {
		case strings.HasPrefix(line, "Max open files "):
			dst, got = &files, &gotFiles
		case strings.HasPrefix(line, "Max address space "):
			dst, got = &space, &gotSpace
		default:
			continue
		}
		// The name, then soft, hard and units in columns from byte 26.
		cols := strings.Fields(line[min(len(line), 26):])
		if len(cols) == 0 {
			return 0, 0, false
		}
		if cols[0] == "unlimited" {
			*dst = float64(^uint64(0))
		} else if v, err := strconv.ParseUint(cols[0], 10, 64); err == nil {
			*dst = float64(v)
		} else {
			return 0, 0, false
		}
		*got = true
	}
	return files, space, gotFiles && gotSpace && sc.Err() == nil
}

// ipOctets reads InOctets and OutOctets of the IpExt lines of
// /proc/self/net/netstat: the bytes of this process's network namespace.
func ipOctets() (in, out float64, ok bool) {
	b, err := os.ReadFile("/proc/self/net/netstat")
	if err != nil {
		return 0, 0, false
	}
	var names []string
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, found := strings.CutPrefix(line, "IpExt: ")
		if !found {
			continue
		}
		if names == nil {
			names = strings.Fields(rest)
			continue
		}
		for i, v := range strings.Fields(rest) {
			if i >= len(names) {
				break
			}
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				continue
			}
			switch names[i] {
			case "InOctets":
				in = x
			case "OutOctets":
				out = x
			}
		}
		return in, out, true
	}
	return 0, 0, false
}
