//go:build linux

package ocihook

import (
	"os"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Kmsg is the kernel's log device: a hook's refusal written there is on
// the console of a host (or a VM) with no syslog, where crun reports
// only the hook's exit status.
const Kmsg = "/dev/kmsg"

// kmsgMax bounds a refusal's record, its prefix included: the kernel
// keeps a record of under 1024 bytes (LOG_LINE_MAX) and cuts the rest.
const kmsgMax = 512

// kmsgPrefix names trialnet's records in the kernel's log; "<3>" is
// KERN_ERR, which a console at a quiet loglevel (4, Debian's) shows.
const kmsgPrefix = "<3>trialnet oci-hook: "

// KmsgRecord is msg as one record for Kmsg: control characters (a
// newline in an annotation key would forge a second record) and invalid
// UTF-8 each become '?', and a long msg is cut at a character and ends
// with "...". msg is what the hook says on its standard error: the
// container's id and the reasons, never its environment.
func KmsgRecord(msg string) []byte {
	line := strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return '?'
		}
		return r
	}, msg)
	const cut = "..."
	if room := kmsgMax - len(kmsgPrefix) - len("\n"); len(line) > room {
		n := room - len(cut)
		for n > 0 && !utf8.RuneStart(line[n]) {
			n--
		}
		line = line[:n] + cut
	}
	return []byte(kmsgPrefix + line + "\n")
}

// WriteKmsg writes msg's record (KmsgRecord) to the kernel log device
// at path, in one write, as the kernel takes one record per write.
func WriteKmsg(path, msg string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(KmsgRecord(msg))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
