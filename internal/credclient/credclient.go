// Package credclient is the requester's side of a TalosCredentialRequest:
// it makes the key, checks the request against the embedded policy, asks as
// the caller of a kubeconfig, waits for the issuer's answer and writes the
// talosconfig or kubeconfig, never over the file the caller uses now. The
// `ichor cluster` commands parse their flags into a Request and call it.
package credclient

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// Suffixes of the default output files: beside the caller's current file,
// never over it.
const (
	talosconfigSuffix     = ".ichor-reader"
	adminKubeconfigSuffix = ".ichor-admin"
	breakGlassSuffix      = ".ichor-break-glass"
)

// pollInterval is how often the request's status is read while waiting.
//
// A get by name, not a watch (watchtools.UntilWithSync): a watch needs list
// and watch on every TalosCredentialRequest of the namespace (RBAC can name
// the object of a watch only when its name is known when the role is
// written, and a request's is generated), while asking needs create and get
// alone. A person who may ask should not have to see everyone's requests to
// read their own answer; a get every half second costs the API server little.
const pollInterval = 500 * time.Millisecond

// progressEvery is how often the wait says it is still waiting.
const progressEvery = 5 * time.Second

// Request is what a credential command asks for.
type Request struct {
	// Kube is the caller's client configuration, kubectl's flags
	// (kube.NewConfigFlags): the kubeconfig, its context, the namespace of
	// the TalosCluster, impersonation.
	Kube genericclioptions.RESTClientGetter
	// Cluster is the TalosCluster's name.
	Cluster string
	// TTL is the lifetime asked for; nil for the policy's default.
	TTL *time.Duration
	// Out is the file to write; empty for the default beside the caller's
	// current talosconfig or kubeconfig.
	Out string
	// Force replaces Out if it exists (never the file the caller uses now).
	Force bool
	// Timeout bounds the wait for the issuer's answer.
	Timeout time.Duration
	// DecisionLog is a file the local policy check's decision log is
	// appended to; empty for none.
	DecisionLog string
	// TalosEndpoints are written into a talosconfig when the cluster has no
	// control-plane TalosMachines.
	TalosEndpoints []string
	// BreakGlass asks for the super-admin kubeconfig instead of the admin
	// one.
	BreakGlass bool
	// Merge merges the talosconfig into the one talosctl uses, as
	// `talosctl config merge` does, instead of writing a file of its own.
	Merge bool
	// Progress receives what the wait is doing, for a person watching.
	Progress io.Writer
}

// Written is the file a credential command wrote.
type Written struct {
	Path string
	// Description says what the file is and what it is for.
	Description string
	// Expires is the certificate's expiry, RFC 3339, or "unknown".
	Expires string
	// UseWith is a command line that uses it.
	UseWith string
}

// Talosconfig asks for an os:reader talosconfig and writes it, or with Merge
// merges it into the talosconfig talosctl uses.
func Talosconfig(ctx context.Context, o Request) (Written, error) {
	cluster := o.Cluster
	inUse, err := talosconfigInUse()
	if err != nil {
		return Written{}, err
	}
	current := inUse.Path
	out := o.Out
	if o.Merge {
		if o.Out != "" || o.Force {
			return Written{}, usage.Errorf("--merge writes into your talosconfig; --out and --force do not apply to it")
		}
		// Found before anything is asked for: a credential issued and then
		// not written is wasted, and an Event says it was requested.
		if out, err = mergeTarget(); err != nil {
			return Written{}, err
		}
	} else {
		if out == "" {
			beside, err := writableTalosconfig(inUse)
			if err != nil {
				return Written{}, err
			}
			out = beside + talosconfigSuffix
		}
		if err := checkOutput(out, []string{current}, o.Force); err != nil {
			return Written{}, err
		}
	}
	key, err := newKey()
	if err != nil {
		return Written{}, err
	}
	reqs, err := checkLocally(ctx, o, ichorv1alpha1.PurposeTalosconfigReader, key)
	if err != nil {
		return Written{}, err
	}

	c, namespace, _, err := kube.ClientWithin(o.Kube, o.Timeout)
	if err != nil {
		return Written{}, err
	}
	endpoints, source, err := talosEndpoints(ctx, c, namespace, cluster, o.TalosEndpoints, current)
	if err != nil {
		return Written{}, err
	}
	fmt.Fprintf(o.Progress, "Talos endpoints (%s): %s\n", source, strings.Join(endpoints, ", "))

	answer, err := requestCredential(ctx, c, o, namespace, cluster, ichorv1alpha1.PurposeTalosconfigReader, key, reqs)
	if err != nil {
		return Written{}, err
	}
	leaf, certPEM, err := checkedCertificate(answer.Status.Certificate, ichorv1alpha1.PurposeTalosconfigReader)
	if err != nil {
		return Written{}, fmt.Errorf("TalosCredentialRequest %s/%s: %w", answer.Namespace, answer.Name, err)
	}
	keyPEM, err := privateKeyPEM(key, "ED25519 PRIVATE KEY")
	if err != nil {
		return Written{}, err
	}
	contextName := cluster + "-reader"
	cfg := &clientconfig.Config{
		Context: contextName,
		Contexts: map[string]*clientconfig.Context{contextName: {
			Endpoints: endpoints,
			CA:        base64.StdEncoding.EncodeToString([]byte(answer.Status.TrustBundle)),
			Crt:       base64.StdEncoding.EncodeToString(certPEM),
			Key:       base64.StdEncoding.EncodeToString(keyPEM),
		}},
	}
	description := fmt.Sprintf("an os:reader talosconfig for %s/%s", namespace, cluster)
	useWith := "talosctl --talosconfig " + out + " version"
	if o.Merge {
		if cfg, contextName, err = mergeInto(out, cfg, o.Progress); err != nil {
			return Written{}, err
		}
		description += fmt.Sprintf(" as context %s (now the current one)", contextName)
		useWith = "talosctl version"
	}
	data, err := cfg.Bytes()
	if err != nil {
		return Written{}, fmt.Errorf("encode the talosconfig: %w", err)
	}
	if o.Merge {
		err = writeFile(out, data, nil, true)
	} else {
		err = writeFile(out, data, []string{current}, o.Force)
	}
	if err != nil {
		return Written{}, err
	}
	return Written{Path: out, Description: description, Expires: expiry(leaf), UseWith: useWith}, nil
}

