package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/spf13/cobra"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/policydoc"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

func newPolicyCommand(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Evaluate the rules offline",
	}
	cmd.AddCommand(newCheckCSRCommand(s), newCheckClientCSRCommand(s), newPolicyDocCommand(s))
	return cmd
}

func newPolicyDocCommand(s streams) *cobra.Command {
	var policyDir string
	cmd := &cobra.Command{
		Use:   "doc [--policy DIR]",
		Short: "Print the policy reference (Markdown) from the rules' METADATA",
		Args:  cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			b, err := policyFrom(policyDir)
			if err != nil {
				return err
			}
			pkgs, err := policydoc.Collect(b)
			if err != nil {
				return err
			}
			if err := policydoc.CheckCodes(pkgs); err != nil {
				return err
			}
			_, err = io.WriteString(s.out, policydoc.Markdown(pkgs, b.Manifest.Revision))
			return err
		},
	}
	cmd.Flags().StringVar(&policyDir, "policy", "", "the policy directory (default: the policy embedded in this binary)")
	return cmd
}

type checkCSROptions struct {
	files          []string
	nodeIPs        []string
	nodename       string
	hostname       string
	machine        string
	machineUnknown bool
	nodeUnreadable bool
	bundle         string
	bundleKey      bundleKeyFlags
	output         *printFlags
	names          []string
	kube           genericclioptions.RESTClientGetter
}

// checkInput is said once for both check commands: what FILE may be, and
// what becomes of a list.
const checkInput = `NAME is a request in the cluster, read with your kubeconfig (kubectl's flags:
--kubeconfig, --context, --as, ...) as "kubectl get csr NAME" reads it;
several NAMEs are decided one row each. Or give the request as a file:
FILE is the manifest exactly as "kubectl get csr NAME -o yaml" (or -o json)
prints it; "-" reads it from standard input. -f reads every document of a
file (YAML documents separated by "---", or JSON objects one after another),
a directory (its .yaml, .yml and .json files and links to files, not its
subdirectories; one with none is refused, exit 2) and may be repeated. Every document must be a CertificateSigningRequest or a List of
them: any other kind is refused (exit 2), naming the document. A list ("kubectl
get csr -o yaml", several names, a label or field selector), several
documents, files or a directory are decided item by item, one row each; an
item the rule does not govern gets its "error" instead. At most 10000
requests, 1000 files of a directory and 32 MiB of each input are read.

The table has one row a request (-o wide adds the kind recognized and the
bundle revision), then every request's reasons as "CODE: message" lines.
-o json, yaml and jsonpath=TEMPLATE print a CSRDecision object
(cli.ichor.dev/v1alpha1) named by the request, with its action, reasons,
node, request_kind (what check-client-csr recognized), decision_id and
revision, or for several requests a List
(apiVersion v1) of them (-o 'jsonpath={.items[*].action}'); -o name prints
csrdecision.cli.ichor.dev/NAME.

A bare PEM CERTIFICATE REQUEST is refused, with the manifest to wrap it in:
the rule decides on what the API server records beside the PEM (the signer,
the usages, the requester's username and groups), and those are not in it.`

