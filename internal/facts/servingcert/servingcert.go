// Package servingcert reads a kubelet's serving certificate as the kubelet
// presents it to anyone who connects, and describes it as facts for the audit
// rule (ichor/kubelet_serving/audit).
//
// Approval is a moment; the certificate lives for a year. What is in service
// is what a client sees in the TLS handshake, not what a CSR once asked for,
// so the reader shakes hands with the kubelet's port (no credential: the
// kubelet shows its certificate before it asks for one) and keeps the leaf.
// It trusts nothing it is shown: whether the chain verifies against the
// cluster's CA is one more fact, with the verifier's error, and the rule
// decides what it means.
package servingcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
	"unicode/utf8"

	"k8s.io/utils/clock"

	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
)

// DefaultPort is the kubelet's serving port (--port, 10250).
const DefaultPort = 10250

// DefaultTimeout bounds one read (dial and handshake) when Reader.Timeout is
// zero: a kubelet that accepts and never answers costs this, no more.
const DefaultTimeout = 5 * time.Second

// MaxText bounds each free-text fact the kubelet controls (issuer, serial,
// and the errors, which quote what was served): they reach the decision
// log, conditions, Events and messages, and a hostile kubelet could make
// any of them hundreds of kilobytes long.
const MaxText = 1024

// Certificate is input.certificate of the audit rule: the leaf the kubelet
// served, described as csrinput describes a request (the same subject and
// SAN shapes, so the rule's name checks read both alike).
type Certificate struct {
	// Address is the host:port that was dialled.
	Address string `json:"address"`
	// Read is false when no certificate was read; Error says why.
	Read  bool   `json:"read"`
	Error string `json:"error"`

	Subject         []csrinput.Attribute `json:"subject"`
	SubjectAltNames []csrinput.SAN       `json:"subject_alt_names"`
	// SANError is set when the subjectAltName extension does not parse
	// completely; the names are then empty rather than partial.
	SANError string `json:"san_error,omitempty"`
	Serial   string `json:"serial"`
	Issuer   string `json:"issuer"`
	// NotBefore and NotAfter are the validity in RFC 3339, for messages;
	// NotBeforeUnix and NotAfterUnix the same in Unix seconds, which the rule
	// computes with. The rule parses no time the certificate controls: OPA's
	// time functions fail beyond 2262, and NotAfter 9999-12-31 is RFC 5280's
	// "no expiry".
	NotBefore     string             `json:"not_before"`
	NotAfter      string             `json:"not_after"`
	NotBeforeUnix int64              `json:"not_before_unix"`
	NotAfterUnix  int64              `json:"not_after_unix"`
	PublicKey     csrinput.PublicKey `json:"public_key"`
	// ExtKeyUsages are the extended key usages, named as a CSR's usages are
	// ("server auth", "client auth", ...), "any" for anyExtendedKeyUsage and
	// "unknown OID x.y.z" for the others; empty without the extension.
	ExtKeyUsages []string `json:"ext_key_usages"`

	// IssuedByClusterCA is whether the chain the kubelet served verifies
	// against the cluster's CA; VerifyError is the verifier's error when not.
	IssuedByClusterCA bool   `json:"issued_by_cluster_ca"`
	VerifyError       string `json:"verify_error"`
}

// Reader reads serving certificates.
type Reader struct {
	// Roots are the CAs the chain is verified against: the cluster's
	// Kubernetes CA, which signs kubelet-serving certificates.
	Roots *x509.CertPool
	// Timeout bounds one read; DefaultTimeout if zero.
	Timeout time.Duration
	// Dial opens the connection; if nil, the one the context carries
	// (WithDial), else a net.Dialer's DialContext. Tests map a node's
	// address to a local listener with it.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Clock is the time the chain is verified at; the real clock if nil.
	Clock clock.PassiveClock
	// Denied are the networks no read connects to: the node names its
	// kubelet's address. An address written as an IP is checked before any
	// dial (a test's Dial included), and the default dial checks each
	// connection's address after DNS. Nil denies none.
	Denied netguard.Denied
}

