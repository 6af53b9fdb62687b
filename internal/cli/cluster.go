package cli

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
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/credential"
)

// Suffixes of the default output files: beside the caller's current file,
// never over it.
const (
	talosconfigSuffix     = ".ichor-reader"
	adminKubeconfigSuffix = ".ichor-admin"
	breakGlassSuffix      = ".ichor-break-glass"
)

// credPollInterval is how often the request's status is read while waiting.
const credPollInterval = 500 * time.Millisecond

// credProgressEvery is how often the wait says it is still waiting.
const credProgressEvery = 5 * time.Second

// clusterKubeFlags are the caller's kubeconfig, as kubectl reads it.
type clusterKubeFlags struct {
	kubeconfig string
	context    string
	namespace  string
}

func (k *clusterKubeFlags) loader() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: k.context}
	overrides.Context.Namespace = k.namespace
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
}

// kubeconfigFiles are the files the caller's kubeconfig is read from.
func (k *clusterKubeFlags) kubeconfigFiles() []string {
	if k.kubeconfig != "" {
		return []string{k.kubeconfig}
	}
	return clientcmd.NewDefaultClientConfigLoadingRules().GetLoadingPrecedence()
}

// credentialFlags are the flags of every credential command.
type credentialFlags struct {
	kube          clusterKubeFlags
	ttl           time.Duration
	ttlSet        bool
	out           string
	force         bool
	timeout       time.Duration
	decisionLog   string
	talosEndpoint []string
	breakGlass    bool
}

func newClusterCommand(s streams) *cobra.Command {
	var k clusterKubeFlags
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Ask for short-lived credentials of a Talos cluster",
		Long: `Ask Ichor for a short-lived credential of a TalosCluster with your own Kubernetes
identity. The key is made here and never leaves this process except in the file
written; the request carries only the public key. Whether you may have the
credential is decided by the policy at admission (the webhook checks your RBAC
verb and records an Event naming you) and again by the controller before it signs.`,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&k.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	pf.StringVar(&k.context, "context", "", "the kubeconfig context to use")
	pf.StringVarP(&k.namespace, "namespace", "n", "", "namespace of the TalosCluster (default: the context's)")
	cmd.AddCommand(newTalosconfigCommand(s, &k), newKubeconfigCommand(s, &k))
	return cmd
}

func addCredentialFlags(cmd *cobra.Command, o *credentialFlags, what string) {
	f := cmd.Flags()
	f.DurationVar(&o.ttl, "ttl", 0, "lifetime of the "+what+" (default: the policy's default for it); above the policy's cap it is refused, never shortened")
	f.StringVarP(&o.out, "out", "o", "", "file to write")
	f.BoolVar(&o.force, "force", false, "replace --out if it exists (never the file you are using now)")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long to wait for the controller's answer")
	f.StringVar(&o.decisionLog, "decision-log", "", "append the local policy check's decision log (JSON lines) to this file")
}

