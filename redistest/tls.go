package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
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
	files := writeTLSFiles(t)
	s := &Server{Dir: t.TempDir()}
	t.Cleanup(s.Kill)
	// The TLS port is the next one (spawn finds both free).
	err := s.spawn(func(port int) ([]string, error) {
		return append(append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", s.Dir}, files.args(port+1)...), extra...), nil
	}, 1)
	if err != nil {
		t.Fatalf("redistest: standalone with TLS: %v", err)
	}
	s.TLSAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port+1))
	return s, TLSPort{Addr: s.TLSAddr, CAFile: files.ca}
}

// tlsFiles names the PEM files of a server's TLS: the CA that signed the
// certificate, the certificate (for 127.0.0.1 and localhost, good for a
// server and for a client, as a Cluster's nodes dial each other's bus
// with it) and its key.
type tlsFiles struct{ ca, cert, key string }

// writeTLSFiles makes a CA and a certificate it signed, and writes them
// to a directory of the test.
func writeTLSFiles(t testing.TB) tlsFiles {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := certificate(t, nil, nil, "rld test CA")
	srv, srvKey := certificate(t, ca, caKey, "127.0.0.1")
	f := tlsFiles{ca: filepath.Join(dir, "ca.pem"), cert: filepath.Join(dir, "cert.pem"), key: filepath.Join(dir, "key.pem")}
	for path, b := range map[string][]byte{
		f.ca:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}),
		f.cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Raw}),
		f.key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: marshalKey(t, srvKey)}),
	} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// args are the redis-server arguments that serve TLS on port with f;
// clients need no certificate.
func (f tlsFiles) args(port int) []string {
	return []string{"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", f.cert, "--tls-key-file", f.key,
		"--tls-ca-cert-file", f.ca, "--tls-auth-clients", "no"}
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

// ClientTLS returns a client's TLS configuration that trusts the CA in
// the PEM file caFile (a TLSPort's, Cluster's or Sentinel's CAFile).
func ClientTLS(t testing.TB, caFile string) *tls.Config {
	t.Helper()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("redistest: no certificate in %s", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
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
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
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
