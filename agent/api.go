//go:build linux

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
)

// The control API: HTTP+JSON on a Unix socket that only root can open;
// package client calls it, and holds its types.
//
//	POST   /v1/trials              trial.Request -> TrialInfo (owned: the caller's
//	                                  process, as the kernel names it, owns it)
//	GET    /v1/trials              -> []TrialInfo
//	GET    /v1/trials/{id}         -> TrialInfo
//	DELETE /v1/trials/{id}         -> Stats (final)
//	GET    /v1/trials/{id}/stats   -> Stats
//	GET    /v1/trials/{id}/audit   -> []record.Event
//	GET    /v1/trials/{id}/decisions -> decision events as they happen, one JSON
//	                                  object a line, until the Trial is destroyed
//	POST   /v1/trials/{id}/containers Container -> TrialInfo (trialnet oci-hook)
//	POST   /v1/containers             ContainerTrial -> TrialInfo (oci-hook, a profile)
//	DELETE /v1/containers/{id}        -> ContainerEnd (oci-hook at poststop)
//	POST   /v1/containers/prepare     ContainerPrepare -> PreparedContainer
//	                                  (oci-runtime, before the runtime creates a
//	                                  profile container; pending until the caller exits)
//	PATCH  /v1/trials/{id}/allow   AllowChange -> AllowChanged
//	POST   /v1/reload              ReloadRequest -> ReloadResult
//	GET    /healthz                -> Health (503 when not healthy)
//
// Errors are {"error": {"code": ..., "message": ...}} with a 4xx/5xx status.

// Handler returns the control API's HTTP handler.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/trials", func(w http.ResponseWriter, r *http.Request) {
		var req trialspec.Request
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeErr(w, errf(client.CodeBadRequest, "request body: %v", err))
			return
		}
		info, err := a.Create(r.Context(), req)
		reply(w, http.StatusCreated)(info, err)
		if err == nil {
			_ = http.NewResponseController(w).Flush()
			a.syncDataAhead()
		}
	})
	mux.HandleFunc("GET /v1/trials", func(w http.ResponseWriter, r *http.Request) {
		list := a.list()
		if list == nil {
			list = []client.TrialInfo{}
		}
		reply(w, http.StatusOK)(list, nil)
	})
	mux.HandleFunc("GET /v1/trials/{id}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK)(a.Get(r.Context(), r.PathValue("id")))
	})
	mux.HandleFunc("DELETE /v1/trials/{id}", func(w http.ResponseWriter, r *http.Request) {
		var exit *int
		if v := r.URL.Query().Get("exit_code"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				reply(w, http.StatusOK)(client.Stats{}, errf(client.CodeBadRequest, "exit_code %q: want an integer", v))
				return
			}
			exit = &n
		}
		st, err := a.DestroyExit(r.Context(), r.PathValue("id"), exit)
		reply(w, http.StatusOK)(st, withStats(err, st))
	})
	mux.HandleFunc("GET /v1/trials/{id}/stats", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK)(a.Stats(r.Context(), r.PathValue("id")))
	})
	mux.HandleFunc("GET /v1/trials/{id}/audit", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK)(a.Audit(r.Context(), r.PathValue("id")))
	})
	mux.HandleFunc("GET /v1/trials/{id}/decisions", a.serveDecisions)
	mux.HandleFunc("POST /v1/trials/{id}/containers", func(w http.ResponseWriter, r *http.Request) {
		var c client.Container
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			writeErr(w, errf(client.CodeBadRequest, "request body: %v", err))
			return
		}
		reply(w, http.StatusOK)(a.AddContainer(r.Context(), r.PathValue("id"), c))
	})
	mux.HandleFunc("POST /v1/containers", func(w http.ResponseWriter, r *http.Request) {
		var req client.ContainerTrial
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeErr(w, errf(client.CodeBadRequest, "request body: %v", err))
			return
		}
		reply(w, http.StatusOK)(a.ContainerTrial(r.Context(), req))
	})
	mux.HandleFunc("POST /v1/containers/prepare", func(w http.ResponseWriter, r *http.Request) {
		var req client.ContainerPrepare
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeErr(w, errf(client.CodeBadRequest, "request body: %v", err))
			return
		}
		reply(w, http.StatusOK)(a.PrepareContainer(r.Context(), req))
	})
	mux.HandleFunc("DELETE /v1/containers/{id}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK)(a.EndContainer(r.Context(), r.PathValue("id")))
	})
	mux.HandleFunc("PATCH /v1/trials/{id}/allow", func(w http.ResponseWriter, r *http.Request) {
		var ch client.AllowChange
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ch); err != nil {
			writeErr(w, errf(client.CodeBadRequest, "request body: %v", err))
			return
		}
		reply(w, http.StatusOK)(a.ChangeAllow(r.Context(), r.PathValue("id"), ch))
	})
	mux.HandleFunc("POST /v1/reload", func(w http.ResponseWriter, r *http.Request) {
		var req client.ReloadRequest
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
			writeErr(w, errf(client.CodeBadRequest, "request body: %v", err))
			return
		}
		reply(w, http.StatusOK)(a.Reload(r.Context(), req))
	})
	mux.HandleFunc("GET /healthz", a.serveHealth)
	return mux
}

