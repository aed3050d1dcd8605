package derive

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/rld/rld/config"
)

// The algorithms a token may be signed with.
var jwtAlgorithms = []jose.SignatureAlgorithm{jose.HS256, jose.RS256, jose.ES256, jose.EdDSA}

// verifier checks bearer tokens against the keys of request.jwt.keys_file
// and gives the claims of those whose signature verifies and whose exp
// and nbf hold. It remembers recent tokens' claims, so a token is
// verified once, not on every check.
type verifier struct {
	keys     jose.JSONWebKeySet
	issuer   string
	audience string
	leeway   time.Duration
	cache    [cacheSlots]atomic.Pointer[tokenEntry]
}

const cacheSlots = 4096

// tokenEntry is a verified token's claims and validity.
type tokenEntry struct {
	token     string
	claims    map[string]string
	notBefore time.Time // zero: none
	expires   time.Time // zero: none
}

// newVerifier reads the key file: a JWKS document ({"keys": [...]}) or
// PEM public keys (RSA, EC P-256, Ed25519).
func newVerifier(c config.JWT) (*verifier, error) {
	b, err := os.ReadFile(c.KeysFile)
	if err != nil {
		return nil, fmt.Errorf("request.jwt.keys_file: %w", err)
	}
	v := &verifier{issuer: c.Issuer, audience: c.Audience, leeway: time.Duration(c.Leeway)}
	if t := strings.TrimSpace(string(b)); strings.HasPrefix(t, "{") {
		if err := json.Unmarshal(b, &v.keys); err != nil {
			return nil, fmt.Errorf("request.jwt.keys_file=%q: not a JWKS document: %w", c.KeysFile, err)
		}
	} else {
		for rest := b; ; {
			var blk *pem.Block
			blk, rest = pem.Decode(rest)
			if blk == nil {
				break
			}
			pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("request.jwt.keys_file=%q: a PEM block that is not a public key: %w", c.KeysFile, err)
			}
			v.keys.Keys = append(v.keys.Keys, jose.JSONWebKey{Key: pub})
		}
	}
	if len(v.keys.Keys) == 0 {
		return nil, fmt.Errorf("request.jwt.keys_file=%q: no key in it (want a JWKS document or PEM public keys)", c.KeysFile)
	}
	return v, nil
}

// appendClaim appends the claim of the bearer token in an Authorization
// header to dst, when the token verifies at now; else dst as it is.
func (v *verifier) appendClaim(dst, authz []byte, claim string, now time.Time) []byte {
	if v == nil {
		return dst
	}
	tok := bearer(authz)
	if len(tok) == 0 {
		return dst
	}
	slot := &v.cache[xxhash.Sum64(tok)%cacheSlots]
	e := slot.Load()
	if e == nil || e.token != string(tok) {
		e = v.verify(string(tok), now)
		if e == nil {
			return dst
		}
		slot.Store(e)
	}
	if !e.notBefore.IsZero() && now.Add(v.leeway).Before(e.notBefore) ||
		!e.expires.IsZero() && !now.Add(-v.leeway).Before(e.expires) {
		return dst
	}
	return AppendValue(dst, []byte(e.claims[claim]), MaxValue)
}

// bearer returns the token of "Bearer TOKEN" (the scheme in any case).
func bearer(h []byte) []byte {
	h = trimOWS(h)
	if len(h) < 8 || !equalFold(h[:7], "bearer ") {
		return nil
	}
	return trimOWS(h[7:])
}

// errNoKey: no key of the set verifies the token.
var errNoKey = errors.New("no key verifies the token")

// verify checks tok's signature, issuer and audience and returns its
// claims, or nil when it does not verify.
func (v *verifier) verify(tok string, now time.Time) *tokenEntry {
	t, err := jwt.ParseSigned(tok, jwtAlgorithms)
	if err != nil || len(t.Headers) != 1 {
		return nil
	}
	keys := v.keys.Keys
	if kid := t.Headers[0].KeyID; kid != "" {
		keys = v.keys.Key(kid)
	}
	var std jwt.Claims
	var raw map[string]any
	err = errNoKey
	for i := range keys {
		if keys[i].Algorithm != "" && keys[i].Algorithm != t.Headers[0].Algorithm {
			continue
		}
		if err = t.Claims(keys[i].Key, &std, &raw); err == nil {
			break
		}
	}
	if err != nil {
		return nil
	}
	exp := jwt.Expected{Issuer: v.issuer, Time: now}
	if v.audience != "" {
		exp.AnyAudience = jwt.Audience{v.audience}
	}
	if err := std.ValidateWithLeeway(exp, v.leeway); err != nil {
		return nil
	}
	e := &tokenEntry{token: tok, claims: make(map[string]string, len(raw))}
	if std.NotBefore != nil {
		e.notBefore = std.NotBefore.Time()
	}
	if std.Expiry != nil {
		e.expires = std.Expiry.Time()
	}
	for k, val := range raw {
		switch x := val.(type) {
		case string:
			e.claims[k] = x
		case float64:
			e.claims[k] = strconv.FormatFloat(x, 'f', -1, 64)
		case bool:
			e.claims[k] = strconv.FormatBool(x)
		}
	}
	return e
}
