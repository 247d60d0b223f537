// Package nritest holds what the NRI plugin's own tests and the container
// suite both need to play a runtime's part.
package nritest

import "github.com/containerd/nri/pkg/api"

// OCISeccomp is pol as a runtime writes it in config.json, each rule with
// its conditions (the plugin's vsock refusal has them).
func OCISeccomp(pol *api.LinuxSeccomp) map[string]any {
	var rules []map[string]any
	for _, r := range pol.GetSyscalls() {
		rule := map[string]any{"names": r.GetNames(), "action": r.GetAction()}
		if r.GetErrnoRet() != nil {
			rule["errnoRet"] = r.GetErrnoRet().GetValue()
		}
		var args []map[string]any
		for _, a := range r.GetArgs() {
			args = append(args, map[string]any{"index": a.GetIndex(), "value": a.GetValue(), "valueTwo": a.GetValueTwo(), "op": a.GetOp()})
		}
		if args != nil {
			rule["args"] = args
		}
		rules = append(rules, rule)
	}
	return map[string]any{"defaultAction": pol.GetDefaultAction(), "architectures": pol.GetArchitectures(), "syscalls": rules}
}
