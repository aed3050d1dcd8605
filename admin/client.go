package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/rld/rld/wire"
)

// CallSocket sends req as an ADMIN frame on the daemon's Unix socket at
// path and returns its answer. A refused request is a Response with Err
// set; the error return is for failures to ask at all.
func CallSocket(ctx context.Context, path string, req Request) (Response, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Response{}, fmt.Errorf("cannot encode admin request: %w", err)
	}
	if len(body) > wire.MaxAdminBody {
		return Response{}, fmt.Errorf("admin request of %d bytes is longer than %d", len(body), wire.MaxAdminBody)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return Response{}, fmt.Errorf("cannot reach rld at %s: %w", path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	const id = 1
	if _, err := c.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpAdmin, ID: id, Body: body})); err != nil {
		return Response{}, fmt.Errorf("cannot send admin request: %w", err)
	}
	buf := make([]byte, wire.MaxFrame)
	n := 0
	for {
		f, _, ferr := wire.Next(buf[:n])
		if ferr != nil {
			return Response{}, fmt.Errorf("bad answer from rld: %w", ferr)
		}
		if f != nil {
			var r wire.AdminResponse
			if err := wire.DecodeAdminResponse(f, &r); err != nil {
				// An error answer in the CHECK format: the daemon
				// does not know ADMIN, or the frame was refused
				// before its op was read.
				var wr wire.Response
				if wire.DecodeResponse(f, &wr) == nil && wr.Status == wire.StatusError {
					return Response{}, fmt.Errorf("rld refused the frame: %s: %s", wr.Code, wr.Message)
				}
				return Response{}, fmt.Errorf("bad answer from rld: %w", err)
			}
			if r.ID != id {
				return Response{}, fmt.Errorf("bad answer from rld: id %d, want %d", r.ID, id)
			}
			return ParsePayload(bytes.Clone(r.Payload), r.Code == wire.CodeNone), nil
		}
		m, err := c.Read(buf[n:])
		n += m
		if err != nil && m == 0 {
			return Response{}, fmt.Errorf("no answer from rld: %w", err)
		}
	}
}

// CallHTTP sends req to the admin HTTP API at base (http://host:port)
// with the bearer token and returns its answer.
func CallHTTP(ctx context.Context, base, token string, req Request) (Response, error) {
	args := []byte(req.Args)
	if len(args) == 0 {
		args = []byte("{}")
	}
	url := strings.TrimRight(base, "/") + "/v1/admin/" + req.Op
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(args))
	if err != nil {
		return Response{}, fmt.Errorf("cannot build admin request: %w", err)
	}
	hr.Header.Set("Content-Type", "application/json")
	if token != "" {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(hr)
	if err != nil {
		return Response{}, fmt.Errorf("cannot reach the admin API: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Response{}, fmt.Errorf("cannot read the admin API's answer: %w", err)
	}
	return ParsePayload(b, resp.StatusCode == http.StatusOK), nil
}

// HTTPStatus is the HTTP status the admin API answers an error code with.
func HTTPStatus(c Code) int {
	switch c {
	case CodeBadRequest:
		return http.StatusBadRequest
	case CodeUnknownOp, CodeNotFound:
		return http.StatusNotFound
	case CodeUnauthorized:
		return http.StatusUnauthorized
	case CodeForbidden:
		return http.StatusForbidden
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	}
	return http.StatusInternalServerError
}

// WireCode is the code an ADMIN response frame carries for an error code.
func WireCode(c Code) wire.Code {
	switch c {
	case CodeBadRequest, CodeMethodNotAllowed:
		return wire.CodeMalformed
	case CodeUnknownOp:
		return wire.CodeUnknownOp
	case CodeNotFound:
		return wire.CodeNotFound
	case CodeUnauthorized, CodeForbidden:
		return wire.CodeForbidden
	}
	return wire.CodeInternal
}
