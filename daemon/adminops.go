package daemon

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/config"
	"github.com/rld/rld/decisions"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/header"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/wire"
)

// opsState is the daemon's operations side: the configuration in force,
// the decision observer, and the admin API's faces.
type opsState struct {
	obs *decisions.Observer
	// infoSeries names the rld_config_info series of the last load;
	// guarded by reloadMu (or New, alone).
	infoSeries string
	admin      *admin.Server
	token      [sha256.Size]byte // SHA-256 of the write role's token (admin.token_file)
	readToken  [sha256.Size]byte // SHA-256 of the read role's token (admin.read_token_file)
	hasTok     bool              // admin.token_file is configured
	hasRead    bool              // admin.read_token_file is configured

	httpLn  net.Listener
	httpSrv *fasthttp.Server
}

// initOps builds the operations side from cfg: New calls it once the
// store and policy are built.
func (d *Daemon) initOps(cfg *config.Config) error {
	id := daemonID()
	if d.fleet != nil {
		id = d.fleet.id
	}
	obs, err := decisions.New(cfg.Log, id)
	if err != nil {
		return err
	}
	d.ops.obs = obs
	tok, err := cfg.Admin.Token()
	if err != nil {
		obs.Close()
		return err
	}
	if tok != "" {
		d.ops.token, d.ops.hasTok = sha256.Sum256([]byte(tok)), true
	}
	if tok, err = cfg.Admin.ReadToken(); err != nil {
		obs.Close()
		return err
	}
	if tok != "" {
		d.ops.readToken, d.ops.hasRead = sha256.Sum256([]byte(tok)), true
	}
	d.ops.admin = &admin.Server{Service: adminService{d}, Log: d.log, Changed: obs.WriteAdmin}
	if u := unmappedUIDs(append(slices.Clone(cfg.Admin.SocketUIDs), cfg.Admin.ReadSocketUIDs...)); len(u) > 0 {
		d.log.Warn("admin.socket_uids or admin.read_socket_uids names uids that this process's user namespace does not map: their admin frames arrive as uid 65534 and are refused (under systemd, set PrivateUsers=no in a drop-in)",
			slog.Any("uids", u))
	}
	d.announceLoaded(d.loaded())
	return nil
}

// adminService is the daemon's admin.Service.
type adminService struct{ d *Daemon }