// mergeTarget is the talosconfig `talosctl config merge` would merge into:
// the first of $TALOSCONFIG and ~/.talos/config that exists, else the first
// of them (written by the merge, as talosctl does, and not before: a
// request refused leaves no empty talosconfig behind). A symbolic link is
// followed, so the file it names is the one replaced.
func mergeTarget() (string, error) {
	p, err := talosconfigInUse()
	if err != nil {
		return "", err
	}
	if !p.WriteAllowed {
		return "", usage.Errorf("your talosconfig %s is read-only: set TALOSCONFIG to a file to merge into, or pass --out instead of --merge", p.Path)
	}
	if resolved, err := filepath.EvalSymlinks(p.Path); err == nil {
		return resolved, nil
	}
	// A link to a file not made yet: the merge makes the file it names, as
	// talosctl would, rather than a file in the link's place.
	return danglingTarget(p.Path)
}

// danglingTarget is the path a chain of symbolic links from path ends at
// when that end does not exist yet; path itself when it is no link.
func danglingTarget(path string) (string, error) {
	for range 40 {
		info, err := os.Lstat(path)
		if err != nil || info.Mode().Type() != os.ModeSymlink {
			return path, nil
		}
		target, err := os.Readlink(path)
		if err != nil {
			return "", fmt.Errorf("follow the link %s: %w", path, err)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = target
	}
	return "", fmt.Errorf("follow the link %s: too many links", path)
}

// mergeInto reads the talosconfig at path again (it may have changed while
// the request was answered; none there is an empty one) and merges add
// into it with machinery's Merge, the one `talosctl config merge` uses: a
// context whose name is taken is renamed NAME-1, NAME-2, ..., and the
// added context becomes the current one. It returns the merged
// configuration and the added context's name.
func mergeInto(path string, add *clientconfig.Config, progress io.Writer) (*clientconfig.Config, string, error) {
	cfg, err := readTalosconfig(path)
	if errors.Is(err, os.ErrNotExist) {
		cfg, err = &clientconfig.Config{Contexts: map[string]*clientconfig.Context{}}, nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read the talosconfig to merge into: %w", err)
	}
	for _, r := range cfg.Merge(add) {
		// talosctl's own words for it.
		fmt.Fprintf(progress, "renamed talosconfig context %s\n", r.String())
	}
	return cfg, cfg.Context, nil
}

// Kubeconfig asks for an admin kubeconfig (a break-glass one with
// BreakGlass) of the cluster the caller's kubeconfig names, and writes it.
func Kubeconfig(ctx context.Context, o Request) (Written, error) {
	cluster := o.Cluster
	purpose, suffix, what := ichorv1alpha1.PurposeKubeconfigAdmin, adminKubeconfigSuffix, "an admin kubeconfig"
	if o.BreakGlass {
		purpose, suffix, what = ichorv1alpha1.PurposeKubeconfigSuperAdmin, breakGlassSuffix, "a break-glass kubeconfig"
	}
	out, protected, err := kubeconfigOutput(o, suffix)
	if err != nil {
		return Written{}, err
	}
	var caData []byte
	issued, err := requestKubeCredential(ctx, o, purpose, func(cfg *rest.Config) (err error) {
		caData, err = serverCA(cfg)
		return err
	})
	if err != nil {
		return Written{}, err
	}
	answer, restCfg := issued.answer, issued.restCfg
	name := cluster + "-" + strings.TrimPrefix(string(purpose), "kubeconfig-")
	auth := &clientcmdapi.AuthInfo{
		ClientCertificateData: issued.certPEM,
		ClientKeyData:         issued.keyPEM,
	}
	if err := writeKubeconfig(out, protected, o.Force, cluster, name, restCfg, kubeconfigCA(caData, []byte(answer.Status.TrustBundle)), auth); err != nil {
		return Written{}, err
	}
	return Written{
		Path:        out,
		Description: what + " for " + restCfg.Host,
		Expires:     expiry(issued.leaf),
		UseWith:     "kubectl --kubeconfig " + out + " get nodes",
	}, nil
}

// kubeconfigOutput is where a kubeconfig is written: --out, or beside the
// first file of the caller's kubeconfig with suffix; never over one of those
// files (the protected ones) unless forced.
func kubeconfigOutput(o Request, suffix string) (out string, protected []string, err error) {
	protected = kube.KubeconfigFiles(o.Kube)
	out = o.Out
	if out == "" {
		if len(protected) == 0 {
			return "", nil, usage.Errorf("no kubeconfig file to write beside: pass --out")
		}
		out = protected[0] + suffix
	}
	if err := checkOutput(out, protected, o.Force); err != nil {
		return "", nil, err
	}
	return out, protected, nil
}

// kubeconfigCA is the CA data of an admin kubeconfig: your kubeconfig's CA
// followed by the cluster's Kubernetes CA from the trust bundle (old and new
// during a rotation); none when your kubeconfig names none, so that the
// server is verified with the system's roots as yours is (review 186: the
// bundle alone replaced them, and a server with a public certificate was
// refused).
func kubeconfigCA(caData, trustBundle []byte) []byte {
	if len(caData) == 0 {
		return nil
	}
	return joinPEM(caData, trustBundle)
}

// writeKubeconfig writes a kubeconfig of one context, name, to cluster's API
// server as the caller's client configuration reaches it (its server, TLS
// server name, proxy and compression), with auth.
func writeKubeconfig(out string, protected []string, force bool, cluster, name string, restCfg *rest.Config, caData []byte, auth *clientcmdapi.AuthInfo) error {
	proxy, err := proxyURL(restCfg)
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters[cluster] = &clientcmdapi.Cluster{
		Server:                   restCfg.Host,
		TLSServerName:            restCfg.TLSClientConfig.ServerName,
		InsecureSkipTLSVerify:    restCfg.TLSClientConfig.Insecure,
		CertificateAuthorityData: caData,
		ProxyURL:                 proxy,
		DisableCompression:       restCfg.DisableCompression,
	}
	if restCfg.TLSClientConfig.Insecure {
		// The server is not verified with your kubeconfig either; a CA would
		// make client-go refuse the combination.
		kc.Clusters[cluster].CertificateAuthorityData = nil
	}
	kc.AuthInfos[name] = auth
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: name}
	kc.CurrentContext = name
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return fmt.Errorf("encode the kubeconfig: %w", err)
	}
	return writeFile(out, data, protected, force)
}

