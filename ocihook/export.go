//go:build linux

package ocihook

// HookTimeout bounds a hook's run as the runtime counts it, in seconds,
// for a runtime wrapper that writes the hook into a bundle itself.
const HookTimeout = hookTimeout

// DecodeStrict decodes one JSON value and refuses an object that holds a
// key twice (compared as Go's decoder folds case): what the hook reads of
// a bundle, a wrapper that rewrites the bundle reads the same way.
func DecodeStrict(b []byte, v any) error { return decodeStrict(b, v) }

// RefusedCaps are the capabilities among names that let a process in a
// Trial leave it, as the hook says them (a name that is not one
// included): for a runtime wrapper that judges an exec, which runs no
// hook.
func RefusedCaps(names []string) []string {
	c := config{Process: &processOf{Capabilities: &capsOf{Bounding: names}}}
	return c.refusedCapsOf()
}
