package daemon

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
	"github.com/rld/rld/header"
	"github.com/rld/rld/wire"
)

// opsState is the daemon's operations side: the configuration in force,
// the decision observer, and the admin API's faces.
type opsState struct {
	loaded atomic.Pointer[loadedConfig]
	obs    *observer
	admin  *admin.Server
	token  [sha256.Size]byte // SHA-256 of the admin token
	hasTok bool              // a token file is configured

	httpLn  net.Listener
	httpSrv *fasthttp.Server
}

// initOps builds the operations side from cfg: New calls it once the
// store and policy are built.
func (d *Daemon) initOps(cfg *config.Config, data []byte) error {
	id := daemonID()
	if d.fleet != nil {
		id = d.fleet.id
	}
	obs, err := newObserver(cfg.Log, id)
	if err != nil {
		return err
	}
	d.ops.obs = obs
	tok, err := cfg.Admin.Token()
	if err != nil {
		obs.close()
		return err
	}
	if tok != "" {
		d.ops.token, d.ops.hasTok = sha256.Sum256([]byte(tok)), true
	}
	d.ops.admin = &admin.Server{Service: adminService{d}, Log: d.log, Changed: obs.writeAdmin}
	if u := unmappedUIDs(cfg.Admin.SocketUIDs); len(u) > 0 {
		d.log.Warn("admin.socket_uids names uids that this process's user namespace does not map: their admin frames arrive as uid 65534 and are refused (under systemd, set PrivateUsers=no in a drop-in)",
			slog.Any("uids", u))
	}
	d.setLoaded(data)
	return nil
}

// adminService is the daemon's admin.Service.
type adminService struct{ d *Daemon }

// Explain implements admin.Service.
func (s adminService) Explain(ctx context.Context, a admin.ExplainArgs) (admin.ExplainResult, error) {
	descs := make([]wire.Descriptor, len(a.Descriptors))
	for i, d := range a.Descriptors {
		descs[i] = wire.Descriptor{Name: []byte(d.Name), Value: []byte(d.Value)}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e := s.d.policy.Load().Explain(ctx, time.Now(), descs, a.Cost)
	res := admin.ExplainResult{List: e.List, Rules: make([]admin.RuleMatch, 0, len(e.Rules))}
	for _, m := range e.Rules {
		rm := admin.RuleMatch{
			Rule: m.Rule, Key: m.Key, Missing: m.Missing, Tier: m.Tier,
			Algorithm: m.Params.Kind.String(), Limit: m.Params.Limit, Period: config.Duration(m.Params.Period).String(),
			Burst: m.Params.Burst, Mode: string(m.Mode), Fail: string(m.Fail), Shadow: m.Shadow,
			Enforce: config.FormatShare(m.Enforce), Enforced: m.Enforced,
			Overridden: m.Overridden, Blocked: m.Blocked,
		}
		switch {
		case m.Err != nil:
			rm.Error = m.Err.Error()
		case m.Missing == "":
			rm.Allowed, rm.Remaining = m.Result.Allowed, max(m.Result.Remaining, 0)
			rm.ResetMs = m.Result.Reset.Milliseconds()
			if m.Result.RetryAfter == algo.Never {
				rm.RetryAfterMs = -1
			} else if !m.Result.Allowed {
				rm.RetryAfterMs = int64(header.Millis(m.Result.RetryAfter))
			}
		}
		res.Rules = append(res.Rules, rm)
	}
	return res, nil
}

// Top implements admin.Service.
func (s adminService) Top(ctx context.Context, a admin.TopArgs) (admin.TopResult, error) {
	return s.fleetTop(ctx, a)
}

// Config implements admin.Service.
func (s adminService) Config(context.Context) (admin.ConfigResult, error) {
	lc := s.d.loaded()
	res := admin.ConfigResult{Hash: lc.hash, Path: lc.path, LoadedAt: lc.at, Rules: []string{}}
	for _, r := range s.d.policy.Load().Rules() {
		res.Rules = append(res.Rules, r.Summary)
	}
	return res, nil
}

// answerAdmin appends the answer to the ADMIN frame f, received on c, to
// out. Only peers whose uid is in admin.socket_uids may use it.
func (d *Daemon) answerAdmin(ctx context.Context, c *net.UnixConn, f, out []byte) []byte {
	var req wire.Request
	if err := wire.DecodeRequest(f, &req); err != nil {
		countFrameError(wire.CodeOf(err))
		r := admin.Response{Err: admin.Errorf(admin.CodeBadRequest, "%v", err)}
		return appendAdminAnswer(out, req.ID, r)
	}
	who := admin.Caller{Face: "socket", UID: -1}
	var r admin.Response
	uid, err := peerUID(c)
	switch {
	case err != nil:
		r = d.ops.admin.Refuse(who, admin.CodeForbidden, fmt.Sprintf("admin frames need the peer's uid: %v", err))
	case !d.cfg().Admin.AllowsUID(uid):
		who.UID = uid
		r = d.ops.admin.Refuse(who, admin.CodeForbidden, fmt.Sprintf("uid %d may not send admin frames (admin.socket_uids)", uid))
	default:
		who.UID = uid
		r = d.ops.admin.Serve(ctx, who, req.Body)
	}
	return appendAdminAnswer(out, req.ID, r)
}

// appendAdminAnswer appends an ADMIN response frame carrying r.
func appendAdminAnswer(out []byte, id uint32, r admin.Response) []byte {
	res := wire.AdminResponse{ID: id, Payload: r.Payload()}
	if r.Err != nil {
		res.Code = admin.WireCode(r.Err.Code)
	}
	if len(res.Payload) > wire.MaxAdminBody {
		big := len(res.Payload)
		r = admin.Response{Err: admin.Errorf(admin.CodeBadRequest,
			"the answer (%d bytes) does not fit in a frame (%d): ask for less, or use the admin HTTP API", big, wire.MaxAdminBody)}
		res.Code, res.Payload = wire.CodeTooLarge, r.Payload()
	}
	return wire.AppendAdminResponse(out, &res)
}

// startAdminHTTP listens on admin.http when a token file is configured.
// Without one the admin HTTP API does not start: an API that no request
// can authenticate to would only refuse.
func (d *Daemon) startAdminHTTP() error {
	addr := d.cfg().Admin.HTTP
	if d.opts.AdminHTTP != nil {
		addr = *d.opts.AdminHTTP
	}
	switch {
	case addr == "":
		return nil
	case !d.ops.hasTok:
		d.log.Info("admin HTTP API off: no admin.token_file", slog.String("admin_addr", addr))
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot listen on admin.http=%q: %w", addr, err)
	}
	d.ops.httpLn = ln
	d.ops.httpSrv = &fasthttp.Server{
		Handler:               d.serveAdminHTTP,
		Name:                  "rld-admin",
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           time.Minute,
		MaxRequestBodySize:    wire.MaxAdminBody,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
	}
	go func() {
		if err := d.ops.httpSrv.Serve(ln); err != nil {
			d.log.Error("admin http server stopped", slog.Any("error", err))
		}
	}()
	d.log.Info("admin HTTP API listening", slog.String("admin_addr", ln.Addr().String()))
	return nil
}

// AdminHTTPAddr returns the admin HTTP API's address, or "" when it does
// not listen.
func (d *Daemon) AdminHTTPAddr() string {
	select {
	case <-d.ready:
	default:
		return ""
	}
	if d.ops.httpLn == nil {
		return ""
	}
	return d.ops.httpLn.Addr().String()
}

func (d *Daemon) stopAdminHTTP() {
	if d.ops.httpSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(d.cfg().Server.DrainTimeout))
		_ = d.ops.httpSrv.ShutdownWithContext(ctx)
		cancel()
	}
}