// kubeCredential is a Kubernetes credential the issuer signed for a key made
// here.
type kubeCredential struct {
	answer *ichorv1alpha1.TalosCredentialRequest
	// leaf is the certificate checked (checkedCertificate), and certPEM it
	// alone: whatever else the answer's status holds is dropped.
	leaf    *x509.Certificate
	certPEM []byte
	// keyPEM is the private key, PKCS#8 "PRIVATE KEY" as kubectl reads it.
	keyPEM []byte
	// restCfg is the caller's client configuration, which asked.
	restCfg *rest.Config
}

// requestKubeCredential is the one way a Kubernetes credential is asked for,
// by `ichor cluster kubeconfig` and by the exec credential plugin alike: a
// key made here, the local policy check, the request as the caller, the
// wait for the issuer. prepare, if not nil, reads what else the caller's
// client configuration must give before anything is sent.
func requestKubeCredential(ctx context.Context, o Request, purpose ichorv1alpha1.CredentialPurpose, prepare func(*rest.Config) error) (kubeCredential, error) {
	key, err := newKey()
	if err != nil {
		return kubeCredential{}, err
	}
	reqs, err := checkLocally(ctx, o, purpose, key)
	if err != nil {
		return kubeCredential{}, err
	}
	c, namespace, restCfg, err := kube.ClientWithin(o.Kube, o.Timeout)
	if err != nil {
		return kubeCredential{}, err
	}
	if prepare != nil {
		if err := prepare(restCfg); err != nil {
			return kubeCredential{}, err
		}
	}
	answer, err := requestCredential(ctx, c, o, namespace, o.Cluster, purpose, key, reqs)
	if err != nil {
		return kubeCredential{}, err
	}
	leaf, certPEM, err := checkedCertificate(answer.Status.Certificate, purpose)
	if err != nil {
		return kubeCredential{}, fmt.Errorf("TalosCredentialRequest %s/%s: %w", answer.Namespace, answer.Name, err)
	}
	keyPEM, err := privateKeyPEM(key, "PRIVATE KEY")
	if err != nil {
		return kubeCredential{}, err
	}
	return kubeCredential{answer: answer, leaf: leaf, certPEM: certPEM, keyPEM: keyPEM, restCfg: restCfg}, nil
}