func newCheckCSRCommand(s streams) *cobra.Command {
	o := checkCSROptions{output: newTablePrintFlags(true)}
	cmd := &cobra.Command{
		Use:   "check-csr (NAME... | -f FILE) [--nodename NAME] [--hostname NAME] [--node-ip IP]... [--machine-unknown] [--node-unreadable] [--bundle PATH]",
		Short: "Decide a kubelet-serving CSR offline, as the controller would",
		Long: `Decide a kubelet-serving CertificateSigningRequest with the kubelet-serving rule,
offline, and print the decision: its action (approve, deny or pending), every
reason with its code and message, the decision id and the bundle revision.

` + checkInput + `

The node's identity is what the controller would read from the node's Talos
API: give it with --nodename, --hostname and --node-ip, or say that no managed
machine has the node name (--machine-unknown) or that the node could not be
read (--node-unreadable). --bundle decides with a candidate policy: a
directory, or a bundle tarball; a signed one is verified with --bundle-key
(and --bundle-key-id, --bundle-key-algorithm), as the managers verify it.
Every item of a list is decided with that one
identity: list one node's requests (a field selector on spec.signerName and a
label, or their names), or ask with --machine-unknown or --node-unreadable.

Exit status: 0 when every request was decided (whatever the decisions), 1 when
one or more could not be (a CSR of another signer, an unreadable bundle), 2 for
a wrong flag or a file that is not a CSR manifest.`,
		Example: `  ichor policy check-csr csr-8x2kq --nodename worker-1 --hostname worker-1 --node-ip 10.5.0.2
  kubectl get csr csr-8x2kq -o yaml | ichor policy check-csr -f - \
      --nodename worker-1 --hostname worker-1 --node-ip 10.5.0.2
  kubectl get csr --field-selector spec.signerName=kubernetes.io/kubelet-serving -o yaml |
      ichor policy check-csr -f - --node-unreadable`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.names = args
			return runCheckCSR(cmd.Context(), s, o)
		},
	}
	f := cmd.Flags()
	addFileFlag(f, &o.files)
	k := addClusterFlags(f)
	o.kube = k
	cmd.ValidArgsFunction = completeCSRs(k, false)
	f.StringArrayVar(&o.nodeIPs, "node-ip", nil, "an address of the node, as the Talos NodeIP resource \"kubelet\" lists it (repeatable)")
	f.StringVar(&o.nodename, "nodename", "", "the node's Nodename as Talos reports it")
	f.StringVar(&o.hostname, "hostname", "", "the node's hostname as Talos reports it")
	f.StringVar(&o.machine, "machine", "", "the name of the TalosMachine found for the node (default: the Nodename)")
	f.BoolVar(&o.machineUnknown, "machine-unknown", false, "no managed machine has the request's node name")
	f.BoolVar(&o.nodeUnreadable, "node-unreadable", false, "the node's identity could not be read from the Talos API")
	f.StringVar(&o.bundle, "bundle", "", "a policy directory or bundle tarball to decide with (default: the embedded bundle)")
	o.bundleKey.register(f)
	o.output.register(cmd)
	return cmd
}

func runCheckCSR(ctx context.Context, s streams, o checkCSROptions) error {
	identity, err := servingIdentity(o)
	if err != nil {
		return err
	}
	in, err := csrSource(ctx, s, o.kube, o.files, o.names, servingWrap)
	if err != nil {
		return err
	}
	return checkEach(ctx, s, o.output, o.bundleKey, o.bundle, in, func(ctx context.Context, eng *engine.Engine, csr *certificatesv1.CertificateSigningRequest) (csrCheck, error) {
		in := identity
		in.CSR = csrinput.Build(csr)
		d, err := eng.KubeletServing(ctx, in)
		if errors.Is(err, engine.ErrNoDecision) {
			return csrCheck{}, fmt.Errorf("%w: the kubelet-serving rule governs signer %s only, and this request is for %q",
				errNotDecided, certificatesv1.KubeletServingSignerName, csr.Spec.SignerName)
		}
		return csrCheck{CSRDecision: &d}, err
	})
}

// servingIdentity validates the identity flags and builds the rule's input
// from them, all but the request.
func servingIdentity(o checkCSROptions) (csrinput.KubeletServing, error) {
	var in csrinput.KubeletServing
	identityGiven := len(o.nodeIPs) > 0 || o.nodename != "" || o.hostname != "" || o.machine != ""
	switch {
	case o.machineUnknown && o.nodeUnreadable:
		return in, usage.Errorf("--machine-unknown and --node-unreadable contradict each other: a node is only read for a known machine")
	case o.machineUnknown && identityGiven:
		return in, usage.Errorf("--machine-unknown takes no node identity (--nodename, --hostname, --node-ip, --machine)")
	case o.nodeUnreadable && (len(o.nodeIPs) > 0 || o.nodename != "" || o.hostname != ""):
		return in, usage.Errorf("--node-unreadable takes no node identity (--nodename, --hostname, --node-ip)")
	case !o.machineUnknown && !o.nodeUnreadable && o.nodename == "":
		return in, usage.Errorf("give the node's identity as Talos reports it (--nodename, and --hostname and --node-ip as needed), or --machine-unknown or --node-unreadable")
	}
	if o.machineUnknown {
		return in, nil
	}
	machine := o.machine
	if machine == "" {
		machine = o.nodename
	}
	in.Machine = &csrinput.Machine{Name: machine}
	if o.nodeUnreadable {
		in.Node = &csrinput.Node{Readable: false, Error: "marked unreadable with --node-unreadable", Addresses: []string{}}
		return in, nil
	}
	in.Node = &csrinput.Node{Readable: true, Nodename: o.nodename, Hostname: o.hostname, Addresses: []string{}}
	for _, ip := range o.nodeIPs {
		addr, err := netip.ParseAddr(ip)
		if err != nil {
			return in, usage.Errorf("--node-ip %q is not an IP address", ip)
		}
		// The same canonical text the input builder writes for the request's IPs.
		in.Node.Addresses = append(in.Node.Addresses, addr.Unmap().String())
	}
	return in, nil
}

