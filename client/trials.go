package client

import (
	"context"

	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/trial"
)

// Trials is the Trial API. An Agent serves it in process, and a Client
// serves it over the agent's control socket, so that a caller (trialnet
// run, a test, an embedder) is written once for both. Every call takes a
// context, which bounds it (a Client's request is cancelled with it) and
// names the caller where the API needs to know (agent.WithCallerUID;
// over the socket, the peer's credentials).
type Trials interface {
	Create(ctx context.Context, req trial.Request) (TrialInfo, error)
	List(ctx context.Context) ([]TrialInfo, error)
	Get(ctx context.Context, id string) (TrialInfo, error)
	Stats(ctx context.Context, id string) (Stats, error)
	// AddContainer records a container an OCI runtime starts in the
	// Trial, which its layers then report.
	AddContainer(ctx context.Context, id string, c Container) (TrialInfo, error)
	// ContainerTrial makes a Trial around a container from a profile,
	// which ends with the container.
	ContainerTrial(ctx context.Context, req ContainerTrial) (TrialInfo, error)
	// EndContainer says that a container ended.
	EndContainer(ctx context.Context, id string) (ContainerEnd, error)
	Destroy(ctx context.Context, id string) (Stats, error)
	// DestroyExit is Destroy saying how the Trial's command ended, for
	// its receipt.
	DestroyExit(ctx context.Context, id string, exit *int) (Stats, error)
	// Watch calls fn with each decision of a live Trial as it is made,
	// until ctx ends or the Trial is destroyed.
	Watch(ctx context.Context, id string, fn func(record.Event)) error
	Audit(ctx context.Context, id string) ([]record.Event, error)
	ChangeAllow(ctx context.Context, id string, ch AllowChange) (AllowChanged, error)
	Reload(ctx context.Context, req ReloadRequest) (ReloadResult, error)
	Health(ctx context.Context) (Health, error)
}