// checkedCertificate is the certificate of a credential's answer alone, its
// first PEM block (whatever else the status holds, text or more blocks, up
// to a megabyte, is dropped), refused unless it is a client's and, for an
// admin kubeconfig, outside system:masters, for a reader's talosconfig
// os:reader alone: whoever may write the request's status, or an issuer
// gone wrong, would otherwise hand the person a break-glass credential under
// an admin's name, or os:admin under a reader's (reviews 164, 170, 171).
func checkedCertificate(status string, purpose ichorv1alpha1.CredentialPurpose) (*x509.Certificate, []byte, error) {
	block, _ := pem.Decode([]byte(status))
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, nil, errors.New("the issued certificate is not a PEM CERTIFICATE")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("the issued certificate does not parse: %w", err)
	}
	if purpose == ichorv1alpha1.PurposeKubeconfigAdmin && slices.Contains(leaf.Subject.Organization, "system:masters") {
		return nil, nil, errors.New("the issued certificate is in group system:masters, which an admin kubeconfig never is; it is not used")
	}
	// The reader's talosconfig is said to be os:reader, and is only that.
	if purpose == ichorv1alpha1.PurposeTalosconfigReader && !slices.Equal(leaf.Subject.Organization, []string{"os:reader"}) {
		return nil, nil, fmt.Errorf("the issued certificate is for Talos roles %q, not os:reader alone; it is not used", leaf.Subject.Organization)
	}
	if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		return nil, nil, errors.New("the issued certificate is not for client authentication; it is not used")
	}
	return leaf, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes}), nil
}

// checkLocally asks the embedded policy's issuance decision before anything
// is sent, so a lifetime above the cap (or a key the policy refuses) is
// refused here without a request, an Event or a certificate. The webhook and
// the controller decide again; this check only spares the round trip.
func checkLocally(ctx context.Context, o Request, purpose ichorv1alpha1.CredentialPurpose, key ed25519.PrivateKey) (engine.CredentialRequirements, error) {
	decisionLog := io.Discard
	if o.DecisionLog != "" {
		f, err := os.OpenFile(o.DecisionLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return engine.CredentialRequirements{}, fmt.Errorf("decision log: %w", err)
		}
		defer f.Close()
		decisionLog = f
	}
	eng, err := engine.New(ctx, engine.Options{DecisionLog: decisionLog, Log: o.Progress, ID: "ichor-cli"})
	if err != nil {
		return engine.CredentialRequirements{}, err
	}
	defer eng.Stop(ctx)
	facts, _ := engine.ParsePublicKey(publicKeyPEM(key))
	d, err := eng.CheckCredential(ctx, engine.CredentialCheckInput{
		Purpose:    string(purpose),
		TTLSeconds: o.ttlSeconds(),
		PublicKey:  facts,
	})
	if err != nil {
		return engine.CredentialRequirements{}, fmt.Errorf("check the request against the policy: %w", err)
	}
	if !d.Allowed {
		return engine.CredentialRequirements{}, usage.Errorf("refused by the policy before anything was sent: %s", d.Reasons.String())
	}
	// What the purpose needs, to explain a refusal by the API server's RBAC,
	// which happens before the webhook could name it.
	reqs, err := eng.Requirements(ctx, string(purpose))
	if err != nil {
		return engine.CredentialRequirements{}, fmt.Errorf("the policy's requirements of %s: %w", purpose, err)
	}
	return reqs, nil
}

func (o Request) ttlSeconds() *float64 {
	if o.TTL == nil {
		return nil
	}
	s := o.TTL.Seconds()
	return &s
}

func (o Request) ttlSpec() *metav1.Duration {
	if o.TTL == nil {
		return nil
	}
	return &metav1.Duration{Duration: *o.TTL}
}