// Audit is the whole input of the audit rule.
type Audit struct {
	// Machine is the TalosMachine whose kubelet was read.
	Machine csrinput.Machine `json:"machine"`
	// Node is today's identity read from the machine's Talos API
	// (Readable=false, and why, when it could not be read).
	Node csrinput.Node `json:"node"`
	// Certificate is what the kubelet served.
	Certificate Certificate `json:"certificate"`
	// Now is when the audit ran (RFC 3339, for messages; NowUnix in Unix
	// seconds, to compute with): the rule does not read the clock, so a
	// logged audit replays to the same answer.
	Now     string `json:"now"`
	NowUnix int64  `json:"now_unix"`
}

// Read shakes hands with address (host:port) and describes the leaf
// certificate. It never fails: a certificate it cannot read is described as
// such (Read=false, and why), a fact the rule decides on.
func (r *Reader) Read(ctx context.Context, address string) Certificate {
	out := Certificate{
		Address: address, Subject: []csrinput.Attribute{}, SubjectAltNames: []csrinput.SAN{}, ExtKeyUsages: []string{},
	}
	chain, err := r.handshake(ctx, address)
	if err != nil {
		out.Error = Clip(err.Error(), MaxText)
		return out
	}
	leaf := chain[0]
	if n := len(leaf.Subject.Names); n > csrinput.MaxSubjectAttributes {
		// As a request's: each would be the rule's input (a kubelet's
		// certificate message may be hundreds of kilobytes of them;
		// review of 2026-12-06).
		out.Error = fmt.Sprintf("the certificate's subject has %d attributes, more than the %d it is read with", n, csrinput.MaxSubjectAttributes)
		return out
	}
	out.Read = true
	out.Subject = csrinput.Subject(leaf.Subject)
	for _, ext := range leaf.Extensions {
		if !ext.Id.Equal(csrinput.OIDSubjectAltName) {
			continue
		}
		sans, err := csrinput.SubjectAltNames(ext.Value)
		if err != nil {
			out.SANError = Clip(err.Error(), MaxText)
			break
		}
		out.SubjectAltNames = append(out.SubjectAltNames, sans...)
	}
	out.Serial = Clip(hex.EncodeToString(leaf.SerialNumber.Bytes()), MaxText)
	out.Issuer = Clip(leaf.Issuer.String(), MaxText)
	out.NotBefore = leaf.NotBefore.UTC().Format(time.RFC3339)
	out.NotAfter = leaf.NotAfter.UTC().Format(time.RFC3339)
	out.NotBeforeUnix, out.NotAfterUnix = leaf.NotBefore.Unix(), leaf.NotAfter.Unix()
	out.ExtKeyUsages = ExtKeyUsages(leaf)
	out.PublicKey = csrinput.DescribeKey(leaf.PublicKey, leaf.PublicKeyAlgorithm)
	now := time.Now()
	if r.Clock != nil {
		now = r.Clock.Now()
	}
	if err := Verify(r.Roots, chain, now); err != nil {
		out.VerifyError = Clip(err.Error(), MaxText)
	} else {
		out.IssuedByClusterCA = true
	}
	return out
}

func (r *Reader) handshake(ctx context.Context, address string) ([]*x509.Certificate, error) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if ap, err := netip.ParseAddrPort(address); err == nil {
		if err := r.Denied.Check(ap.Addr()); err != nil {
			return nil, fmt.Errorf("dial %s: %w", address, err)
		}
	}
	dial := r.Dial
	if dial == nil {
		dial = dialFrom(ctx)
	}
	if dial == nil {
		dial = (&net.Dialer{Control: r.Denied.Control}).DialContext
	}
	raw, err := dial(ctx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", address, err)
	}
	defer raw.Close() //nolint:errcheck // only the handshake was wanted
	// The context's deadline bounds the handshake too: HandshakeContext
	// gives up when it ends, even on a peer that never writes.
	conn := tls.Client(raw, &tls.Config{
		// We judge the certificate, we do not trust it: verification is done
		// below, as a fact, against the cluster's CA.
		InsecureSkipVerify: true, //nolint:gosec // see above
		MinVersion:         tls.VersionTLS12,
	})
	if err := conn.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("TLS handshake with %s: %w", address, err)
	}
	chain := conn.ConnectionState().PeerCertificates
	if len(chain) == 0 {
		return nil, fmt.Errorf("TLS handshake with %s: no certificate was served", address)
	}
	return chain, nil
}

