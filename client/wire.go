//go:build linux

package client

import "github.com/trialnet/trialnet/internal/agentwire"

// The control API's wire types live in agentwire, which links no
// net/http, so that trialnet-oci (on every container's start path) starts
// without it; client names them as before.
type (
	Receipt           = agentwire.Receipt
	LogDigest         = agentwire.LogDigest
	SignedReceipt     = agentwire.SignedReceipt
	TrialInfo         = agentwire.TrialInfo
	Error             = agentwire.Error
	AllowChange       = agentwire.AllowChange
	AllowChanged      = agentwire.AllowChanged
	ReloadRequest     = agentwire.ReloadRequest
	ReloadResult      = agentwire.ReloadResult
	Health            = agentwire.Health
	Stats             = agentwire.Stats
	Layers            = agentwire.Layers
	Container         = agentwire.Container
	ContainerTrial    = agentwire.ContainerTrial
	ContainerPrepare  = agentwire.ContainerPrepare
	PreparedContainer = agentwire.PreparedContainer
	ContainerEnd      = agentwire.ContainerEnd
	DNSStats          = agentwire.DNSStats
)

// The control API's error codes, the Layers texts and the receipt's
// schema.
const (
	ReceiptSchema         = agentwire.ReceiptSchema
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

// SignedReceipt.Verify's errors.
var (
	ErrReceiptForged   = agentwire.ErrReceiptForged
	ErrReceiptOtherRun = agentwire.ErrReceiptOtherRun
)