// requestCredential creates the TalosCredentialRequest and waits for the controller's
// answer. A refusal, by the webhook or by the controller, is an error with
// the policy's message.
func requestCredential(ctx context.Context, c client.Client, o Request, namespace, cluster string, purpose ichorv1alpha1.CredentialPurpose, key ed25519.PrivateKey, reqs engine.CredentialRequirements) (*ichorv1alpha1.TalosCredentialRequest, error) {
	// One deadline for the whole exchange, from the first request: under
	// kubectl, whose plugin runs have none, a server that accepts the
	// connection and never answers would hold kubectl, and the cache's
	// lock every other run waits on, for good (review 164).
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	requester, err := credential.WhoAmI(ctx, c)
	if err != nil {
		if late := unanswered(parent, ctx, o.Timeout, err); late != nil {
			return nil, late
		}
		return nil, err
	}
	tcr := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, GenerateName: generateName(cluster, purpose)},
		Spec: ichorv1alpha1.TalosCredentialRequestSpec{
			ClusterName: cluster,
			Purpose:     purpose,
			TTL:         o.ttlSpec(),
			PublicKey:   publicKeyPEM(key),
			Requester:   requester,
		},
	}
	if err := c.Create(ctx, tcr); err != nil {
		if late := unanswered(parent, ctx, o.Timeout, err); late != nil {
			return nil, late
		}
		byWebhook := strings.Contains(err.Error(), "admission webhook")
		if apierrors.IsForbidden(err) && !byWebhook {
			// The API server's RBAC refused before the webhook saw it (or
			// another admission plugin: a quota, a namespace being
			// deleted), which is not held: RBAC's refusal costs the server
			// little, and the others pass.
			a := reqs.Authorization
			return nil, fmt.Errorf("the request for a %s credential of cluster %s/%s was refused: %w\n(asking needs create and get on taloscredentialrequests.ichor.dev, and the credential needs %s on %s.%s/%s %q, in namespace %q)",
				purpose, namespace, cluster, err, a.Verb, a.Resource, a.Group, a.Subresource, cluster, namespace)
		}
		err = fmt.Errorf("the request for a %s credential of cluster %s/%s was refused: %w", purpose, namespace, cluster, err)
		// The webhook's denial (403: a failure to record is a 503) and an
		// admission policy's or the schema's (422) are the rules' answer
		// to this request; anything else (a timeout, a server away) may
		// pass.
		if (apierrors.IsForbidden(err) && byWebhook) || apierrors.IsInvalid(err) {
			return nil, refused(err)
		}
		return nil, err
	}
	ref := types.NamespacedName{Namespace: tcr.Namespace, Name: tcr.Name}
	// The answer is read by name: a request deleted and made again under
	// it (by whoever may) is another's, never this one's answer.
	uid := tcr.UID
	fmt.Fprintf(o.Progress, "Requested %s for cluster %s/%s (TalosCredentialRequest %s); waiting for the controller", purpose, namespace, cluster, ref)

	start := time.Now()
	lastProgress := start
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	// The last read's failure, said with the timeout: under the exec
	// plugin the progress goes nowhere, and the timeout alone blamed the
	// manager (review 186).
	var lastErr error
	// unauthorizedSince is when the reads began to be refused as
	// Unauthorized, with no other answer since.
	var unauthorizedSince time.Time
	for {
		err := c.Get(ctx, ref, tcr)
		switch {
		case err == nil && tcr.UID != uid:
			fmt.Fprintln(o.Progress)
			return nil, fmt.Errorf("TalosCredentialRequest %s was deleted and made again by someone else before it was answered", ref)
		case err == nil:
			// A read that succeeds since: the timeout is the manager's
			// again, not an old failure's (review 188).
			lastErr, unauthorizedSince = nil, time.Time{}
			if ready := meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady); ready != nil {
				// Whoever may write the request's status wrote these: each
				// is kept to its line, so that it cannot add a line of
				// ichor's own above kubectl's (review 234 F1).
				reason := termsafe.EscapeLine(ready.Reason)
				fmt.Fprintf(o.Progress, " answered after %s: %s\n", time.Since(start).Round(100*time.Millisecond), reason)
				if ready.Status != metav1.ConditionTrue {
					err := fmt.Errorf("TalosCredentialRequest %s was not issued (%s): %s", ref, reason, termsafe.EscapeLine(ready.Message))
					if ready.Reason == ichorv1alpha1.ReasonRefused {
						// The issuer's rules refused it; a failure to
						// sign (Failed) may pass.
						return nil, refused(err)
					}
					return nil, err
				}
				if err := matchesKey(tcr.Status.Certificate, key); err != nil {
					return nil, fmt.Errorf("TalosCredentialRequest %s: %w", ref, err)
				}
				return tcr, nil
			}
		case apierrors.IsNotFound(err):
			fmt.Fprintln(o.Progress)
			return nil, fmt.Errorf("TalosCredentialRequest %s was deleted before this command read an answer (by someone else, or by the manager two minutes after it answered)", ref)
		case apierrors.IsForbidden(err):
			// Not to be waited out: no retry will be let read it.
			fmt.Fprintln(o.Progress)
			return nil, fmt.Errorf("reading TalosCredentialRequest %s for its answer was refused: %w (waiting for the answer needs get on taloscredentialrequests.ichor.dev in namespace %q); it stays, and may still be issued to no one", ref, err, ref.Namespace)
		case apierrors.IsUnauthorized(err) && !unauthorizedSince.IsZero() && time.Since(unauthorizedSince) >= unauthorizedFor:
			// Retried for a while, since client-go's exec authenticator
			// asks its plugin for a new credential after one (review 188)
			// and an authenticator may be away for a moment; not until the
			// timeout, for a token revoked or a certificate expired
			// (reviews 190, 192).
			fmt.Fprintln(o.Progress)
			return nil, fmt.Errorf("reading TalosCredentialRequest %s for its answer was refused for %s: %w (your kubeconfig's credential is no longer accepted: log in again); it stays, and may still be issued to no one", ref, time.Since(unauthorizedSince).Round(time.Second), err)
		case ctx.Err() == nil:
			lastErr = err
			switch {
			case !apierrors.IsUnauthorized(err):
				unauthorizedSince = time.Time{}
			case unauthorizedSince.IsZero():
				unauthorizedSince = time.Now()
			}
			fmt.Fprintf(o.Progress, " (reading it failed, retrying: %s)", termsafe.ErrorText(err))
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(o.Progress)
			if err := parent.Err(); err != nil {
				// Interrupted, not timed out: the request stays, and the
				// manager may still answer it.
				return nil, fmt.Errorf("stopped waiting for TalosCredentialRequest %s: %w; it stays, and may still be issued to no one (kubectl delete taloscredentialrequest -n %s %s)", ref, err, ref.Namespace, ref.Name)
			}
			if lastErr != nil {
				return nil, fmt.Errorf("no answer to TalosCredentialRequest %s read within %s: the last read failed: %w", ref, o.Timeout, lastErr)
			}
			return nil, fmt.Errorf("no answer to TalosCredentialRequest %s within %s; is the Ichor manager running?", ref, o.Timeout)
		case now := <-ticker.C:
			if now.Sub(lastProgress) >= progressEvery {
				fmt.Fprintf(o.Progress, " %s", now.Sub(start).Round(time.Second))
				lastProgress = now
			} else {
				fmt.Fprint(o.Progress, ".")
			}
		}
	}
}

