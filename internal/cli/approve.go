package cli

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// The reasons a person's decision carries by default: recognisably a
// person's through ichor, apart from the controllers' IchorKubeletServing and
// IchorKubeletClient.
const (
	ManualApprovalReason = "IchorManualApproval"
	ManualDenialReason   = "IchorManualDenial"
)

// manualFieldManager names the writer in the request's managedFields.
const manualFieldManager = "ichor-manual-decision"

// ichorSigners are the signers whose requests Ichor's approvers decide; a
// request of another signer is not Ichor's to leave pending.
var ichorSigners = []string{certificatesv1.KubeletServingSignerName, certificatesv1.KubeAPIServerClientKubeletSignerName}

// reasonPattern is what a condition's reason may be: CamelCase, as the API's
// own reasons are, so that it reads as a code and not as a message.
var reasonPattern = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,63}$`)

// maxManualMessage bounds the message written on the condition.
const maxManualMessage = 1024

type manualDecision struct {
	approve         bool
	reason, message string
	kube            genericclioptions.RESTClientGetter
}

// ownReason is the verb's default reason, the one Ichor reason a person's
// decision may carry.
func (o manualDecision) ownReason() string {
	if o.approve {
		return ManualApprovalReason
	}
	return ManualDenialReason
}

func newManualDecisionCommand(s streams, approve bool) *cobra.Command {
	verb, reason, condition := "deny", ManualDenialReason, "Denied"
	if approve {
		verb, reason, condition = "approve", ManualApprovalReason, "Approved"
	}
	o := manualDecision{approve: approve}
	cmd := &cobra.Command{
		Use:   verb + " CSR... --message TEXT [--reason CODE]",
		Short: strings.ToUpper(verb[:1]) + verb[1:] + " a CSR that Ichor left pending, as a person's manual decision",
		Long: `Write a person's decision on certificate signing requests that Ichor left pending:
the ` + condition + ` condition, with --reason (default ` + reason + `) and
--message, written through the API server's approval subresource with your own
kubeconfig and rights (kubectl's flags: --context, --as, ...), as kubectl
certificate ` + verb + ` does. You need update on
certificatesigningrequests/approval and approve on the request's signer
(signers, resourceName kubernetes.io/kubelet-serving or
kubernetes.io/kube-apiserver-client-kubelet); the manager's rights are not used.

Only an undecided request of a signer Ichor's approvers decide is written:
Ichor never leaves such a request undecided except as pending (an unknown
machine, an unreadable node, a flood guard), or not yet judged: check with
"ichor policy check-csr NAME" and "ichor decisions list" what Ichor said or would
say before you overrule it. A request already approved or denied, or of another
signer, is refused, and nothing is written. A --reason that begins with Ichor
(the approvers' own, or the other verb's default) is refused, so a person's
decision never reads as theirs, and --message is one line of plain text. The
condition's message names you as the API server authenticated you, the API
server's audit log records the write as yours, and the manager's webhook
records it in the decision log as yours ("ichor decisions list --policy
manual") and as an Event on the request.

Exit status: 0 when every request was written; 1 when one could not be (it is
decided already, another signer's, not there, or you may not); 2 for a wrong
flag.`,
		Example: `  ichor ` + verb + ` csr-8x2kq --message "worker-4's IP moved; checked with talosctl get nodeips"`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runManualDecision(cmd.Context(), s, o, args)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.reason, "reason", reason, "the condition's reason: a CamelCase code")
	f.StringVar(&o.message, "message", "", "why you decide so (required): written on the condition")
	k := kube.NewConfigFlags()
	k.Namespace = nil // a CSR is cluster-scoped
	k.AddFlags(f)
	o.kube = k
	cmd.ValidArgsFunction = completeCSRs(k, true)
	return cmd
}

func runManualDecision(ctx context.Context, s streams, o manualDecision, names []string) error {
	switch {
	case !reasonPattern.MatchString(o.reason):
		return usage.Errorf("--reason %q: give a CamelCase code (a letter, then letters and digits, at most 64)", o.reason)
	case strings.HasPrefix(o.reason, "Ichor") && o.reason != o.ownReason():
		// IchorKubeletServing and IchorKubeletClient say the approvers
		// decided, and the other verb's default says the opposite verdict;
		// a person's decision must read as neither.
		return usage.Errorf("--reason %q: reasons that begin with Ichor are the approvers' own or the other verb's; give yours (or leave the default, %s)", o.reason, o.ownReason())
	case strings.TrimSpace(o.message) == "":
		return usage.Errorf("--message is required: say why, for whoever reads the request after you")
	case len(o.message) > maxManualMessage:
		return usage.Errorf("--message is %d bytes; at most %d", len(o.message), maxManualMessage)
	case termsafe.EscapeLine(o.message) != o.message:
		// The message is read by everyone who describes the request: a
		// control character or a line of its own would act on their
		// terminal or read as another line (review 29 L1).
		return usage.Errorf("--message %.100q: write one line of plain text, without control, format or line-breaking characters", o.message)
	}
	cfg, err := o.kube.ToRESTConfig()
	if err != nil {
		return kube.ConfigError(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	// Who the API server takes us for, to name in the message.
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("ask the API server who you are: %w", err)
	}
	user := review.Status.UserInfo.Username
	var failed []string
	for _, name := range names {
		if err := o.decide(ctx, cs, name, user); err != nil {
			fmt.Fprintf(s.err, "ichor: %s\n", termsafe.ErrorText(err))
			failed = append(failed, name)
			continue
		}
		past := "denied"
		if o.approve {
			past = "approved"
		}
		fmt.Fprintf(s.out, "certificatesigningrequest/%s %s by %s\n", line(name), past, line(user))
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d requests not written: %s", len(failed), len(names), strings.Join(failed, ", "))
	}
	return nil
}

// errNotPending refuses a request that is not Ichor's pending one.
var errNotPending = errors.New("not a request Ichor left pending")

func (o manualDecision) decide(ctx context.Context, cs kubernetes.Interface, name, user string) error {
	csrs := cs.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get certificatesigningrequest %s: %w", name, err)
	}
	if !slices.Contains(ichorSigners, csr.Spec.SignerName) {
		return fmt.Errorf("%s: %w: its signer %q is not one Ichor decides (%s)", name, errNotPending, csr.Spec.SignerName, strings.Join(ichorSigners, ", "))
	}
	for _, c := range csr.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) {
			return fmt.Errorf("%s: %w: it is %s already (%s)", name, errNotPending, c.Type, line(c.Reason))
		}
	}
	kind := certificatesv1.CertificateDenied
	if o.approve {
		kind = certificatesv1.CertificateApproved
	}
	now := metav1.Now()
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: kind, Status: corev1.ConditionTrue, Reason: o.reason,
		// The name is the authenticator's (an OIDC claim, a certificate's
		// CN): kept to its line as the message is (review 30 L4).
		Message:        fmt.Sprintf("by %s, by hand with ichor: %s", termsafe.EscapeLine(user), o.message),
		LastUpdateTime: now, LastTransitionTime: now,
	})
	// The resourceVersion read above makes a decision the manager wrote
	// since a conflict, not a second verdict.
	if _, err := csrs.UpdateApproval(ctx, name, csr, metav1.UpdateOptions{FieldManager: manualFieldManager}); err != nil {
		return fmt.Errorf("write the decision on certificatesigningrequest %s: %w", name, err)
	}
	return nil
}