// errNotDecided marks a request the rule does not govern: the command goes
// on with a list's other items and exits 1.
var errNotDecided = errors.New("no decision")

// csrCheck is what a check command prints for one request: the decision, or
// for an item of a list that got none, the reason.
type csrCheck struct {
	// CSR is the request's name.
	CSR string
	*engine.CSRDecision
	Error string
	// AssumedAuthorization is what check-client-csr took the requester's
	// SubjectAccessReviews to answer.
	AssumedAuthorization *assumedAuthorization
}

// csrDecisionRecord is a check's decision as -o json, yaml and jsonpath see
// it: the decision's fields, but the kind of request recognized under
// request_kind, since kind is the document's.
type csrDecisionRecord struct {
	CSR                  string                `json:"csr"`
	Action               string                `json:"action,omitempty"`
	Reasons              engine.Reasons        `json:"reasons,omitempty"`
	Node                 string                `json:"node,omitempty"`
	RequestKind          string                `json:"request_kind,omitempty"`
	DecisionID           string                `json:"decision_id,omitempty"`
	Revision             string                `json:"revision,omitempty"`
	Error                string                `json:"error,omitempty"`
	AssumedAuthorization *assumedAuthorization `json:"assumed_authorization,omitempty"`
}

func (c csrCheck) record() csrDecisionRecord {
	r := csrDecisionRecord{CSR: c.CSR, Error: c.Error, AssumedAuthorization: c.AssumedAuthorization}
	if d := c.CSRDecision; d != nil {
		r.Action, r.Reasons, r.Node, r.RequestKind, r.DecisionID, r.Revision = d.Action, d.Reasons, d.Node, d.Kind, d.DecisionID, d.Revision
	}
	return r
}

// checkEach decides every request with the rule that decide asks, on an
// engine of the embedded bundle or bundlePath, and prints the decisions as
// -o asks. One request that the rule does not govern is an error; an item
// of a list that it does not govern gets its error, and the command fails
// after printing the others.
func checkEach(ctx context.Context, s streams, output *printFlags, key bundleKeyFlags, bundlePath string, in csrInputs,
	decide func(context.Context, *engine.Engine, *certificatesv1.CertificateSigningRequest) (csrCheck, error)) error {
	if err := output.complete(); err != nil {
		return err
	}
	// Offline, the decision log goes nowhere: this is a question, not a decision
	// the cluster acts on. OPA's own errors still reach stderr.
	opts := engine.Options{DecisionLog: io.Discard, Log: s.err}
	if _, err := key.engineBundle(&opts, bundlePath); err != nil {
		return err
	}
	eng, err := engine.New(ctx, opts)
	if err != nil {
		return err
	}
	defer eng.Stop(context.WithoutCancel(ctx))
	if in.list && len(in.csrs) == 0 {
		// As kubectl get with nothing found: a machine format prints an
		// empty List, so that a pipeline reads a document.
		fmt.Fprintln(s.err, "ichor: the list holds no request")
		if output.isHuman() {
			return nil
		}
		return output.print(s.out, documentList(nil))
	}
	var checks []csrCheck
	undecided := 0
	for _, csr := range in.csrs {
		c, err := decide(ctx, eng, csr)
		switch {
		case errors.Is(err, errNotDecided) && in.list:
			undecided++
			c = csrCheck{Error: err.Error()}
		case err != nil && in.list:
			err = fmt.Errorf("%s: %w", line(csr.Name), err)
			fallthrough
		case err != nil:
			// The decisions made are printed, whatever came after them.
			return errors.Join(printChecks(s.out, output, checks, in.list), err)
		}
		c.CSR = csr.Name
		checks = append(checks, c)
	}
	if err := printChecks(s.out, output, checks, in.list); err != nil {
		return err
	}
	if undecided > 0 {
		return fmt.Errorf("%w for %d of the %d requests: their rows say why", errNotDecided, undecided, len(in.csrs))
	}
	return nil
}

