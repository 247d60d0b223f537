//go:build linux

package ocihook

// HookTimeout bounds a hook's run as the runtime counts it, in seconds,
// for a runtime wrapper that writes the hook into a bundle itself.
const HookTimeout = hookTimeout

// DecodeStrict decodes one JSON value and refuses an object that holds a
// key twice (compared as Go's decoder folds case): what the hook reads of
// a bundle, a wrapper that rewrites the bundle reads the same way.
func DecodeStrict(b []byte, v any) error { return decodeStrict(b, v) }
