package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/ichor-dev/ichor-policy/controllers/kubeletclient"
	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/facts/csrinput"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

type checkClientOptions struct {
	files      []string
	authorized []string
	machine    string
	bundle     string
	bundleKey  bundleKeyFlags
	output     *printFlags
	names      []string
	kube       genericclioptions.RESTClientGetter
}

// assumedAuthorization is what the requester's two SubjectAccessReviews were
// taken to answer, printed beside the decision: offline nothing is asked.
type assumedAuthorization struct {
	SelfNodeClient bool `json:"selfnodeclient"`
	NodeClient     bool `json:"nodeclient"`
	// Given is false when --authorized was not: both were taken as not
	// allowed.
	Given bool `json:"given"`
}

var clientWrap = pemWrap{
	signer: certificatesv1.KubeAPIServerClientKubeletSignerName, usages: "[digital signature, client auth]",
	username: "system:node:NODE", groups: "[system:nodes, system:authenticated]",
}

func newCheckClientCSRCommand(s streams) *cobra.Command {
	o := checkClientOptions{output: newTablePrintFlags(true)}
	cmd := &cobra.Command{
		Use:   "check-client-csr (NAME... | -f FILE) [--authorized selfnodeclient,nodeclient|none] [--machine NAME] [--bundle PATH]",
		Short: "Decide a kubelet client CSR offline, as the kubelet client approver would",
		Long: `Decide a kube-apiserver-client-kubelet CertificateSigningRequest with the
kubelet-client rule, offline, and print the decision: approve or pending (the
rule never denies), every reason, the kind the request is recognized as
(selfnodeclient or nodeclient), the decision id and the bundle revision.

` + checkInput + `

The approver asks two SubjectAccessReviews as the requester: may they create
certificatesigningrequests/selfnodeclient, and .../nodeclient. Offline nothing
is asked, so their answers are an assumption: --authorized names the
subresources the requester may create (selfnodeclient, nodeclient, or none).
Without it both are taken as not allowed, so a request the rule recognizes
stays pending with SelfNodeClientNotAuthorized or NodeClientNotAuthorized, whose
message says that nothing was asked. The output's "assumed_authorization" says
what was assumed; find the real answer with, for example,
  kubectl auth can-i create certificatesigningrequests/selfnodeclient \
      --as system:node:worker-1 --as-group system:nodes

--machine names the managed machine that has the request's node name; the rule
looks at it only when its data requires a managed machine
(require_managed_machine), and without it no machine is assumed.

Exit status: 0 when every request was decided (whatever the decisions), 1 when
one or more could not be (a CSR of another signer, an unreadable bundle), 2 for
a wrong flag or a file that is not a CSR manifest.`,
		Example: `  kubectl get csr csr-7xk2p -o yaml | ichor policy check-client-csr -f - --authorized selfnodeclient
  kubectl get csr --field-selector spec.signerName=kubernetes.io/kube-apiserver-client-kubelet -o yaml |
      ichor policy check-client-csr -f - --authorized nodeclient`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.names = args
			return runCheckClientCSR(cmd.Context(), s, o, cmd.Flags().Changed("authorized"))
		},
	}
	f := cmd.Flags()
	addFileFlag(f, &o.files)
	k := addClusterFlags(f)
	o.kube = k
	cmd.ValidArgsFunction = completeCSRs(k, false)
	f.StringSliceVar(&o.authorized, "authorized", nil, "the subresources of certificatesigningrequests the requester is taken to be allowed to create: selfnodeclient, nodeclient (comma-separated or repeated), or none; default: none, and the output says nothing was asked")
	f.StringVar(&o.machine, "machine", "", "the name of the TalosMachine that has the request's node name (default: none)")
	f.StringVar(&o.bundle, "bundle", "", "a policy directory or bundle tarball to decide with (default: the embedded bundle)")
	o.bundleKey.register(f)
	o.output.register(cmd)
	return cmd
}

func runCheckClientCSR(ctx context.Context, s streams, o checkClientOptions, authorizedGiven bool) error {
	assumed, err := parseAuthorized(o.authorized, authorizedGiven)
	if err != nil {
		return err
	}
	var machine *csrinput.Machine
	if o.machine != "" {
		machine = &csrinput.Machine{Name: o.machine}
	}
	csrs, err := csrSource(ctx, s, o.kube, o.files, o.names, clientWrap)
	if err != nil {
		return err
	}
	return checkEach(ctx, s, o.output, o.bundleKey, o.bundle, csrs, func(ctx context.Context, eng *engine.Engine, csr *certificatesv1.CertificateSigningRequest) (csrCheck, error) {
		in := csrinput.KubeletClient{CSR: csrinput.Build(csr), Authorization: assumed.facts(), Machine: machine}
		d, err := eng.KubeletClient(ctx, in)
		if errors.Is(err, engine.ErrNoDecision) {
			return csrCheck{}, fmt.Errorf("%w: the kubelet-client rule governs signer %s only, and this request is for %q",
				errNotDecided, certificatesv1.KubeAPIServerClientKubeletSignerName, csr.Spec.SignerName)
		}
		return csrCheck{CSRDecision: &d, AssumedAuthorization: &assumed}, err
	})
}

// parseAuthorized reads --authorized.
func parseAuthorized(values []string, given bool) (assumedAuthorization, error) {
	a := assumedAuthorization{Given: given}
	if given && len(values) == 0 {
		return a, usage.Errorf("--authorized takes selfnodeclient, nodeclient or none")
	}
	for _, v := range values {
		switch v {
		case kubeletclient.SubresourceSelfNodeClient:
			a.SelfNodeClient = true
		case kubeletclient.SubresourceNodeClient:
			a.NodeClient = true
		case "none":
			if len(values) > 1 {
				return a, usage.Errorf("--authorized none takes no other value, and %v has others", values)
			}
		default:
			return a, usage.Errorf("--authorized %q: give selfnodeclient, nodeclient or none", v)
		}
	}
	return a, nil
}

// facts are the two reviews as the rule's input, each with the assumption in
// its reason, which the rule quotes when it does not allow.
func (a assumedAuthorization) facts() csrinput.KubeletAuthorization {
	review := func(subresource string, allowed bool) csrinput.AccessReview {
		reason := "assumed allowed with --authorized: check-client-csr asks no SubjectAccessReview"
		switch {
		case !a.Given:
			reason = "not asked: check-client-csr asks no SubjectAccessReview, and --authorized was not given"
		case !allowed:
			reason = "assumed not allowed: --authorized does not name " + subresource + ", and check-client-csr asks no SubjectAccessReview"
		}
		return kubeletclient.ReviewFact(kubeletclient.ReviewAttributes(subresource),
			authorizationv1.SubjectAccessReviewStatus{Allowed: allowed, Reason: reason})
	}
	return csrinput.KubeletAuthorization{
		SelfNodeClient: review(kubeletclient.SubresourceSelfNodeClient, a.SelfNodeClient),
		NodeClient:     review(kubeletclient.SubresourceNodeClient, a.NodeClient),
	}
}