// printChecks prints the decisions: a table of them and their reasons, or
// a CSRDecision document for one request, a List of them for a list.
func printChecks(w io.Writer, output *printFlags, checks []csrCheck, list bool) error {
	if len(checks) == 0 {
		return nil
	}
	if !output.isHuman() {
		docs := make([]unstructured.Unstructured, 0, len(checks))
		for _, c := range checks {
			d, err := document("CSRDecision", "", c.CSR, c.record())
			if err != nil {
				return err
			}
			docs = append(docs, *d)
		}
		if !list {
			return output.print(w, &docs[0])
		}
		return output.print(w, documentList(docs))
	}
	t := newTable([]string{"CSR", "Action", "Node", "Codes", "Decision"}, "Kind", "Revision")
	for _, c := range checks {
		if c.CSRDecision == nil {
			addRow(t, c.CSR, engine.ActionError, "", "", "", "", "")
			continue
		}
		addRow(t, c.CSR, c.Action, c.Node, strings.Join(c.Reasons.Codes(), ","), c.DecisionID, c.Kind, c.Revision)
	}
	if err := output.printTable(w, t); err != nil {
		return err
	}
	for _, c := range checks {
		switch {
		case c.CSRDecision == nil:
			fmt.Fprintf(w, "\n%s: no decision: %s\n", line(c.CSR), line(c.Error))
		case len(c.Reasons) > 0:
			fmt.Fprintf(w, "\n%s (%s):\n", line(c.CSR), line(c.Action))
			for _, r := range c.Reasons {
				fmt.Fprintf(w, "  %s: %s\n", line(r.Code), line(r.Message))
			}
		}
	}
	return nil
}

var csrCodecs = func() serializer.CodecFactory {
	scheme := runtime.NewScheme()
	if err := certificatesv1.AddToScheme(scheme); err != nil {
		panic(err) // a static registration: it cannot fail at run time
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict)
}()

// pemWrap is how a rule's request is wrapped in the manifest the API server
// would make of it, for the error that refuses a bare PEM.
type pemWrap struct {
	signer, usages, username, groups string
}

var servingWrap = pemWrap{
	signer: certificatesv1.KubeletServingSignerName, usages: "[digital signature, server auth]",
	username: "system:node:NODE", groups: "[system:nodes, system:authenticated]",
}

// decodeCSR decodes one CertificateSigningRequest; what names it in errors.
// The items of a CertificateSigningRequestList, as the API server sends it,
// may leave out their apiVersion and kind.
func decodeCSR(data []byte, what string, typed bool) (*certificatesv1.CertificateSigningRequest, error) {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return nil, usage.Errorf("%s is neither YAML nor JSON: %v", what, err)
	}
	if typed && meta.APIVersion == "" && meta.Kind == "" {
		meta = metav1.TypeMeta{APIVersion: certificatesv1.SchemeGroupVersion.String(), Kind: "CertificateSigningRequest"}
	}
	switch {
	case meta.APIVersion == "" || meta.Kind == "":
		return nil, usage.Errorf("%s has no apiVersion and kind: it is not a Kubernetes manifest", what)
	case meta.APIVersion != certificatesv1.SchemeGroupVersion.String() || meta.Kind != "CertificateSigningRequest":
		return nil, usage.Errorf("%s is a %s (%s), not a %s CertificateSigningRequest", what, line(meta.Kind), line(meta.APIVersion), certificatesv1.SchemeGroupVersion)
	}
	gvk := certificatesv1.SchemeGroupVersion.WithKind("CertificateSigningRequest")
	obj, _, err := csrCodecs.UniversalDeserializer().Decode(data, &gvk, nil)
	if err != nil {
		return nil, usage.Errorf("%s is not a valid CertificateSigningRequest: %v", what, err)
	}
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	if !ok {
		return nil, usage.Errorf("%s decoded to %T, not a CertificateSigningRequest", what, obj)
	}
	return csr, nil
}

// pemError refuses a bare PEM block and, for a certificate request, shows the
// manifest that makes a question of it.
func pemError(file, blockType string, w pemWrap) error {
	if blockType != "CERTIFICATE REQUEST" && blockType != "NEW CERTIFICATE REQUEST" {
		return usage.Errorf("%s is a PEM %s, not a CertificateSigningRequest manifest", file, blockType)
	}
	src := file
	if file == "-" {
		src = "REQUEST.pem"
	}
	return usage.Errorf(`%s is a bare PEM CERTIFICATE REQUEST; the rule also decides on what the API server records beside it (the signer, the usages, the requester's username and groups), which are not in it.
Decide the object the API server holds (kubectl get csr NAME -o yaml), or wrap the PEM as the requester would send it, with the username and groups it would be authenticated as:

cat > csr.yaml <<EOF
apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata:
  name: check
spec:
  request: $(base64 -w0 < %s)
  signerName: %s
  usages: %s
  username: %s
  groups: %s
EOF`, file, src, w.signer, w.usages, w.username, w.groups)
}
