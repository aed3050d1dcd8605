package daemon_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"
)

// newJWKS returns a JWKS document holding a new ES256 key named kid, and
// a token for sub signed with it that expires in an hour.
func newJWKS(t *testing.T, kid, sub string) ([]byte, string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &priv.PublicKey, KeyID: kid, Algorithm: "ES256", Use: "sig"}}}
	doc, err := json.Marshal(set)
	require.NoError(t, err)
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: priv}, (&jose.SignerOptions{}).WithHeader("kid", kid))
	require.NoError(t, err)
	tok, err := jwt.Signed(sig).Claims(jwt.Claims{Subject: sub, Expiry: jwt.NewNumericDate(time.Now().Add(time.Hour))}).Serialize()
	require.NoError(t, err)
	return doc, tok
}