// RefusedError is a credential request the rules refused: an admission
// policy or the schema, the webhook, or the issuer. Asked again at
// once, it is refused again; the exec plugin holds it for a while
// (execcache.RefusalHold) rather than ask at each run.
type RefusedError struct{ err error }

func refused(err error) error { return RefusedError{err: err} }

func (e RefusedError) Error() string { return e.err.Error() }
func (e RefusedError) Unwrap() error { return e.err }

// unauthorizedFor is how long reads of the answer refused as Unauthorized,
// and nothing else, are retried.
const unauthorizedFor = 10 * time.Second

// unanswered is err said as the API server not answering within timeout,
// when that is why it ended the exchange, not an interruption: the
// exchange's deadline, or a call's own (ClientWithin), which the API's
// discovery meets first. Otherwise it is nil.
func unanswered(parent, ctx context.Context, timeout time.Duration, err error) error {
	var timedOut net.Error
	if parent.Err() == nil && (ctx.Err() != nil || errors.As(err, &timedOut) && timedOut.Timeout()) {
		return fmt.Errorf("the API server did not answer within %s (--timeout): %w", timeout, err)
	}
	return nil
}

func generateName(cluster string, purpose ichorv1alpha1.CredentialPurpose) string {
	base := cluster + "-" + string(purpose)
	// The API server truncates a generateName base itself; keep it a valid
	// name prefix.
	if len(base) > 50 {
		base = base[:50]
	}
	return strings.TrimRight(base, "-.") + "-"
}

