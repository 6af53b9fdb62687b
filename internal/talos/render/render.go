// Package render turns TalosCluster options into Talos machine-configuration
// patches, built from machinery's typed configuration documents so that a
// patch is checked by the Go compiler and by machinery's own encoder rather
// than assembled as YAML text.
//
// A patch depends on the cluster's Talos version contract: from v1.14 on, the
// Kubernetes components are configured by standalone documents
// (KubeletConfig, KubeAPIServerConfig), and a v1.14 configuration refuses the
// legacy v1alpha1 sections next to them; before v1.14 only the legacy
// sections exist. The switch is machinery's own
// VersionContract.MultidocKubernetesConfigSupported, the one Talos's config
// generation uses, so a patch always has the shape of the configuration it is
// applied to.
package render

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	yaml "go.yaml.in/yaml/v4"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
)

// ErrInvalidTalosVersion is wrapped by the error returned for a TalosCluster
// whose spec.talosVersion is not a version contract this package can render
// for.
var ErrInvalidTalosVersion = errors.New("invalid talosVersion")

// talosVersionRegexp is ichorv1alpha1.TalosVersionPattern. The API server
// enforces it on stored objects; it is checked again here because a cluster
// may come from a file (the CLI) and because machinery's parser is more
// lenient (it accepts "1.14" and "v1.14.3.x").
var talosVersionRegexp = regexp.MustCompile(ichorv1alpha1.TalosVersionPattern)

// Patch is a Talos machine-configuration patch (strategic merge, possibly
// multi-document) for one cluster, split by machine role: some documents are
// refused by Talos on a worker (KubeAPIServerConfig is control-plane only),
// so every node does not get the same bytes.
//
// The zero Patch is empty: it holds no document for any role.
type Patch struct {
	contract *talosconfig.VersionContract
	byRole   map[ichorv1alpha1.MachineRole]*container.Container
}

// Contract is the Talos version contract the patch was rendered for; nil for
// the zero Patch.
func (p Patch) Contract() *talosconfig.VersionContract {
	return p.contract
}

// Empty reports whether the patch holds no document for any role: the option
// it renders is unset, and nothing is to be applied anywhere.
func (p Patch) Empty() bool {
	return len(p.byRole) == 0
}

// Documents returns the documents the patch applies to a machine of role, in
// encoding order; none when the role gets nothing. The documents are shared
// with the patch and must not be modified.
func (p Patch) Documents(role ichorv1alpha1.MachineRole) []config.Document {
	ctr := p.byRole[role]
	if ctr == nil {
		return nil
	}

	return ctr.Documents()
}

// Kinds returns the kinds of Documents(role), sorted: "KubeletConfig",
// "KubeAPIServerConfig", and "v1alpha1" for the legacy machine configuration
// document (machinery names it by its version).
func (p Patch) Kinds(role ichorv1alpha1.MachineRole) []string {
	docs := p.Documents(role)

	kinds := make([]string, 0, len(docs))
	for _, doc := range docs {
		kinds = append(kinds, doc.Kind())
	}

	slices.Sort(kinds)

	return kinds
}

// Bytes encodes the patch for a machine of role as the YAML Talos accepts as
// a strategic merge patch (`talosctl patch mc --patch @file`, or a config
// patch in a machine's configuration): documents separated by "---", without
// the documentation comments, and with only the fields the patch sets. It
// returns nil and no error when the role gets nothing.
//
// machinery's encoder writes the fields its types declare without omitempty
// even when they are empty (`image: ""`, the legacy `machine.type`,
// `machine.token`, `machine.certSANs`, `cluster: null`). Talos's strategic
// merge never merges an empty value, so they would change nothing, but a
// person reviewing the patch reads `token: ""` as "clears the token" and
// `image: ""` as "unsets the image": they are left out, so the patch says
// exactly what it changes (the tests apply each patch to a generated
// configuration and check the images and the machine type are kept).
func (p Patch) Bytes(role ichorv1alpha1.MachineRole) ([]byte, error) {
	ctr := p.byRole[role]
	if ctr == nil {
		return nil, nil
	}

	data, err := ctr.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		return nil, fmt.Errorf("encoding the %s patch: %w", role, err)
	}

	data, err = withoutEmptyFields(data)
	if err != nil {
		return nil, fmt.Errorf("encoding the %s patch: %w", role, err)
	}

	return data, nil
}