// Explain implements admin.Service.
func (s adminService) Explain(ctx context.Context, a admin.ExplainArgs) (admin.ExplainResult, error) {
	descs := make([]descriptor.Descriptor, len(a.Descriptors))
	for i, d := range a.Descriptors {
		descs[i] = descriptor.Descriptor{Name: []byte(d.Name), Value: []byte(d.Value)}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e := s.d.pol().Explain(ctx, &policy.Request{Now: time.Now(), Descs: descs, Cost: a.Cost})
	res := admin.ExplainResult{List: e.List, Decision: explainDecision(&e.Decision), Rules: make([]admin.RuleMatch, 0, len(e.Rules))}
	for i := range e.Rules {
		res.Rules = append(res.Rules, explainRule(&e.Rules[i]))
	}
	return res, nil
}

// explainDecision renders the decision a check would get with the code
// that renders a check's answer (setAnswer), so that the two agree.
func explainDecision(dec *policy.Decision) admin.ExplainDecision {
	var a header.Answer
	dec.SetAnswer(&a)
	out := admin.ExplainDecision{
		Status: dec.Status.String(), Rule: dec.Rule, Allowed: dec.Status.Allowed(),
		Limit: a.Limit, Remaining: a.Remaining, ResetMs: a.Reset.Milliseconds(),
	}
	if dec.Status == policy.StatusLimited {
		out.RetryAfterMs = int64(header.Millis(a.Retry))
	}
	if dec.Status == policy.StatusError {
		out.Code = dec.Code.String()
		if dec.Err != nil {
			out.Message = dec.Err.Error()
		}
	}
	return out
}

// explainRule renders one rule of an explanation.
func explainRule(m *policy.Match) admin.RuleMatch {
	rm := admin.RuleMatch{
		Rule: m.Rule, Key: m.Key, Missing: m.Missing, Tier: m.Tier,
		Algorithm: m.Params.Kind.String(), Limit: m.Params.Limit, Period: config.Duration(m.Params.Period).String(),
		Burst: m.Params.Burst, Mode: string(m.Mode), Fail: string(m.Fail), Shadow: m.Shadow,
		Enforce: config.FormatShare(m.Enforce), Enforced: m.Enforced,
		Overridden: m.Overridden, Blocked: m.Blocked, Cooldown: m.Cooldown,
	}
	if m.Missing != "" {
		return rm // the rule does not apply
	}
	rm.Region = regionShare(m.Region)
	rm.Status = m.Status.String()
	if m.Status == policy.StatusError {
		rm.Code = m.Code.String()
	}
	if m.Err != nil {
		rm.Error = m.Err.Error()
		return rm
	}
	allowed := m.Status == policy.StatusAllowed
	if m.Blocked {
		rm.Allowed = &allowed // refused by the block: no numbers
		return rm
	}
	remaining, reset := max(m.Result.Remaining, 0), m.Result.Reset.Milliseconds()
	rm.Allowed, rm.Remaining, rm.ResetMs = &allowed, &remaining, &reset
	if m.Status == policy.StatusLimited {
		rm.RetryAfterMs = int64(header.Millis(max(m.Result.RetryAfter, time.Millisecond)))
	}
	return rm
}

// Top implements admin.Service.
func (s adminService) Top(ctx context.Context, a admin.TopArgs) (admin.TopResult, error) {
	return s.d.ops.obs.FleetTop(ctx, s.d.pol(), s.d.tops, syncTimeout, a, s.d.log)
}

// Config implements admin.Service.
func (s adminService) Config(context.Context) (admin.ConfigResult, error) {
	lc := s.d.loaded()
	res := admin.ConfigResult{Hash: lc.hash, Path: lc.path, LoadedAt: lc.at, Rules: []string{}}
	for _, r := range s.d.pol().Rules() {
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
	cfg := d.cfg().Admin
	switch {
	case err != nil:
		r = d.ops.admin.Refuse(who, admin.OpOf(req.Body), admin.ReasonUID, admin.CodeForbidden, fmt.Sprintf("admin frames need the peer's uid: %v", err))
	case !cfg.AllowsUID(uid):
		who.UID = uid
		r = d.ops.admin.Refuse(who, admin.OpOf(req.Body), admin.ReasonUID, admin.CodeForbidden,
			fmt.Sprintf("uid %d may not send admin frames (admin.socket_uids, admin.read_socket_uids)", uid))
	default:
		who.UID, who.Role = uid, admin.RoleRead
		if cfg.WritesUID(uid) {
			who.Role = admin.RoleWrite
		}
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
	case !d.ops.hasTok && !d.ops.hasRead:
		d.log.Info("admin HTTP API off: no admin.token_file nor admin.read_token_file", slog.String("admin_addr", addr))
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
// arguments, and GET of an op that changes nothing with its query (by
// queryArgs), for a request carrying an admin bearer token: the write
// role's may run every op, the read role's only those that change
// nothing. A GET never changes state: GET of another op is answered 405
// with Allow: POST.
func (d *Daemon) serveAdminHTTP(ctx *fasthttp.RequestCtx) {
	who := admin.Caller{Face: "http", UID: -1, Addr: ctx.RemoteAddr().String()}
	op, isAdmin := strings.CutPrefix(string(ctx.Path()), "/v1/admin/")
	r := d.adminHTTP(ctx, who, op, isAdmin)
	ctx.SetContentType("application/json")
	if r.Err != nil {
		ctx.SetStatusCode(admin.HTTPStatus(r.Err.Code))
	}
	ctx.SetBody(append(r.Payload(), '\n'))
}

// adminHTTP authenticates an admin HTTP request of op (isAdmin: its path
// is under /v1/admin/), checks its method, and runs it.
func (d *Daemon) adminHTTP(ctx *fasthttp.RequestCtx, who admin.Caller, op string, isAdmin bool) admin.Response {
	tok, hasBearer := bearerToken(ctx.Request.Header.Peek("Authorization"))
	if !hasBearer {
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="rld admin"`)
		return d.ops.admin.Refuse(who, op, admin.ReasonNoToken, admin.CodeUnauthorized,
			"no bearer token: send Authorization: Bearer <the content of admin.token_file or admin.read_token_file>")
	}
	if who.Role = d.roleOf(tok); who.Role == admin.RoleNone {
		return d.ops.admin.Refuse(who, op, admin.ReasonWrongToken, admin.CodeForbidden, "wrong bearer token")
	}
	who.Token = true
	o, known := admin.Lookup(op)
	allow := "GET, POST"
	if known && o.Changes {
		allow = "POST"
	}
	switch {
	case !isAdmin || op == "" || strings.Contains(op, "/"):
		return d.ops.admin.Refuse(who, op, admin.ReasonNotFound, admin.CodeNotFound,
			fmt.Sprintf("no such endpoint %q: use /v1/admin/OP", ctx.Path()))
	case !ctx.IsPost() && !ctx.IsGet(), ctx.IsGet() && known && o.Changes:
		ctx.Response.Header.Set("Allow", allow)
		msg := fmt.Sprintf("method %s: use POST with a JSON body of arguments, or GET with a query", ctx.Method())
		if allow == "POST" {
			msg = fmt.Sprintf("method %s: %s changes state, and a GET never does: use POST with a JSON body of arguments", ctx.Method(), op)
		}
		return d.ops.admin.Refuse(who, op, admin.ReasonMethod, admin.CodeMethodNotAllowed, msg)
	case ctx.IsGet() && repeatedArg(ctx.QueryArgs()) != "":
		return d.ops.admin.Refuse(who, op, admin.ReasonBadRequest, admin.CodeBadRequest,
			fmt.Sprintf("repeated query parameter %q: give each parameter once", repeatedArg(ctx.QueryArgs())))
	}
	var args json.RawMessage
	if body := ctx.PostBody(); ctx.IsPost() && len(strings.TrimSpace(string(body))) > 0 {
		args = append(json.RawMessage(nil), body...)
	} else if ctx.IsGet() && ctx.QueryArgs().Len() > 0 {
		args = queryArgs(ctx.QueryArgs())
	}
	// Not ctx: a fasthttp.RequestCtx used as a context races with the
	// server's shutdown.
	return d.ops.admin.Run(context.Background(), who, admin.Request{Op: op, Args: args})
}

// roleOf returns the role of the admin bearer token tok, compared in
// constant time with each token configured: RoleNone when it is neither.
func (d *Daemon) roleOf(tok string) admin.Role {
	sum := sha256.Sum256([]byte(tok))
	write := d.ops.hasTok && subtle.ConstantTimeCompare(sum[:], d.ops.token[:]) == 1
	read := d.ops.hasRead && subtle.ConstantTimeCompare(sum[:], d.ops.readToken[:]) == 1
	switch {
	case write:
		return admin.RoleWrite
	case read:
		return admin.RoleRead
	}
	return admin.RoleNone
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

// regionShare renders a global rule's regional share; nil for nil.
func regionShare(rs *policy.RegionShare) *admin.RegionShare {
	if rs == nil {
		return nil
	}
	out := &admin.RegionShare{Region: rs.Region, Share: rs.Units, Limit: rs.Limit, Live: rs.Live, Fallback: rs.Fallback, Demand: rs.Demand, Strict: rs.Strict}
	if !rs.Expiry.IsZero() {
		ms := time.Until(rs.Expiry).Milliseconds()
		out.ExpiresMs = &ms
	}
	return out
}