// Server is the control API's server: Handler, with each connection's
// peer credentials, which owned Trials and the records of allowlist
// changes need.
func (a *Agent) Server() *http.Server {
	return &http.Server{Handler: rootOnly(a.Handler()), ReadHeaderTimeout: 10 * time.Second, ConnContext: withPeer}
}

// rootOnly refuses a caller whose uid (SO_PEERCRED, as the kernel names
// it in the agent's user namespace) is not 0: the socket's mode is one
// wall, this is the second, should the file's mode or directory ever be
// wrong.
func rootOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if uid := callerUID(r.Context()); uid != 0 {
			writeErr(w, errf(client.CodeNotRoot, "the trialnet agent serves root only, and this caller runs as uid %d (try: sudo trialnet ...)", uid))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// serveDecisions streams a Trial's decisions as JSON lines.
func (a *Agent) serveDecisions(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := a.lookup(id); err != nil {
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/jsonl")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	enc := json.NewEncoder(w)
	_ = a.Watch(r.Context(), id, func(ev record.Event) {
		if enc.Encode(ev) == nil {
			_ = rc.Flush()
		}
	})
}

// withStats gives a failed destroy's error the final stats it made all
// the same (an UNKNOWN or ALARM verdict, signed), which an error alone
// would have hidden: run's report then says what the agent signed.
func withStats(err error, st client.Stats) error {
	if err == nil || st.Verdict == "" {
		return err
	}
	var e *client.Error
	if !errors.As(err, &e) {
		e = &client.Error{Code: client.CodeInternal, Message: err.Error()}
	}
	with := *e
	with.Stats, _ = json.Marshal(st)
	return &with
}

func reply(w http.ResponseWriter, status int) func(v any, err error) {
	return func(v any, err error) {
		if err != nil {
			writeErr(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
}

func writeErr(w http.ResponseWriter, err error) {
	var e *client.Error
	if !errors.As(err, &e) {
		e = &client.Error{Code: client.CodeInternal, Message: err.Error()}
	}
	status := http.StatusInternalServerError
	switch e.Code {
	case client.CodeBadRequest, client.CodeBadID, client.CodeUnknownProfile, client.CodeBadAllowlist, client.CodeBadConfig:
		status = http.StatusBadRequest
	case client.CodeDuplicateID:
		status = http.StatusConflict
	case client.CodeUnknownTrial:
		status = http.StatusNotFound
	case client.CodeNotRoot:
		status = http.StatusForbidden
	case client.CodeHandedOver:
		status = http.StatusServiceUnavailable
		// The retry must reach the socket's path anew: the new agent.
		w.Header().Set("Connection", "close")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]*client.Error{"error": e})
}

// ListenSocket creates the control socket, mode 0600 (root only). A stale
// socket of a dead agent is replaced; a live agent's is not.
//
// An agent that answers there offered no hand-over (it would have taken
// this one's request on its hand-over socket): an older trialnet, or one
// that runs without a hand-over socket. It is left alone, and this start
// fails saying so.
func ListenSocket(path string) (net.Listener, error) {
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close()
		return nil, fmt.Errorf("another trialnet agent is already serving %s, and offers no hand-over (an older trialnet, from before agents handed over). It keeps serving. To replace it: stop it (systemctl stop trialnet: its Trials stay enforced, their open tunnels are cut), then start this one", path)
	}
	return fdpass.ListenAt("unix", path)
}
