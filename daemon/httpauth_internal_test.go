package daemon

import "testing"

// TestBearerTokenAuth: the Bearer scheme's name is case-insensitive and
// the token follows one or more spaces or tabs; another scheme, a scheme
// glued to its token, or no token is no bearer token.
func TestBearerTokenAuth(t *testing.T) {
	for in, want := range map[string]string{
		"Bearer tok": "tok", "bearer tok": "tok", "BEARER tok": "tok", "bEaReR \t tok ": "tok",
		"Bearer": "", "Bearer ": "", "Bearertok": "", "Basic tok": "", "": "", "Bear tok": "",
	} {
		got, ok := bearerToken([]byte(in))
		if got != want || ok != (want != "") {
			t.Errorf("bearerToken(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