// talosEndpoints are, in order of preference, the --talos-endpoints flag,
// the hosts of the cluster's control-plane TalosMachines, and the endpoints
// of the current talosconfig's context. The operator's flag comes first:
// whoever may write a TalosMachine of the namespace names its endpoint, and
// one the operator gave is not overridden by it (the hostile review of
// 2026-12-05).
func talosEndpoints(ctx context.Context, c client.Client, namespace, cluster string, flag []string, current string) ([]string, string, error) {
	if len(flag) > 0 {
		return flag, "--talos-endpoints", nil
	}
	var machines ichorv1alpha1.TalosMachineList
	err := c.List(ctx, &machines, client.InNamespace(namespace))
	var fromMachines []string
	if err == nil {
		for _, m := range machines.Items {
			if m.Spec.ClusterName == cluster && m.Spec.Role == ichorv1alpha1.MachineRoleControlPlane {
				fromMachines = append(fromMachines, talosEndpointOf(m.Spec.Endpoint))
			}
		}
	}
	slices.Sort(fromMachines)
	fromMachines = slices.Compact(fromMachines)
	if len(fromMachines) > 0 {
		return fromMachines, "the control-plane TalosMachines", nil
	}
	if cfg, cerr := readTalosconfig(current); cerr == nil {
		if tc, ok := cfg.Contexts[cfg.Context]; ok && len(tc.Endpoints) > 0 {
			return tc.Endpoints, "the current talosconfig " + current, nil
		}
	}
	if err != nil {
		// The API server's failure (unreachable, forbidden) is not a wrong
		// command line: exit 1, with --talos-endpoints as the way around it.
		return nil, "", fmt.Errorf("no Talos endpoints for cluster %s/%s: the TalosMachines could not be listed (%w), and neither --talos-endpoints nor the current talosconfig (%s) names any", namespace, cluster, err, current)
	}
	why := "the cluster has no control-plane TalosMachines"
	return nil, "", usage.Errorf("no Talos endpoints for cluster %s/%s: %s, and neither --talos-endpoints nor the current talosconfig (%s) names any", namespace, cluster, why, current)
}

// talosEndpointOf is a machine's endpoint as a talosconfig writes it: the host
// alone when the port is the Talos API's default (talosctl adds it), else
// host:port, since dropping another port would point talosctl elsewhere.
func talosEndpointOf(endpoint string) string {
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return endpoint
	}
	if port == strconv.Itoa(constants.ApidPort) {
		return host
	}
	return endpoint
}

// talosconfigInUse is the talosconfig talosctl reads, found as machinery's
// clientconfig.Open("") finds it: the first of $TALOSCONFIG,
// ~/.talos/config (or $TALOS_HOME/config) and the service account's that
// exists, else the first writable one, which talosctl would create. Unlike
// Open it creates nothing. Before, the current talosconfig was
// $TALOSCONFIG even when that file was missing and talosctl read
// ~/.talos/config, which --out --force then replaced (the hostile review of
// the writing commands, #6).
func talosconfigInUse() (clientconfig.Path, error) {
	paths, err := talosconfigPaths()
	if err != nil {
		return clientconfig.Path{}, err
	}
	for _, p := range paths {
		if _, err := os.Stat(p.Path); err == nil {
			return p, nil
		}
	}
	return firstWritable(paths)
}

// writableTalosconfig is the talosconfig in use when it may be written, else
// the first that may (a talosconfig of the service account's, mounted
// read-only, has a file written beside the one talosctl would create): the
// default output is beside it, found before anything is asked for.
func writableTalosconfig(inUse clientconfig.Path) (string, error) {
	if inUse.WriteAllowed {
		return inUse.Path, nil
	}
	paths, err := talosconfigPaths()
	if err != nil {
		return "", err
	}
	p, err := firstWritable(paths)
	return p.Path, err
}

// talosconfigPaths are machinery's places of a talosconfig, in its order,
// without an empty $TALOSCONFIG, which machinery's lookup passes over too.
func talosconfigPaths() ([]clientconfig.Path, error) {
	paths, err := clientconfig.GetDefaultPaths()
	if err != nil {
		return nil, fmt.Errorf("locate the current talosconfig: %w", err)
	}
	return slices.DeleteFunc(paths, func(p clientconfig.Path) bool { return p.Path == "" }), nil
}

func firstWritable(paths []clientconfig.Path) (clientconfig.Path, error) {
	for _, p := range paths {
		if p.WriteAllowed {
			return p, nil
		}
	}
	return clientconfig.Path{}, errors.New("locate the current talosconfig: none of its places may be written")
}

// readTalosconfig reads the talosconfig at path, an error wrapping
// os.ErrNotExist when there is none. machinery's clientconfig.Open would
// create an empty one there.
func readTalosconfig(path string) (*clientconfig.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		// An empty file is an empty talosconfig, not a YAML error.
		return &clientconfig.Config{Contexts: map[string]*clientconfig.Context{}}, nil
	}
	cfg, err := clientconfig.FromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if cfg.Contexts == nil {
		cfg.Contexts = map[string]*clientconfig.Context{}
	}
	return cfg, nil
}

