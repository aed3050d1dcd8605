package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLSPort is the TLS side of a server StandaloneTLS started.
type TLSPort struct {
	// Addr is 127.0.0.1:port of the TLS port.
	Addr string
	// CAFile is a PEM file of the CA that signed the server's
	// certificate (for 127.0.0.1 and localhost).
	CAFile string
}

// StandaloneTLS starts a standalone redis-server as Standalone does, that
// also serves TLS on a port of its own, with a certificate signed by a CA
// made for the test. Clients need no certificate. The plain port stays
// open, for the test's own reads.
func StandaloneTLS(t testing.TB, extra ...string) (*Server, TLSPort) {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := certificate(t, nil, nil, "rld test CA")
	srv, srvKey := certificate(t, ca, caKey, "127.0.0.1")
	files := map[string][]byte{
		"ca.pem":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}),
		"cert.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Raw}),
		"key.pem":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: marshalKey(t, srvKey)}),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := &Server{Dir: t.TempDir()}
	t.Cleanup(s.Kill)
	// The TLS port is the next one (spawn finds both free).
	err := s.spawn(1, func(port int) ([]string, error) {
		return append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", s.Dir,
			"--tls-port", strconv.Itoa(port + 1),
			"--tls-cert-file", filepath.Join(dir, "cert.pem"), "--tls-key-file", filepath.Join(dir, "key.pem"),
			"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"), "--tls-auth-clients", "no"}, extra...), nil
	})
	if err != nil {
		t.Fatalf("redistest: standalone with TLS: %v", err)
	}
	return s, TLSPort{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port+1)), CAFile: filepath.Join(dir, "ca.pem")}
}

// CAFile writes a PEM file of a CA made for the test, which signed no
// server's certificate, and returns its path.
func CAFile(t testing.TB) string {
	t.Helper()
	ca, _ := certificate(t, nil, nil, "rld test CA, unrelated")
	path := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// certificate makes a certificate for name, signed by parent with
// parentKey, or a self-signed CA when parent is nil.
func certificate(t testing.TB, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	} else {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func marshalKey(t testing.TB, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	b, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