func newTalosconfigCommand(s streams, k *clusterKubeFlags) *cobra.Command {
	o := credentialFlags{}
	cmd := &cobra.Command{
		Use:   "talosconfig NAME [--ttl 1h] [--out FILE] [--talos-endpoints HOST,...] [-n NAMESPACE]",
		Short: "Get a read-only (os:reader) talosconfig for talosctl",
		Long: `Get a talosconfig whose certificate carries the Talos role os:reader: talosctl can
read (version, get members, logs, dmesg, processes) and is refused anything that
changes a node. You need the RBAC verb download on talosclusters/talosconfig-reader
for the cluster (ichor-operator and ichor-admin hold it).

The file is written with mode 0600. By default it goes beside your current
talosconfig ($TALOSCONFIG or ~/.talos/config) with the suffix .ichor-reader; the
current talosconfig is never overwritten, nor any existing file without --force.
The endpoints are the cluster's control-plane machines, else --talos-endpoints,
else those of your current talosconfig.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.kube = *k
			o.ttlSet = cmd.Flags().Changed("ttl")
			return runTalosconfig(cmd.Context(), s, o, args[0])
		},
	}
	addCredentialFlags(cmd, &o, "talosconfig")
	cmd.Flags().StringSliceVar(&o.talosEndpoint, "talos-endpoints", nil, "Talos API endpoints to write when the cluster has no control-plane TalosMachines")
	return cmd
}

func newKubeconfigCommand(s streams, k *clusterKubeFlags) *cobra.Command {
	o := credentialFlags{}
	cmd := &cobra.Command{
		Use:   "kubeconfig NAME [--out FILE] [--ttl DURATION] [--break-glass] [-n NAMESPACE]",
		Short: "Get a cluster-admin kubeconfig (revocable by RBAC)",
		Long: `Get a kubeconfig for the cluster Ichor runs in whose certificate is in the group
ichor:cluster-admins, bound to cluster-admin by the ClusterRoleBinding
ichor:cluster-admins: deleting that binding revokes every such kubeconfig at once.
You need download on talosclusters/kubeconfig-admin.

--break-glass asks for the super-admin kubeconfig instead (group system:masters,
which RBAC cannot restrict; only its short lifetime limits it). It needs download
on talosclusters/kubeconfig-super-admin, which no shipped role holds, and every
issuance is a Warning Event on the cluster.

The server and its CA come from your kubeconfig. The file is written with mode
0600, by default beside your kubeconfig with the suffix .ichor-admin (or
.ichor-break-glass); your kubeconfig is never overwritten, nor any existing file
without --force.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.kube = *k
			o.ttlSet = cmd.Flags().Changed("ttl")
			return runKubeconfig(cmd.Context(), s, o, args[0])
		},
	}
	addCredentialFlags(cmd, &o, "kubeconfig")
	cmd.Flags().BoolVar(&o.breakGlass, "break-glass", false, "ask for the break-glass super-admin kubeconfig (system:masters)")
	return cmd
}

func runTalosconfig(ctx context.Context, s streams, o credentialFlags, cluster string) error {
	current, err := currentTalosconfigPath()
	if err != nil {
		return err
	}
	out := o.out
	if out == "" {
		out = current + talosconfigSuffix
	}
	if err := credCheckOutput(out, []string{current}, o.force); err != nil {
		return err
	}
	key, err := credNewKey()
	if err != nil {
		return err
	}
	reqs, err := credCheckLocally(ctx, s, o, ichorv1alpha1.PurposeTalosconfigReader, key)
	if err != nil {
		return err
	}

	loader := o.kube.loader()
	c, namespace, _, err := credKubeClient(loader)
	if err != nil {
		return err
	}
	endpoints, source, err := credTalosEndpoints(ctx, c, namespace, cluster, o.talosEndpoint, current)
	if err != nil {
		return err
	}
	fmt.Fprintf(s.err, "Talos endpoints (%s): %s\n", source, strings.Join(endpoints, ", "))

	answer, err := credRequest(ctx, s, c, o, namespace, cluster, ichorv1alpha1.PurposeTalosconfigReader, key, reqs)
	if err != nil {
		return err
	}
	keyPEM, err := credPrivateKeyPEM(key, "ED25519 PRIVATE KEY")
	if err != nil {
		return err
	}
	contextName := cluster + "-reader"
	cfg := &clientconfig.Config{
		Context: contextName,
		Contexts: map[string]*clientconfig.Context{contextName: {
			Endpoints: endpoints,
			CA:        base64.StdEncoding.EncodeToString([]byte(answer.Status.TrustBundle)),
			Crt:       base64.StdEncoding.EncodeToString([]byte(answer.Status.Certificate)),
			Key:       base64.StdEncoding.EncodeToString(keyPEM),
		}},
	}
	data, err := cfg.Bytes()
	if err != nil {
		return fmt.Errorf("encode the talosconfig: %w", err)
	}
	if err := credWriteFile(out, data, []string{current}, o.force); err != nil {
		return err
	}
	fmt.Fprintf(s.out, "Wrote an os:reader talosconfig for %s/%s to %s (expires %s).\nUse it with: talosctl --talosconfig %s version\n",
		namespace, cluster, out, credExpiry(answer), out)
	return nil
}