// checkOutput refuses an output file that is one of the protected files (the
// caller's current talosconfig or kubeconfig), or that exists without force.
func checkOutput(out string, protected []string, force bool) error {
	for _, p := range protected {
		if samePath(out, p) {
			return usage.Errorf("refusing to write %s: it is the file you use now (%s); pass another --out", out, p)
		}
	}
	if _, err := os.Lstat(out); err == nil && !force {
		return usage.Errorf("refusing to overwrite %s: it exists; pass --force to replace it", out)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("check %s: %w", out, err)
	}
	return nil
}

// samePath reports whether two paths name the same file: the same file on
// disk, or the same absolute path once symbolic links are resolved.
func samePath(a, b string) bool {
	if ai, err := os.Stat(a); err == nil {
		if bi, err := os.Stat(b); err == nil && os.SameFile(ai, bi) {
			return true
		}
	}
	return resolvePath(a) == resolvePath(b)
}

func resolvePath(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return filepath.Clean(p)
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r
	}
	// The file does not exist yet: resolve its directory.
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(dir, filepath.Base(abs))
	}
	return abs
}

// writeFile writes data to path with mode 0600, through a temporary
// file in the same directory: without force it is linked into place, which
// fails if path appeared meanwhile; with force it is renamed over it.
func writeFile(path string, data []byte, protected []string, force bool) error {
	if err := checkOutput(path, protected, force); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	// On the disk before it takes the name: a merge replaces the person's
	// talosconfig, and a crash after a rename of unsynced data can leave it
	// empty on filesystems that do not order the two (review 186).
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if force {
		err = os.Rename(tmp.Name(), path)
	} else {
		err = os.Link(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func newKey() (ed25519.PrivateKey, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate the key: %w", err)
	}
	return key, nil
}

func publicKeyPEM(key ed25519.PrivateKey) string {
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		// An Ed25519 public key always marshals.
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// privateKeyPEM is the key in PKCS#8; talosctl labels Ed25519 keys
// "ED25519 PRIVATE KEY", kubectl reads "PRIVATE KEY".
func privateKeyPEM(key crypto.PrivateKey, label string) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode the key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: label, Bytes: der}), nil
}

// matchesKey checks the answer is a certificate for this process's key.
func matchesKey(certPEM string, key ed25519.PrivateKey) error {
	block, _ := pem.Decode([]byte(certPEM))
	if block == nil {
		return errors.New("the answer holds no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("the answer's certificate does not parse: %w", err)
	}
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok || !pub.Equal(key.Public()) {
		return errors.New("the answer's certificate is not for the key this command made")
	}
	return nil
}

// serverCA is the CA your kubeconfig verifies the server with, if any.
func serverCA(cfg *rest.Config) ([]byte, error) {
	if len(cfg.TLSClientConfig.CAData) > 0 {
		return cfg.TLSClientConfig.CAData, nil
	}
	if cfg.TLSClientConfig.CAFile != "" {
		data, err := os.ReadFile(cfg.TLSClientConfig.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read the server CA of your kubeconfig: %w", err)
		}
		return data, nil
	}
	return nil, nil
}

// joinPEM concatenates PEM bundles, each certificate once.
func joinPEM(bundles ...[]byte) []byte {
	var out bytes.Buffer
	seen := map[string]bool{}
	for _, b := range bundles {
		for {
			var block *pem.Block
			block, b = pem.Decode(b)
			if block == nil {
				break
			}
			if seen[string(block.Bytes)] {
				continue
			}
			seen[string(block.Bytes)] = true
			_ = pem.Encode(&out, block)
		}
	}
	return out.Bytes()
}

// expiry is when the certificate written expires: its own date, not the
// status's expiresAt, which says what the certificate holds only if its
// writer did (review 186).
func expiry(leaf *x509.Certificate) string {
	return leaf.NotAfter.UTC().Format(time.RFC3339)
}

// proxyURL is the proxy your client configuration reaches the server
// through (its kubeconfig's proxy-url, or --proxy-url), which a kubeconfig
// written for that server keeps: without it, the admin kubeconfig dialled
// the server directly, past a proxy your network requires (review 186).
// Empty when none is set: then the environment's, as for yours.
func proxyURL(cfg *rest.Config) (string, error) {
	if cfg.Proxy == nil {
		return "", nil
	}
	server, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return "", fmt.Errorf("the server of your kubeconfig: %w", err)
	}
	u, err := cfg.Proxy(&http.Request{URL: server})
	if err != nil || u == nil {
		return "", err
	}
	return u.String(), nil
}