// Verify checks a chain, leaf first, against roots (the cluster's CA) at a
// time within the leaf's validity (now, else its nearest end): whether the
// cluster's CA issued it is a question apart from whether it has expired,
// which the audit's rule asks of not_after. Any extended key usage is
// accepted here for the same reason. It is the audit's check of a served
// certificate and the serving controller's of an issued one.
func Verify(roots *x509.CertPool, chain []*x509.Certificate, now time.Time) error {
	if roots == nil {
		return errors.New("no cluster CA was given to verify against")
	}
	if len(chain) == 0 {
		return errors.New("no certificate to verify")
	}
	intermediates := x509.NewCertPool()
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: intermediates,
		CurrentTime:   clamp(now, chain[0].NotBefore, chain[0].NotAfter),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Errorf("the certificate does not verify against the cluster's CA: %w", err)
	}
	return nil
}

// extKeyUsageNames are the names of certificates/v1 KeyUsage, the names a
// CSR's usages have in the approval rule's input.
var extKeyUsageNames = map[x509.ExtKeyUsage]string{
	x509.ExtKeyUsageAny:                            "any",
	x509.ExtKeyUsageServerAuth:                     "server auth",
	x509.ExtKeyUsageClientAuth:                     "client auth",
	x509.ExtKeyUsageCodeSigning:                    "code signing",
	x509.ExtKeyUsageEmailProtection:                "email protection",
	x509.ExtKeyUsageIPSECEndSystem:                 "ipsec end system",
	x509.ExtKeyUsageIPSECTunnel:                    "ipsec tunnel",
	x509.ExtKeyUsageIPSECUser:                      "ipsec user",
	x509.ExtKeyUsageTimeStamping:                   "timestamping",
	x509.ExtKeyUsageOCSPSigning:                    "ocsp signing",
	x509.ExtKeyUsageMicrosoftServerGatedCrypto:     "microsoft sgc",
	x509.ExtKeyUsageNetscapeServerGatedCrypto:      "netscape sgc",
	x509.ExtKeyUsageMicrosoftCommercialCodeSigning: "microsoft commercial code signing",
	x509.ExtKeyUsageMicrosoftKernelCodeSigning:     "microsoft kernel code signing",
}

// ExtKeyUsages names the extended key usages of cert, in the order it
// lists them: those Go knows first, then the others by OID. At most
// MaxExtKeyUsages are named (the rest are one "... (N more)"): a hostile
// kubelet could list thousands.
func ExtKeyUsages(cert *x509.Certificate) []string {
	out := []string{}
	for _, u := range cert.ExtKeyUsage {
		name, ok := extKeyUsageNames[u]
		if !ok {
			name = fmt.Sprintf("unknown usage %d", u)
		}
		out = append(out, name)
	}
	for _, oid := range cert.UnknownExtKeyUsage {
		out = append(out, Clip("unknown OID "+oid.String(), maxOIDText))
	}
	if len(out) > MaxExtKeyUsages {
		out = append(out[:MaxExtKeyUsages], fmt.Sprintf("... (%d more)", len(out)-MaxExtKeyUsages))
	}
	return out
}

// MaxExtKeyUsages bounds the extended key usages named, and maxOIDText the
// text of one unknown OID.
const (
	MaxExtKeyUsages = 32
	maxOIDText      = 128
)

// Clip is s cut to at most limit bytes (at a rune boundary), with how many
// bytes were cut: "...(N bytes more)".
func Clip(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	keep := limit
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return fmt.Sprintf("%s...(%d bytes more)", s[:keep], len(s)-keep)
}

func clamp(t, lo, hi time.Time) time.Time {
	switch {
	case t.Before(lo):
		return lo
	case t.After(hi):
		return hi
	}
	return t
}

// Address is host:port of a node address and port, IPv6 in brackets.
func Address(host string, port int) string {
	return net.JoinHostPort(host, fmt.Sprint(port))
}