// withoutEmptyFields re-encodes a stream of YAML documents without the
// mapping entries whose value is empty: null, "", [] or {}, once their own
// empty entries are gone. Sequence items are kept, since their position
// means something. The indentation is machinery's.
func withoutEmptyFields(data []byte) ([]byte, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))

	var out bytes.Buffer

	enc := yaml.NewEncoder(&out)
	enc.SetIndent(4)

	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading back the encoded patch: %w", err)
		}

		pruneEmpty(&doc)

		if err := enc.Encode(&doc); err != nil {
			return nil, fmt.Errorf("re-encoding the patch: %w", err)
		}
	}

	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("re-encoding the patch: %w", err)
	}

	return out.Bytes(), nil
}

// pruneEmpty removes the empty entries of every mapping under n.
func pruneEmpty(n *yaml.Node) {
	switch n.Kind { //nolint:exhaustive // scalars and aliases hold no entries
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, child := range n.Content {
			pruneEmpty(child)
		}
	case yaml.MappingNode:
		kept := n.Content[:0]

		for i := 0; i+1 < len(n.Content); i += 2 {
			key, value := n.Content[i], n.Content[i+1]
			pruneEmpty(value)

			if !isEmptyNode(value) {
				kept = append(kept, key, value)
			}
		}

		n.Content = kept
	}
}

func isEmptyNode(n *yaml.Node) bool {
	switch n.Kind { //nolint:exhaustive // a document or an alias is never empty here
	case yaml.ScalarNode:
		tag := n.ShortTag()

		return tag == "!!null" || (tag == "!!str" && n.Value == "")
	case yaml.MappingNode, yaml.SequenceNode:
		return len(n.Content) == 0
	}

	return false
}

// machineRoles are the roles a Patch is rendered for.
var machineRoles = []ichorv1alpha1.MachineRole{
	ichorv1alpha1.MachineRoleControlPlane,
	ichorv1alpha1.MachineRoleWorker,
}

// newPatch renders one container per role from docsFor, leaving out the roles
// that get no document so that Empty and Bytes say "nothing" for them.
func newPatch(contract *talosconfig.VersionContract, docsFor func(ichorv1alpha1.MachineRole) []config.Document) (Patch, error) {
	patch := Patch{contract: contract}

	for _, role := range machineRoles {
		docs := docsFor(role)
		if len(docs) == 0 {
			continue
		}

		ctr, err := container.New(docs...)
		if err != nil {
			return Patch{}, fmt.Errorf("assembling the %s patch: %w", role, err)
		}

		if patch.byRole == nil {
			patch.byRole = make(map[ichorv1alpha1.MachineRole]*container.Container, len(machineRoles))
		}

		patch.byRole[role] = ctr
	}

	return patch, nil
}

// parseContract returns the version contract of spec.talosVersion, refusing
// what the CRD refuses and what machinery would misread.
func parseContract(version string) (*talosconfig.VersionContract, error) {
	if !talosVersionRegexp.MatchString(version) {
		return nil, fmt.Errorf("%w %q: want vMAJOR.MINOR, for example \"v1.14\"", ErrInvalidTalosVersion, version)
	}

	contract, err := talosconfig.ParseContractFromVersion(version)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrInvalidTalosVersion, version, err)
	}

	// machinery reads a zero contract as "the current Talos version", which
	// would silently render the newest shape for "v0.0"; v0.x predates the
	// contracts machinery supports anyway.
	if contract.Major < 1 {
		return nil, fmt.Errorf("%w %q: Talos before v1.0 is not supported", ErrInvalidTalosVersion, version)
	}

	return contract, nil
}