func runKubeconfig(ctx context.Context, s streams, o credentialFlags, cluster string) error {
	purpose, suffix, what := ichorv1alpha1.PurposeKubeconfigAdmin, adminKubeconfigSuffix, "an admin kubeconfig"
	if o.breakGlass {
		purpose, suffix, what = ichorv1alpha1.PurposeKubeconfigSuperAdmin, breakGlassSuffix, "a break-glass kubeconfig"
	}
	protected := o.kube.kubeconfigFiles()
	out := o.out
	if out == "" {
		if len(protected) == 0 {
			return usagef("no kubeconfig file to write beside: pass --out")
		}
		out = protected[0] + suffix
	}
	if err := credCheckOutput(out, protected, o.force); err != nil {
		return err
	}
	key, err := credNewKey()
	if err != nil {
		return err
	}
	reqs, err := credCheckLocally(ctx, s, o, purpose, key)
	if err != nil {
		return err
	}

	loader := o.kube.loader()
	c, namespace, restCfg, err := credKubeClient(loader)
	if err != nil {
		return err
	}
	caData, err := credServerCA(restCfg)
	if err != nil {
		return err
	}

	answer, err := credRequest(ctx, s, c, o, namespace, cluster, purpose, key, reqs)
	if err != nil {
		return err
	}
	keyPEM, err := credPrivateKeyPEM(key, "PRIVATE KEY")
	if err != nil {
		return err
	}
	name := cluster + "-" + strings.TrimPrefix(string(purpose), "kubeconfig-")
	kc := clientcmdapi.NewConfig()
	kc.Clusters[cluster] = &clientcmdapi.Cluster{
		Server:                   restCfg.Host,
		TLSServerName:            restCfg.TLSClientConfig.ServerName,
		InsecureSkipTLSVerify:    restCfg.TLSClientConfig.Insecure,
		CertificateAuthorityData: credJoinPEM(caData, []byte(answer.Status.TrustBundle)),
	}
	if restCfg.TLSClientConfig.Insecure {
		// The server is not verified with your kubeconfig either; a CA would
		// make client-go refuse the combination.
		kc.Clusters[cluster].CertificateAuthorityData = nil
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificateData: []byte(answer.Status.Certificate),
		ClientKeyData:         keyPEM,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: name}
	kc.CurrentContext = name
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return fmt.Errorf("encode the kubeconfig: %w", err)
	}
	if err := credWriteFile(out, data, protected, o.force); err != nil {
		return err
	}
	fmt.Fprintf(s.out, "Wrote %s for %s to %s (expires %s).\nUse it with: kubectl --kubeconfig %s get nodes\n",
		what, restCfg.Host, out, credExpiry(answer), out)
	return nil
}

// credCheckLocally asks the embedded policy's issuance decision before anything
// is sent, so a lifetime above the cap (or a key the policy refuses) is
// refused here without a request, an Event or a certificate. The webhook and
// the controller decide again; this check only spares the round trip.
func credCheckLocally(ctx context.Context, s streams, o credentialFlags, purpose ichorv1alpha1.CredentialPurpose, key ed25519.PrivateKey) (engine.CredentialRequirements, error) {
	decisionLog := io.Discard
	if o.decisionLog != "" {
		f, err := os.OpenFile(o.decisionLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return engine.CredentialRequirements{}, fmt.Errorf("decision log: %w", err)
		}
		defer f.Close()
		decisionLog = f
	}
	eng, err := engine.New(ctx, engine.Options{DecisionLog: decisionLog, Log: s.err, ID: "ichor-cli"})
	if err != nil {
		return engine.CredentialRequirements{}, err
	}
	defer eng.Stop(ctx)
	facts, _ := engine.ParsePublicKey(credPublicKeyPEM(key))
	d, err := eng.CheckCredential(ctx, engine.CredentialCheckInput{
		Purpose:    string(purpose),
		TTLSeconds: o.ttlSeconds(),
		PublicKey:  facts,
	})
	if err != nil {
		return engine.CredentialRequirements{}, fmt.Errorf("check the request against the policy: %w", err)
	}
	if !d.Allowed {
		return engine.CredentialRequirements{}, usagef("refused by the policy before anything was sent: %s", engine.Messages(d.Reasons))
	}
	// What the purpose needs, to explain a refusal by the API server's RBAC,
	// which happens before the webhook could name it.
	reqs, err := eng.Requirements(ctx, string(purpose))
	if err != nil {
		return engine.CredentialRequirements{}, fmt.Errorf("the policy's requirements of %s: %w", purpose, err)
	}
	return reqs, nil
}

func (o credentialFlags) ttlSeconds() *float64 {
	if !o.ttlSet {
		return nil
	}
	s := o.ttl.Seconds()
	return &s
}

func (o credentialFlags) ttlSpec() *metav1.Duration {
	if !o.ttlSet {
		return nil
	}
	return &metav1.Duration{Duration: o.ttl}
}

