package kubernetes

import (
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const nriManifest = "trialnet-nri.yaml"

// nriDaemonSet is what the NRI plugin's deployment relies on.
type nriDaemonSet struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Namespace string `yaml:"namespace"`
	} `yaml:"metadata"`
	Spec struct {
		UpdateStrategy struct {
			RollingUpdate struct {
				MaxSurge       int `yaml:"maxSurge"`
				MaxUnavailable int `yaml:"maxUnavailable"`
			} `yaml:"rollingUpdate"`
		} `yaml:"updateStrategy"`
		Template struct {
			Metadata struct {
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec struct {
				HostPID                      bool  `yaml:"hostPID"`
				HostNetwork                  bool  `yaml:"hostNetwork"`
				HostIPC                      bool  `yaml:"hostIPC"`
				AutomountServiceAccountToken *bool `yaml:"automountServiceAccountToken"`
				Tolerations                  []struct {
					Key    string `yaml:"key"`
					Effect string `yaml:"effect"`
				} `yaml:"tolerations"`
				Containers []struct {
					Name            string   `yaml:"name"`
					Image           string   `yaml:"image"`
					Command         []string `yaml:"command"`
					SecurityContext struct {
						Privileged               bool  `yaml:"privileged"`
						AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
						ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
						Capabilities             struct {
							Add  []string `yaml:"add"`
							Drop []string `yaml:"drop"`
						} `yaml:"capabilities"`
					} `yaml:"securityContext"`
					VolumeMounts []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
						ReadOnly  bool   `yaml:"readOnly"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
				Volumes []struct {
					Name     string `yaml:"name"`
					HostPath *struct {
						Path string `yaml:"path"`
					} `yaml:"hostPath"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// flagValue is the value given to flag in a command line.
func flagValue(cmd []string, flag string) string {
	if i := slices.Index(cmd, flag); i >= 0 && i+1 < len(cmd) {
		return cmd[i+1]
	}
	return ""
}

// The NRI plugin's DaemonSet: the paths the runtime reads on the node (the
// hook, resolv.conf) are hostPath mounts at the same path in the
// container; the NRI socket's directory is the node's; it sees the
// agent's PID namespace (the control socket's peer check) and nothing
// else of the node's; it holds no capability; its own namespace is exempt
// (its pod never waits on the plugin); a rolling update leaves no moment
// without a plugin.
func TestNRIDaemonSet(t *testing.T) {
	b, err := os.ReadFile(nriManifest)
	if err != nil {
		t.Fatal(err)
	}
	var ds nriDaemonSet
	if err := yaml.Unmarshal(b, &ds); err != nil {
		t.Fatal(err)
	}
	ps := ds.Spec.Template.Spec
	if ds.Kind != "DaemonSet" || len(ps.Containers) != 1 {
		t.Fatalf("kind %q with %d containers: want a DaemonSet with the plugin alone", ds.Kind, len(ps.Containers))
	}
	if !ps.HostPID || ps.HostNetwork || ps.HostIPC {
		t.Errorf("hostPID %v, hostNetwork %v, hostIPC %v: the plugin needs the node's PID namespace only", ps.HostPID, ps.HostNetwork, ps.HostIPC)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Error("the plugin's pod mounts a service account token: it asks nothing of the API server")
	}
	if !slices.ContainsFunc(ps.Tolerations, func(x struct {
		Key    string `yaml:"key"`
		Effect string `yaml:"effect"`
	}) bool {
		return x.Key == "trialnet.io/enforcement" && x.Effect == "NoSchedule"
	}) {
		t.Error("the plugin does not tolerate the enforcement taint: it must run before the pods it places")
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru.MaxSurge != 1 || ru.MaxUnavailable != 0 {
		t.Errorf("rolling update maxSurge %d, maxUnavailable %d: want 1 and 0, no moment without a plugin", ru.MaxSurge, ru.MaxUnavailable)
	}
	c := ps.Containers[0]
	// The plugin's own binary: trialnet nri would exec it, after a start
	// of trialnet for nothing.
	if len(c.Command) == 0 || c.Command[0] != "trialnet-nri" {
		t.Fatalf("command %q: want trialnet-nri", c.Command)
	}
	sc := c.SecurityContext
	if sc.Privileged || len(sc.Capabilities.Add) > 0 || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || !sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("security context %+v: want no privilege nor its escalation, every capability dropped, a read-only root", sc)
	}
	if ns := strings.Split(flagValue(c.Command, "--exempt"), ","); !slices.Contains(ns, ds.Metadata.Namespace) || !slices.Contains(ns, "kube-system") {
		t.Errorf("--exempt %q: the plugin's own namespace %q and kube-system must be exempt", ns, ds.Metadata.Namespace)
	}
	hostPaths := map[string]string{}
	for _, v := range ps.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	// node: the directory must be the node's at the same path (the
	// runtime opens it there); writable: the plugin writes in it.
	for _, want := range []struct {
		flag            string
		node, writeable bool
	}{
		{"--nri-socket", false, false},
		{"--hook-path", true, true},
		{"--resolv-conf", true, true},
	} {
		path := flagValue(c.Command, want.flag)
		found := false
		for _, m := range c.VolumeMounts {
			hp, ok := hostPaths[m.Name]
			if !ok || !strings.HasPrefix(path, m.MountPath+"/") {
				continue
			}
			found = true
			if want.node && hp != m.MountPath {
				t.Errorf("%s %s: mounted from the node's %s at %s, so the runtime would look for it elsewhere", want.flag, path, hp, m.MountPath)
			}
			if want.writeable && m.ReadOnly {
				t.Errorf("%s %s: its mount is read-only", want.flag, path)
			}
		}
		if !found {
			t.Errorf("%s %q is in no hostPath mount", want.flag, path)
		}
	}
	if sock := flagValue(c.Command, "--socket"); sock == "" {
		// The default control socket: its directory must be mounted.
		found := false
		for _, m := range c.VolumeMounts {
			found = found || (m.MountPath == "/run/trialnet" && hostPaths[m.Name] == "/run/trialnet")
		}
		if !found {
			t.Error("the agent's control socket directory /run/trialnet is not mounted")
		}
	}
	repo, tag, _ := splitImage(c.Image)
	_, agentContainers := load(t)
	if ar, at, _ := splitImage(agentContainers["agent"].Image); ar != repo || at != tag {
		t.Errorf("the plugin runs %s, the agent %s: the hook the plugin installs must be the agent's release", c.Image, agentContainers["agent"].Image)
	}
}
