package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/spf13/cobra"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/bundles"
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
	cmd.AddCommand(newCheckCSRCommand(s), newPolicyDocCommand(s))
	return cmd
}

func newPolicyDocCommand(s streams) *cobra.Command {
	var policyDir string
	cmd := &cobra.Command{
		Use:   "doc [--policy DIR]",
		Short: "Print the policy reference (Markdown) from the rules' METADATA",
		Args:  cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			b, err := bundles.Default()
			if policyDir != "" {
				b, err = bundles.FromDir(policyDir)
			}
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
	file           string
	nodeIPs        []string
	nodename       string
	hostname       string
	machine        string
	machineUnknown bool
	nodeUnreadable bool
	bundle         string
}

func newCheckCSRCommand(s streams) *cobra.Command {
	var o checkCSROptions
	cmd := &cobra.Command{
		Use:   "check-csr -f FILE [--nodename NAME] [--hostname NAME] [--node-ip IP]... [--machine-unknown] [--node-unreadable] [--bundle PATH]",
		Short: "Decide a kubelet-serving CSR offline, as the controller would",
		Long: `Decide a kubelet-serving CertificateSigningRequest with the kubelet-serving rule,
offline, and print the decision: its action (approve, deny or pending), every
reason with its code and message, the decision id and the bundle revision.

FILE is the manifest exactly as "kubectl get csr NAME -o yaml" (or -o json) prints
it; "-" reads it from standard input. The node's identity is what the controller
would read from the node's Talos API: give it with --nodename, --hostname and
--node-ip, or say that no managed machine has the node name (--machine-unknown)
or that the node could not be read (--node-unreadable).

Exit status: 0 when a decision was made (whatever it is), 1 when none could be
(a CSR of another signer, an unreadable bundle), 2 for a wrong flag or a file
that is not a CSR manifest.`,
		Example: `  kubectl get csr csr-8x2kq -o yaml | ichor policy check-csr -f - \
      --nodename worker-1 --hostname worker-1 --node-ip 10.5.0.2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCheckCSR(cmd.Context(), s, o)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.file, "file", "f", "", `the CSR manifest (YAML or JSON); "-" for standard input`)
	f.StringArrayVar(&o.nodeIPs, "node-ip", nil, "an address of the node, as the Talos NodeIP resource \"kubelet\" lists it (repeatable)")
	f.StringVar(&o.nodename, "nodename", "", "the node's Nodename as Talos reports it")
	f.StringVar(&o.hostname, "hostname", "", "the node's hostname as Talos reports it")
	f.StringVar(&o.machine, "machine", "", "the name of the TalosMachine found for the node (default: the Nodename)")
	f.BoolVar(&o.machineUnknown, "machine-unknown", false, "no managed machine has the request's node name")
	f.BoolVar(&o.nodeUnreadable, "node-unreadable", false, "the node's identity could not be read from the Talos API")
	f.StringVar(&o.bundle, "bundle", "", "a policy directory or bundle tarball to decide with (default: the embedded bundle)")
	return cmd
}

func runCheckCSR(ctx context.Context, s streams, o checkCSROptions) error {
	in, err := checkCSRInput(s.in, o)
	if err != nil {
		return err
	}
	var b *bundle.Bundle
	if o.bundle != "" {
		if b, err = bundles.Load(o.bundle); err != nil {
			return err
		}
	}
	// Offline, the decision log goes nowhere: this is a question, not a decision
	// the cluster acts on. OPA's own errors still reach stderr.
	eng, err := engine.New(ctx, engine.Options{Bundle: b, DecisionLog: io.Discard, Log: s.err})
	if err != nil {
		return err
	}
	defer eng.Stop(context.WithoutCancel(ctx))
	d, err := eng.KubeletServing(ctx, in)
	if errors.Is(err, engine.ErrNoDecision) {
		return fmt.Errorf("no decision: the kubelet-serving rule governs signer %s only, and this request is for %q",
			certificatesv1.KubeletServingSignerName, in.CSR.SignerName)
	}
	if err != nil {
		return err
	}
	out := json.NewEncoder(s.out)
	out.SetIndent("", "  ")
	return out.Encode(d)
}

// checkCSRInput validates the flags and builds the rule's input from them.
func checkCSRInput(stdin io.Reader, o checkCSROptions) (csrinput.KubeletServing, error) {
	var in csrinput.KubeletServing
	identityGiven := len(o.nodeIPs) > 0 || o.nodename != "" || o.hostname != "" || o.machine != ""
	switch {
	case o.file == "":
		return in, usage.Errorf("-f FILE is required (\"-\" reads standard input)")
	case o.machineUnknown && o.nodeUnreadable:
		return in, usage.Errorf("--machine-unknown and --node-unreadable contradict each other: a node is only read for a known machine")
	case o.machineUnknown && identityGiven:
		return in, usage.Errorf("--machine-unknown takes no node identity (--nodename, --hostname, --node-ip, --machine)")
	case o.nodeUnreadable && (len(o.nodeIPs) > 0 || o.nodename != "" || o.hostname != ""):
		return in, usage.Errorf("--node-unreadable takes no node identity (--nodename, --hostname, --node-ip)")
	case !o.machineUnknown && !o.nodeUnreadable && o.nodename == "":
		return in, usage.Errorf("give the node's identity as Talos reports it (--nodename, and --hostname and --node-ip as needed), or --machine-unknown or --node-unreadable")
	}

	csr, err := readCSRManifest(stdin, o.file)
	if err != nil {
		return in, err
	}
	in.CSR = csrinput.Build(csr)
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

var csrCodecs = func() serializer.CodecFactory {
	scheme := runtime.NewScheme()
	if err := certificatesv1.AddToScheme(scheme); err != nil {
		panic(err) // a static registration: it cannot fail at run time
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict)
}()

// readCSRManifest reads one certificates.k8s.io/v1 CertificateSigningRequest
// manifest, YAML or JSON, from a file or from stdin ("-").
func readCSRManifest(stdin io.Reader, file string) (*certificatesv1.CertificateSigningRequest, error) {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return nil, usage.Errorf("%s is neither YAML nor JSON: %v", file, err)
	}
	switch {
	case meta.APIVersion == "" || meta.Kind == "":
		return nil, usage.Errorf("%s has no apiVersion and kind: it is not a Kubernetes manifest", file)
	case meta.Kind == "List" || meta.Kind == "CertificateSigningRequestList":
		return nil, usage.Errorf("%s is a list; give one request, as kubectl get csr NAME -o yaml prints it", file)
	case meta.APIVersion != certificatesv1.SchemeGroupVersion.String() || meta.Kind != "CertificateSigningRequest":
		return nil, usage.Errorf("%s is a %s (%s), not a %s CertificateSigningRequest", file, meta.Kind, meta.APIVersion, certificatesv1.SchemeGroupVersion)
	}
	obj, _, err := csrCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, usage.Errorf("%s is not a valid CertificateSigningRequest: %v", file, err)
	}
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	if !ok {
		return nil, usage.Errorf("%s decoded to %T, not a CertificateSigningRequest", file, obj)
	}
	return csr, nil
}