// credRequest creates the TalosCredentialRequest and waits for the controller's
// answer. A refusal, by the webhook or by the controller, is an error with
// the policy's message.
func credRequest(ctx context.Context, s streams, c client.Client, o credentialFlags, namespace, cluster string, purpose ichorv1alpha1.CredentialPurpose, key ed25519.PrivateKey, reqs engine.CredentialRequirements) (*ichorv1alpha1.TalosCredentialRequest, error) {
	requester, err := credential.WhoAmI(ctx, c)
	if err != nil {
		return nil, err
	}
	tcr := &ichorv1alpha1.TalosCredentialRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, GenerateName: credGenerateName(cluster, purpose)},
		Spec: ichorv1alpha1.TalosCredentialRequestSpec{
			ClusterName: cluster,
			Purpose:     purpose,
			TTL:         o.ttlSpec(),
			PublicKey:   credPublicKeyPEM(key),
			Requester:   requester,
		},
	}
	if err := c.Create(ctx, tcr); err != nil {
		if apierrors.IsForbidden(err) && !strings.Contains(err.Error(), "admission webhook") {
			// The API server's RBAC refused before the webhook saw it.
			a := reqs.Authorization
			return nil, fmt.Errorf("the request for a %s credential of cluster %s/%s was refused: %w\n(asking needs create on taloscredentialrequests.ichor.dev, and the credential needs %s on %s.%s/%s %q, in namespace %q)",
				purpose, namespace, cluster, err, a.Verb, a.Resource, a.Group, a.Subresource, cluster, namespace)
		}
		return nil, fmt.Errorf("the request for a %s credential of cluster %s/%s was refused: %w", purpose, namespace, cluster, err)
	}
	ref := types.NamespacedName{Namespace: tcr.Namespace, Name: tcr.Name}
	fmt.Fprintf(s.err, "Requested %s for cluster %s/%s (TalosCredentialRequest %s); waiting for the controller", purpose, namespace, cluster, ref)

	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	start := time.Now()
	lastProgress := start
	ticker := time.NewTicker(credPollInterval)
	defer ticker.Stop()
	for {
		err := c.Get(ctx, ref, tcr)
		switch {
		case err == nil:
			if ready := meta.FindStatusCondition(tcr.Status.Conditions, ichorv1alpha1.ConditionReady); ready != nil {
				fmt.Fprintf(s.err, " answered after %s: %s\n", time.Since(start).Round(100*time.Millisecond), ready.Reason)
				if ready.Status != metav1.ConditionTrue {
					return nil, fmt.Errorf("TalosCredentialRequest %s was not issued (%s): %s", ref, ready.Reason, ready.Message)
				}
				if err := credMatchesKey(tcr.Status.Certificate, key); err != nil {
					return nil, fmt.Errorf("TalosCredentialRequest %s: %w", ref, err)
				}
				return tcr, nil
			}
		case apierrors.IsNotFound(err):
			fmt.Fprintln(s.err)
			return nil, fmt.Errorf("TalosCredentialRequest %s was deleted before it was answered", ref)
		case ctx.Err() == nil:
			fmt.Fprintf(s.err, " (reading it failed, retrying: %v)", err)
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(s.err)
			return nil, fmt.Errorf("no answer to TalosCredentialRequest %s within %s; is the Ichor manager running?", ref, o.timeout)
		case now := <-ticker.C:
			if now.Sub(lastProgress) >= credProgressEvery {
				fmt.Fprintf(s.err, " %s", now.Sub(start).Round(time.Second))
				lastProgress = now
			} else {
				fmt.Fprint(s.err, ".")
			}
		}
	}
}

func credGenerateName(cluster string, purpose ichorv1alpha1.CredentialPurpose) string {
	base := cluster + "-" + string(purpose)
	// The API server truncates a credGenerateName base itself; keep it a valid
	// name prefix.
	if len(base) > 50 {
		base = base[:50]
	}
	return strings.TrimRight(base, "-.") + "-"
}

// credKubeClient is a client of the caller's cluster, the namespace to use, and
// the client configuration.
func credKubeClient(loader clientcmd.ClientConfig) (client.Client, string, *rest.Config, error) {
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, "", nil, fmt.Errorf("kubeconfig: %w", err)
	}
	namespace, _, err := loader.Namespace()
	if err != nil {
		return nil, "", nil, fmt.Errorf("kubeconfig namespace: %w", err)
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, "", nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", nil, fmt.Errorf("client: %w", err)
	}
	return c, namespace, cfg, nil
}

