package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletaudit"
	"github.com/ichor-dev/ichor-policy/controllers/kubeletserving"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/manager"
	"github.com/ichor-dev/ichor-policy/internal/netguard"
	"github.com/ichor-dev/ichor-policy/internal/talos/clustersecrets"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// Exit statuses of `ichor audit kubelet-serving` besides ExitOK (every
// certificate current), ExitError and ExitUsage.
const (
	// ExitDrifted: at least one certificate drifted; the report was printed.
	ExitDrifted = 3
	// ExitUnjudged: none drifted, but at least one certificate could not be
	// judged (its kubelet or its node could not be read).
	ExitUnjudged = 4
)

// auditManagerFlags are the manager's flags of the periodic audit.
type auditManagerFlags struct {
	interval time.Duration
	port     int
}

func (f *auditManagerFlags) add(fs *pflag.FlagSet) {
	fs.DurationVar(&f.interval, "kubelet-serving-audit-interval", 0, "how often the kubelet serving certificates in service are audited against the nodes' identity (TalosMachine condition KubeletServingCertificateCurrent); 0 turns the audit off")
	fs.IntVar(&f.port, "kubelet-port", servingcert.DefaultPort, "the port the kubelets serve their API (and serving certificate) on")
}

// validate refuses what would make every audit unknown, or never run.
func (f auditManagerFlags) validate() error {
	if err := validKubeletPort(f.port); err != nil {
		return err
	}
	if f.interval < 0 {
		return usage.Errorf("--kubelet-serving-audit-interval %s is negative; 0 turns the audit off", f.interval)
	}
	return nil
}

func validKubeletPort(port int) error {
	if port < 1 || port > 65535 {
		return usage.Errorf("--kubelet-port %d is not a port", port)
	}
	return nil
}

func (f auditManagerFlags) apply(o *manager.Options) {
	o.KubeletServingAuditInterval, o.KubeletPort = f.interval, f.port
}

type auditOptions struct {
	kube        *genericclioptions.ConfigFlags
	cluster     string
	port        int
	timeout     time.Duration
	output      *printFlags
	bundle      string
	bundleKey   bundleKeyFlags
	decisionLog string
	// requireSecretsClaim is the manager's flag of that name.
	requireSecretsClaim bool
	// deniedNodes is the manager's --node-denied-networks.
	deniedNodes []string
}

func newAuditCommand(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Audit what is in service against the rules of today",
	}
	cmd.AddCommand(newAuditKubeletServingCommand(s))
	return cmd
}

