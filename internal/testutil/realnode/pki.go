package realnode

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// pki is the cluster's certificate authority and the files the control plane reads.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// newPKI makes a CA, the API server's serving certificate (for its Service IP, the control
// plane's address and loopback), its client certificate towards the kubelets, and the service
// account signing key; and, in dir/front-proxy, the aggregation layer's own CA and the client
// certificate the API server presents to extension API servers (front-proxy-client), as kubeadm
// makes them.
func newPKI(dir string, ips []net.IP) (*pki, error) {
	p, err := newCA(dir, "prewarm-realnode-ca")
	if err != nil {
		return nil, err
	}
	fp, err := newCA(p.path("front-proxy"), "prewarm-realnode-front-proxy-ca")
	if err != nil {
		return nil, err
	}
	if err := fp.issue(FrontProxyClient, FrontProxyClient, nil, nil, nil, x509.ExtKeyUsageClientAuth); err != nil {
		return nil, err
	}
	if err := p.issue("apiserver", "kube-apiserver", nil, ips,
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
		x509.ExtKeyUsageServerAuth); err != nil {
		return nil, err
	}
	if err := p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil,
		x509.ExtKeyUsageClientAuth); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	b, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.path("sa.key"), "EC PRIVATE KEY", b); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	return p, writePEM(p.path("sa.pub"), "PUBLIC KEY", pub)
}

// FrontProxyClient is the name of the client certificate the API server presents to extension
// API servers (--requestheader-allowed-names).
const FrontProxyClient = "front-proxy-client"

// newCA makes a certificate authority in dir (ca.crt), for a day.
func newCA(dir, cn string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, caCert: ca, caKey: key}
	return p, writePEM(p.path("ca.crt"), "CERTIFICATE", der)
}

// issue writes name.crt and name.key, signed by the CA.
func (p *pki) issue(name, cn string, orgs []string, ips []net.IP, dns []string, usages ...x509.ExtKeyUsage) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usages,
		IPAddresses: ips, DNSNames: dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return err
	}
	b, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(p.path(name+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(p.path(name+".key"), "EC PRIVATE KEY", b)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// identity is one user of the static token file.
type identity struct {
	name   string
	groups []string
	token  string
}

func newIdentity(name string, groups ...string) (identity, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return identity{}, err
	}
	return identity{name: name, groups: groups, token: fmt.Sprintf("%x", b)}, nil
}

// writeTokens writes the API server's --token-auth-file.
func writeTokens(path string, ids []identity) error {
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "%s,%s,%s,\"%s\"\n", id.token, id.name, id.name, strings.Join(id.groups, ","))
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// writeKubeconfig writes a kubeconfig for id against server, trusting the CA.
func writeKubeconfig(path, server, ca string, id identity) error {
	return os.WriteFile(path, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: realnode
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {token: %q}
contexts:
- name: realnode
  context: {cluster: realnode, user: %s}
current-context: realnode
`, server, ca, id.name, id.token, id.name)), 0o600)
}