// credTalosEndpoints are, in order of preference, the hosts of the cluster's
// control-plane TalosMachines, the --talos-endpoints flag, and the
// endpoints of the current talosconfig's context.
func credTalosEndpoints(ctx context.Context, c client.Client, namespace, cluster string, flag []string, current string) ([]string, string, error) {
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
	switch {
	case len(fromMachines) > 0:
		source := "the control-plane TalosMachines"
		if len(flag) > 0 {
			source += "; --talos-endpoints is used only when the cluster has none"
		}
		return fromMachines, source, nil
	case len(flag) > 0:
		return flag, "--talos-endpoints", nil
	}
	if cfg, cerr := clientconfig.Open(current); cerr == nil {
		if tc, ok := cfg.Contexts[cfg.Context]; ok && len(tc.Endpoints) > 0 {
			return tc.Endpoints, "the current talosconfig " + current, nil
		}
	}
	why := "the cluster has no control-plane TalosMachines"
	if err != nil {
		why = fmt.Sprintf("the TalosMachines could not be listed (%v)", err)
	}
	return nil, "", usagef("no Talos endpoints for cluster %s/%s: %s, and neither --talos-endpoints nor the current talosconfig (%s) names any", namespace, cluster, why, current)
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

// currentTalosconfigPath is the talosconfig talosctl uses now: $TALOSCONFIG, else
// ~/.talos/config (or $TALOS_HOME/config).
func currentTalosconfigPath() (string, error) {
	paths, err := clientconfig.GetDefaultPaths()
	if err != nil || len(paths) == 0 {
		return "", fmt.Errorf("locate the current talosconfig: %w", err)
	}
	return paths[0].Path, nil
}

// credCheckOutput refuses an output file that is one of the protected files (the
// caller's current talosconfig or kubeconfig), or that exists without force.
func credCheckOutput(out string, protected []string, force bool) error {
	for _, p := range protected {
		if credSamePath(out, p) {
			return usagef("refusing to write %s: it is the file you use now (%s); pass another --out", out, p)
		}
	}
	if _, err := os.Lstat(out); err == nil && !force {
		return usagef("refusing to overwrite %s: it exists; pass --force to replace it", out)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("check %s: %w", out, err)
	}
	return nil
}

// credSamePath reports whether two paths name the same file: the same file on
// disk, or the same absolute path once symbolic links are resolved.
func credSamePath(a, b string) bool {
	if ai, err := os.Stat(a); err == nil {
		if bi, err := os.Stat(b); err == nil && os.SameFile(ai, bi) {
			return true
		}
	}
	return credResolvePath(a) == credResolvePath(b)
}

func credResolvePath(p string) string {
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

// credWriteFile writes data to path with mode 0600, through a temporary
// file in the same directory: without force it is linked into place, which
// fails if path appeared meanwhile; with force it is renamed over it.
func credWriteFile(path string, data []byte, protected []string, force bool) error {
	if err := credCheckOutput(path, protected, force); err != nil {
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

func credNewKey() (ed25519.PrivateKey, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate the key: %w", err)
	}
	return key, nil
}

func credPublicKeyPEM(key ed25519.PrivateKey) string {
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		// An Ed25519 public key always marshals.
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// credPrivateKeyPEM is the key in PKCS#8; talosctl labels Ed25519 keys
// "ED25519 PRIVATE KEY", kubectl reads "PRIVATE KEY".
func credPrivateKeyPEM(key crypto.PrivateKey, label string) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode the key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: label, Bytes: der}), nil
}

// credMatchesKey checks the answer is a certificate for this process's key.
func credMatchesKey(certPEM string, key ed25519.PrivateKey) error {
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

// credServerCA is the CA your kubeconfig verifies the server with, if any.
func credServerCA(cfg *rest.Config) ([]byte, error) {
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

// credJoinPEM concatenates PEM bundles, each certificate once.
func credJoinPEM(bundles ...[]byte) []byte {
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

func credExpiry(tcr *ichorv1alpha1.TalosCredentialRequest) string {
	if tcr.Status.ExpiresAt == nil {
		return "unknown"
	}
	return tcr.Status.ExpiresAt.UTC().Format(time.RFC3339)
}