func newAuditKubeletServingCommand(s streams) *cobra.Command {
	o := auditOptions{kube: kube.NewConfigFlags(), output: newTablePrintFlags(true)}
	cmd := &cobra.Command{
		Use:   "kubelet-serving [--cluster NAME] [-n NAMESPACE] [-o table|wide|json|yaml|name|jsonpath=TEMPLATE]",
		Short: "Audit the kubelet serving certificates in service against the nodes' identity of today",
		Long: `Read the serving certificate each kubelet presents on its port (a TLS handshake,
no credential needed), read the node's identity of today from its Talos API, and
judge the certificate with the audit rule (ichor/kubelet_serving/audit): its names
must still be the node's (the same checks as approval), the cluster's Kubernetes CA
must have issued it, and it must not expire within the rule's warning (30 days).

The clusters are those of the namespace with kubelet serving certificates enabled,
or the one --cluster names. You need what the manager needs: list on TalosClusters
and TalosMachines, and get on each cluster's secrets Secret (the Talos OS CA to read
nodes with, the Kubernetes CA to verify with). The kubelets' port must be reachable
from here.

The table has one row a machine, then the reasons of each certificate that is
not current; -o wide adds the address read and the decision id. -o json, yaml
and jsonpath=TEMPLATE print a List (apiVersion v1) of KubeletServingAudit
objects (cli.ichor.dev/v1alpha1), one a machine, named by the TalosMachine in
its namespace; -o name prints kubeletservingaudit.cli.ichor.dev/MACHINE.

Exit status: 0 when every certificate is current; 3 when at least one drifted;
4 when none drifted but at least one could not be judged (its kubelet or its node
did not answer); 1 for an error (a secrets bundle unreadable, a broken bundle);
2 for a wrong flag.`,
		Example: `  ichor audit kubelet-serving -n team-a
  ichor audit kubelet-serving -n team-a --cluster prod -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAudit(cmd.Context(), s, o)
		},
	}
	f := cmd.Flags()
	// kubectl's flags: -n is the TalosClusters' namespace (default: the
	// context's), as for ichor cluster and ichor render. kubectl's --cluster
	// (a kubeconfig cluster) gives way to this command's, a TalosCluster.
	o.kube.ClusterName = nil
	o.kube.AddFlags(f)
	f.StringVar(&o.cluster, "cluster", "", "audit this TalosCluster only (even if its kubelet serving certificates are not enabled)")
	f.IntVar(&o.port, "kubelet-port", servingcert.DefaultPort, "the port the kubelets serve on")
	f.DurationVar(&o.timeout, "timeout", servingcert.DefaultTimeout, "bound on each TLS handshake and each Talos identity read")
	o.output.register(cmd)
	f.StringVar(&o.bundle, "bundle", "", "a policy directory or bundle tarball to judge with (default: the embedded bundle)")
	o.bundleKey.register(f)
	_ = cmd.RegisterFlagCompletionFunc("cluster", completeTalosClusters(o.kube))
	f.StringVar(&o.decisionLog, "decision-log", "", "append the audit's decision log (JSON lines) to this file")
	f.StringSliceVar(&o.deniedNodes, "node-denied-networks", []string{netguard.DefaultKeyword}, "as the manager's flag: networks no Talos API read or kubelet handshake connects to (whoever writes a TalosMachine names its endpoint, and the node its kubelet's address), checked after DNS; \"default\" is loopback, link-local, the clouds' instance metadata addresses, unspecified and multicast; empty denies none")
	f.BoolVar(&o.requireSecretsClaim, "require-secrets-claim", true, "as the manager's flag: read a cluster's secrets Secret only if its annotation "+ichorv1alpha1.SecretsClaimAnnotation+" names the cluster (or is *); false also reads one without the annotation, for the time of an upgrade")
	return cmd
}

// auditRow is one machine's audit, as -o json prints it.
type auditRow struct {
	Namespace  string         `json:"namespace"`
	Cluster    string         `json:"cluster"`
	Machine    string         `json:"machine"`
	Node       string         `json:"node"`
	Address    string         `json:"address"`
	Status     string         `json:"status"`
	Expires    string         `json:"expires,omitempty"`
	Serial     string         `json:"serial,omitempty"`
	Reasons    engine.Reasons `json:"reasons"`
	DecisionID string         `json:"decision_id,omitempty"`
	Revision   string         `json:"revision,omitempty"`
	Error      string         `json:"error,omitempty"`
}

func runAudit(ctx context.Context, s streams, o auditOptions) error {
	if err := o.output.complete(); err != nil {
		return err
	}
	switch {
	case validKubeletPort(o.port) != nil:
		return validKubeletPort(o.port)
	case o.timeout <= 0:
		return usage.Errorf("--timeout %s must be positive", o.timeout)
	}
	deniedNodes, err := netguard.Parse(o.deniedNodes)
	if err != nil {
		return usage.Errorf("--node-denied-networks: %v", err)
	}
	c, namespace, _, err := kube.Client(o.kube)
	if err != nil {
		return err
	}
	// The clusters are listed before the engine is made: the list's
	// discovery of the API watches no context, and a command interrupted
	// while it waits ends after interruptGrace without its deferred
	// stops, which would leave the engine's directory behind.
	clusters, err := auditClusters(ctx, c, namespace, o.cluster)
	if err != nil {
		return err
	}
	// The audit's decisions go to --decision-log, else nowhere: this is a
	// report to a person, not a decision the cluster acts on.
	opts := engine.Options{DecisionLog: io.Discard, DecisionLogFile: o.decisionLog, Log: s.err}
	if _, err := o.bundleKey.engineBundle(&opts, o.bundle); err != nil {
		return err
	}
	eng, err := engine.New(ctx, opts)
	if err != nil {
		return err
	}
	defer eng.Stop(context.WithoutCancel(ctx))
	lifetime, err := manager.ReaderLifetime(ctx, eng, 0)
	if err != nil {
		return err
	}
	claims := clustersecrets.ClaimsOf(o.requireSecretsClaim)
	auditor := &kubeletaudit.Auditor{
		Reader:        c,
		SecretsClaims: claims,
		NodeReaders:   &kubeletserving.NodeReaders{Reader: c, SecretsClaims: claims, Lifetime: lifetime, Timeout: o.timeout, Denied: deniedNodes},
		Engine:        eng,
		Port:          o.port,
		Timeout:       o.timeout,
		Denied:        deniedNodes,
	}
	var rows []auditRow
	for i := range clusters {
		cl := &clusters[i]
		machines, err := kubeletaudit.MachinesOf(ctx, c, cl)
		if err != nil {
			return err
		}
		results, err := auditor.Audit(ctx, cl, machines)
		if err != nil {
			return fmt.Errorf("audit cluster %s/%s: %w", cl.Namespace, cl.Name, err)
		}
		for _, r := range results {
			rows = append(rows, rowOf(cl, r))
		}
	}
	if err := printAudit(s.out, o.output, rows); err != nil {
		return err
	}
	return auditVerdict(rows)
}

func rowOf(cl *ichorv1alpha1.TalosCluster, r kubeletaudit.Result) auditRow {
	row := auditRow{
		Namespace: cl.Namespace, Cluster: cl.Name, Machine: r.Machine.Name, Node: r.Node,
		Address: r.Certificate.Address, Status: r.Decision.Status, Reasons: r.Decision.Reasons,
		DecisionID: r.Decision.DecisionID, Revision: r.Decision.Revision,
	}
	if r.Certificate.Read {
		row.Expires, row.Serial = r.Certificate.NotAfter, r.Certificate.Serial
	}
	if r.Err != nil {
		row.Status, row.Error = engine.ActionError, r.Err.Error()
	}
	if row.Reasons == nil {
		row.Reasons = engine.Reasons{}
	}
	return row
}

// printAudit prints the rows as -o asks; the table has one line a machine,
// then the reasons of every machine whose certificate is not current.
func printAudit(w io.Writer, output *printFlags, rows []auditRow) error {
	if !output.isHuman() {
		docs := make([]unstructured.Unstructured, 0, len(rows))
		for _, r := range rows {
			d, err := document("KubeletServingAudit", r.Namespace, r.Machine, r)
			if err != nil {
				return err
			}
			docs = append(docs, *d)
		}
		return output.print(w, documentList(docs))
	}
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "No machines to audit.")
		return err
	}
	t := newTable([]string{"Machine", "Node", "Status", "Expires", "Reason"}, "Address", "Decision")
	for _, r := range rows {
		reason := ""
		if codes := r.Reasons.Codes(); len(codes) > 0 {
			reason = codes[0]
			if len(codes) > 1 {
				reason += fmt.Sprintf(" (+%d)", len(codes)-1)
			}
		}
		addRow(t, r.Cluster+"/"+r.Machine, r.Node, r.Status, r.Expires, reason, r.Address, r.DecisionID)
	}
	if err := output.printTable(w, t); err != nil {
		return err
	}
	for _, r := range rows {
		switch {
		case r.Error != "":
			fmt.Fprintf(w, "\n%s/%s: no decision: %s\n", line(r.Cluster), line(r.Machine), line(r.Error))
		case r.Status != engine.AuditCurrent:
			fmt.Fprintf(w, "\n%s/%s (decision %s):\n", line(r.Cluster), line(r.Machine), line(r.DecisionID))
			for _, reason := range r.Reasons {
				fmt.Fprintf(w, "  %s: %s\n", line(reason.Code), line(reason.Message))
			}
		}
	}
	return nil
}

// auditVerdict is the exit status the rows ask for.
func auditVerdict(rows []auditRow) error {
	var drifted, unjudged int
	for _, r := range rows {
		switch r.Status {
		case engine.AuditCurrent:
		case engine.AuditDrifted:
			drifted++
		default:
			unjudged++
		}
	}
	switch {
	case drifted > 0:
		return exitError{code: ExitDrifted, err: fmt.Errorf("%d of %d kubelet serving certificates drifted", drifted, len(rows))}
	case unjudged > 0:
		return exitError{code: ExitUnjudged, err: fmt.Errorf("%d of %d kubelet serving certificates could not be judged", unjudged, len(rows))}
	}
	return nil
}

// auditClusters are the named cluster, or those of the namespace with
// kubelet serving certificates enabled.
func auditClusters(ctx context.Context, c client.Client, namespace, name string) ([]ichorv1alpha1.TalosCluster, error) {
	if name != "" {
		var cl ichorv1alpha1.TalosCluster
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cl); err != nil {
			return nil, fmt.Errorf("TalosCluster %s/%s: %w", namespace, name, err)
		}
		return []ichorv1alpha1.TalosCluster{cl}, nil
	}
	var list ichorv1alpha1.TalosClusterList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list TalosClusters in %s: %w", namespace, err)
	}
	var out []ichorv1alpha1.TalosCluster
	for _, cl := range list.Items {
		if cl.Spec.Security.KubeletServingCertificates.Enabled {
			out = append(out, cl)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no TalosCluster in namespace " + namespace + " has kubelet serving certificates enabled; name one with --cluster")
	}
	return out, nil
}
