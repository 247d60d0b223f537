// Package kubernetes holds the agent's manifests; its test checks offline
// the fields the deployment relies on.
package kubernetes

import (
	"bytes"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type mount struct {
	Name             string `yaml:"name"`
	MountPath        string `yaml:"mountPath"`
	MountPropagation string `yaml:"mountPropagation"`
}

type container struct {
	Name            string   `yaml:"name"`
	Command         []string `yaml:"command"`
	SecurityContext struct {
		Privileged bool `yaml:"privileged"`
	} `yaml:"securityContext"`
	ReadinessProbe struct {
		Exec struct {
			Command []string `yaml:"command"`
		} `yaml:"exec"`
	} `yaml:"readinessProbe"`
	VolumeMounts []mount `yaml:"volumeMounts"`
}

type doc struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Rules []struct {
		Resources []string `yaml:"resources"`
		Verbs     []string `yaml:"verbs"`
	} `yaml:"rules"`
	Spec struct {
		Template struct {
			Spec struct {
				HostPID            bool   `yaml:"hostPID"`
				HostNetwork        bool   `yaml:"hostNetwork"`
				ServiceAccountName string `yaml:"serviceAccountName"`
				Tolerations        []struct {
					Key    string `yaml:"key"`
					Effect string `yaml:"effect"`
				} `yaml:"tolerations"`
				Containers []container `yaml:"containers"`
				Volumes    []struct {
					Name     string `yaml:"name"`
					HostPath *struct {
						Path string `yaml:"path"`
					} `yaml:"hostPath"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func TestAgentDaemonSet(t *testing.T) {
	b, err := os.ReadFile("trialnet-agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	byKind := map[string]doc{}
	for {
		var d doc
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		byKind[d.Kind] = d
	}
	ds, ok := byKind["DaemonSet"]
	if !ok {
		t.Fatal("no DaemonSet")
	}
	ps := ds.Spec.Template.Spec
	if !ps.HostPID || !ps.HostNetwork {
		t.Errorf("hostPID %v, hostNetwork %v: the agent needs both", ps.HostPID, ps.HostNetwork)
	}
	if !slices.ContainsFunc(ps.Tolerations, func(x struct {
		Key    string `yaml:"key"`
		Effect string `yaml:"effect"`
	}) bool {
		return x.Key == "trialnet.io/enforcement" && x.Effect == "NoSchedule"
	}) {
		t.Error("the agent does not tolerate the enforcement taint")
	}
	hostPaths := map[string]string{}
	for _, v := range ps.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	var agent *container
	for i := range ps.Containers {
		if ps.Containers[i].Name == "agent" {
			agent = &ps.Containers[i]
		}
	}
	if agent == nil {
		t.Fatal("no agent container")
	}
	if !agent.SecurityContext.Privileged {
		t.Error("the agent is not privileged: Bidirectional propagation needs it")
	}
	if strings.Join(agent.ReadinessProbe.Exec.Command, " ") != "trialnet doctor" {
		t.Errorf("readiness %q, want trialnet doctor", agent.ReadinessProbe.Exec.Command)
	}
	want := map[string]string{"/sys/fs/bpf": "", "/sys/fs/cgroup": "", "/run/trialnet": "Bidirectional", "/var/lib/trialnet": ""}
	for path, prop := range want {
		found := false
		for _, m := range agent.VolumeMounts {
			if m.MountPath == path && hostPaths[m.Name] == path {
				found = true
				if prop != "" && m.MountPropagation != prop {
					t.Errorf("%s propagation %q, want %s", path, m.MountPropagation, prop)
				}
			}
		}
		if !found {
			t.Errorf("no hostPath mount of %s", path)
		}
	}
	cr := byKind["ClusterRole"]
	if len(cr.Rules) != 1 || !slices.Equal(cr.Rules[0].Resources, []string{"nodes"}) || slices.Contains(cr.Rules[0].Verbs, "delete") {
		t.Errorf("ClusterRole %+v: only get/patch on nodes", cr.Rules)
	}
	if byKind["ServiceAccount"].Metadata.Name != ps.ServiceAccountName {
		t.Errorf("service account %q not defined", ps.ServiceAccountName)
	}
}