// serveAdminHTTP answers POST /v1/admin/OP with a JSON body of the op's
// arguments (GET: its query, by queryArgs), for a request carrying the bearer token.
func (d *Daemon) serveAdminHTTP(ctx *fasthttp.RequestCtx) {
	who := admin.Caller{Face: "http", UID: -1, Addr: ctx.RemoteAddr().String()}
	var r admin.Response
	auth := string(ctx.Request.Header.Peek("Authorization"))
	tok, hasBearer := strings.CutPrefix(auth, "Bearer ")
	sum := sha256.Sum256([]byte(tok))
	op, isAdmin := strings.CutPrefix(string(ctx.Path()), "/v1/admin/")
	switch {
	case !hasBearer || tok == "":
		r = d.ops.admin.Refuse(who, admin.CodeUnauthorized, "no bearer token: send Authorization: Bearer <the content of admin.token_file>")
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="rld admin"`)
	case subtle.ConstantTimeCompare(sum[:], d.ops.token[:]) != 1:
		r = d.ops.admin.Refuse(who, admin.CodeForbidden, "wrong bearer token")
	case !isAdmin || op == "" || strings.Contains(op, "/"):
		who.Token = true
		r = admin.Response{Err: admin.Errorf(admin.CodeNotFound, "no such endpoint %q: use /v1/admin/OP", ctx.Path())}
	case !ctx.IsPost() && !ctx.IsGet():
		who.Token = true
		r = admin.Response{Err: admin.Errorf(admin.CodeBadRequest, "method %s: use POST with a JSON body of arguments, or GET", ctx.Method())}
	case ctx.IsGet() && repeatedArg(ctx.QueryArgs()) != "":
		who.Token = true
		r = admin.Response{Err: admin.Errorf(admin.CodeBadRequest, "repeated query parameter %q: give each parameter once", repeatedArg(ctx.QueryArgs()))}
	default:
		who.Token = true
		var args json.RawMessage
		if body := ctx.PostBody(); ctx.IsPost() && len(strings.TrimSpace(string(body))) > 0 {
			args = append(json.RawMessage(nil), body...)
		} else if ctx.IsGet() && ctx.QueryArgs().Len() > 0 {
			args = queryArgs(ctx.QueryArgs())
		}
		// Not ctx: a fasthttp.RequestCtx used as a context races with
		// the server's shutdown.
		r = d.ops.admin.Run(context.Background(), who, admin.Request{Op: op, Args: args})
	}
	ctx.SetContentType("application/json")
	if r.Err != nil {
		ctx.SetStatusCode(admin.HTTPStatus(r.Err.Code))
	}
	ctx.SetBody(append(r.Payload(), '\n'))
}

// queryArgs turns a GET's query (?cursor=o-…&limit=50) into the op's
// arguments: a JSON object of the parameters, a decimal integer as a
// number, anything else as a string. The op decodes it as it decodes a
// POST's body, so an unknown parameter is refused the same. A repeated
// one is refused before (repeatedArg).
func queryArgs(q *fasthttp.Args) json.RawMessage {
	obj := make(map[string]any, q.Len())
	for k, v := range q.All() {
		if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			obj[string(k)] = n
		} else {
			obj[string(k)] = string(v)
		}
	}
	b, _ := json.Marshal(obj)
	return b
}

// repeatedArg returns the first parameter q gives twice, or "".
func repeatedArg(q *fasthttp.Args) string {
	seen := make(map[string]bool, q.Len())
	for k := range q.All() {
		if seen[string(k)] {
			return string(k)
		}
		seen[string(k)] = true
	}
	return ""
}
