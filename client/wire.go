//go:build linux

package client

import "github.com/trialnet/trialnet/internal/agentwire"

// The control API's wire types live in agentwire, which links no
// net/http, so that trialnet-oci (on every container's start path) starts
// without it; client names them as before. Those that carry record's
// counters or a receipt's signature are client's own (receipt.go):
// trialnet-oci reads none of them.
type (
	TrialInfo         = agentwire.TrialInfo
	Error             = agentwire.Error
	AllowChange       = agentwire.AllowChange
	AllowChanged      = agentwire.AllowChanged
	ReloadRequest     = agentwire.ReloadRequest
	ReloadResult      = agentwire.ReloadResult
	Health            = agentwire.Health
	Layers            = agentwire.Layers
	Container         = agentwire.Container
	ContainerTrial    = agentwire.ContainerTrial
	ContainerPrepare  = agentwire.ContainerPrepare
	PreparedContainer = agentwire.PreparedContainer
	DNSStats          = agentwire.DNSStats
)

// The control API's error codes, the Layers texts and the receipt's
// schema.
const (
	CodeBadRequest        = agentwire.CodeBadRequest
	CodeBadID             = agentwire.CodeBadID
	CodeUnknownProfile    = agentwire.CodeUnknownProfile
	CodeBadAllowlist      = agentwire.CodeBadAllowlist
	CodeDuplicateID       = agentwire.CodeDuplicateID
	CodeUnknownTrial      = agentwire.CodeUnknownTrial
	CodeInternal          = agentwire.CodeInternal
	CodeNotRoot           = agentwire.CodeNotRoot
	CodeHandedOver        = agentwire.CodeHandedOver
	CodeBadConfig         = agentwire.CodeBadConfig
	ContainerLayers       = agentwire.ContainerLayers
	AroundContainerLayers = agentwire.AroundContainerLayers
)

// DefaultSocket is the agent's control socket.
const DefaultSocket = agentwire.DefaultSocket

// ErrNoAgent means no agent answers on the control socket.
var ErrNoAgent = agentwire.ErrNoAgent
