package render_test

import (
	"fmt"
	"regexp"
	"testing"

	talosconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ichorv1alpha1 "github.com/ichor-dev/ichor-policy/api/v1alpha1"
	"github.com/ichor-dev/ichor-policy/internal/talos/render"
)

const (
	controlPlane = ichorv1alpha1.MachineRoleControlPlane
	worker       = ichorv1alpha1.MachineRoleWorker

	// caPath is spelled out rather than taken from the package so that a
	// change of machinery's constant shows up here (ADR 0125 names it).
	caPath = "/system/secrets/kubernetes/kube-apiserver/ca.crt"
)

var roles = []ichorv1alpha1.MachineRole{controlPlane, worker}

// contracts has one version per rendering family and the boundary on each side.
var contracts = []struct {
	version  string
	multidoc bool
}{
	{"v1.8", false},
	{"v1.13", false},
	{"v1.14", true},
	{"v1.15", true},
}

type options struct {
	enabled, verify bool
	// verified is the status of the KubeletServingVerified condition; ""
	// leaves it out.
	verified metav1.ConditionStatus
}

func newCluster(version string, opts options) *ichorv1alpha1.TalosCluster {
	cluster := &ichorv1alpha1.TalosCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "prod", Namespace: "ichor-system", Generation: 3},
		Spec: ichorv1alpha1.TalosClusterSpec{
			TalosVersion: version,
			SecretsRef:   ichorv1alpha1.SecretsBundleReference{Name: "prod-secrets"},
			Security: ichorv1alpha1.ClusterSecurity{
				KubeletServingCertificates: ichorv1alpha1.KubeletServingCertificates{
					Enabled:             opts.enabled,
					VerifyFromAPIServer: opts.verify,
				},
			},
		},
	}

	if opts.verified != "" {
		cluster.Status.Conditions = []metav1.Condition{{
			Type:               ichorv1alpha1.ConditionKubeletServingVerified,
			Status:             opts.verified,
			Reason:             ichorv1alpha1.ReasonVerificationLatched,
			ObservedGeneration: 3,
			LastTransitionTime: metav1.Now(),
		}}
	}

	return cluster
}

func TestKubeletServingUnsetRendersNothing(t *testing.T) {
	for _, c := range contracts {
		for _, opts := range []options{
			{},
			// verifyFromAPIServer and even a stale True condition mean
			// nothing without enabled.
			{verify: true},
			{verify: true, verified: metav1.ConditionTrue},
		} {
			t.Run(fmt.Sprintf("%s/%+v", c.version, opts), func(t *testing.T) {
				patch, err := render.KubeletServing(newCluster(c.version, opts))
				require.NoError(t, err)

				assert.True(t, patch.Empty())
				assert.Equal(t, c.version, patch.Contract().String())

				for _, role := range roles {
					assert.Empty(t, patch.Documents(role), role)
					assert.Empty(t, patch.Kinds(role), role)

					data, err := patch.Bytes(role)
					require.NoError(t, err)
					assert.Nil(t, data, role)
				}
			})
		}
	}
}

func TestKubeletServingKinds(t *testing.T) {
	for _, c := range contracts {
		kubelet := []string{"v1alpha1"}
		withAPIServer := []string{"v1alpha1"}

		if c.multidoc {
			kubelet = []string{"KubeletConfig"}
			withAPIServer = []string{"KubeAPIServerConfig", "KubeletConfig"}
		}

		for _, tc := range []struct {
			name         string
			opts         options
			controlPlane []string
		}{
			{"enabled", options{enabled: true}, kubelet},
			{"verify requested, not yet verified", options{enabled: true, verify: true}, kubelet},
			{"verify requested, verified False", options{enabled: true, verify: true, verified: metav1.ConditionFalse}, kubelet},
			{"verify requested and verified", options{enabled: true, verify: true, verified: metav1.ConditionTrue}, withAPIServer},
			// A condition left over after verifyFromAPIServer was switched
			// off must not keep the flag.
			{"verified but verify switched off", options{enabled: true, verified: metav1.ConditionTrue}, kubelet},
		} {
			t.Run(c.version+"/"+tc.name, func(t *testing.T) {
				patch, err := render.KubeletServing(newCluster(c.version, tc.opts))
				require.NoError(t, err)

				assert.False(t, patch.Empty())
				assert.Equal(t, tc.controlPlane, patch.Kinds(controlPlane))
				assert.Equal(t, kubelet, patch.Kinds(worker), "a worker never gets the kube-apiserver flag")
			})
		}
	}
}

// TestKubeletServingBytes pins the exact patch each family renders, as a
// reviewer would read it: only what it sets, none of the empty fields
// machinery's encoder writes (`image: ""`, `token: ""`, `cluster: null`).
// It decodes it back with machinery's strict loader (unknown fields and
// kinds are errors there).
func TestKubeletServingBytes(t *testing.T) {
	verified := options{enabled: true, verify: true, verified: metav1.ConditionTrue}

	for _, tc := range []struct {
		version string
		role    ichorv1alpha1.MachineRole
		want    string
	}{
		{"v1.14", controlPlane, `apiVersion: v1alpha1
kind: KubeletConfig
config:
    serverTLSBootstrap: true
---
apiVersion: v1alpha1
kind: KubeAPIServerConfig
extraArgs:
    kubelet-certificate-authority: ` + caPath + `
`},
		{"v1.14", worker, `apiVersion: v1alpha1
kind: KubeletConfig
config:
    serverTLSBootstrap: true
`},
		{"v1.13", controlPlane, `version: v1alpha1
machine:
    kubelet:
        extraConfig:
            serverTLSBootstrap: true
cluster:
    apiServer:
        extraArgs:
            kubelet-certificate-authority: ` + caPath + `
`},
		{"v1.13", worker, `version: v1alpha1
machine:
    kubelet:
        extraConfig:
            serverTLSBootstrap: true
`},
	} {
		t.Run(tc.version+"/"+string(tc.role), func(t *testing.T) {
			patch, err := render.KubeletServing(newCluster(tc.version, verified))
			require.NoError(t, err)

			data, err := patch.Bytes(tc.role)
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(data))

			decoded, err := configloader.NewFromBytes(data)
			require.NoError(t, err)

			kinds := make([]string, 0, len(decoded.Documents()))
			for _, doc := range decoded.Documents() {
				kinds = append(kinds, doc.Kind())
			}

			assert.ElementsMatch(t, patch.Kinds(tc.role), kinds)
			assert.Equal(t, map[string]any{"serverTLSBootstrap": true}, decoded.K8sKubeletConfig().ExtraConfig())

			if tc.role == controlPlane {
				assert.Equal(t, []string{caPath}, decoded.K8sAPIServerConfig().ExtraArgs()[render.KubeletCertificateAuthorityArg])
			}
		})
	}
}

// TestKubeletServingRendersNoEmptyField: for every contract, option and
// role, no line of the patch sets an empty value.
func TestKubeletServingRendersNoEmptyField(t *testing.T) {
	empty := regexp.MustCompile(`(?m):\s*(""|''|null|~|\[\]|\{\})\s*$`)

	for _, c := range contracts {
		for _, opts := range []options{{enabled: true}, {enabled: true, verify: true, verified: metav1.ConditionTrue}} {
			patch, err := render.KubeletServing(newCluster(c.version, opts))
			require.NoError(t, err)

			for _, role := range roles {
				data, err := patch.Bytes(role)
				require.NoError(t, err)

				assert.Empty(t, empty.FindAllString(string(data), -1), "%s/%s/%+v: empty fields in\n%s", c.version, role, opts, data)
			}
		}
	}
}

// TestKubeletServingAppliesToGeneratedConfig applies each patch to a machine
// configuration that machinery generates for the same contract and role, the
// way Talos applies a config patch, and validates the result as Talos would
// accept it: the patch merges where it should, changes nothing else (the
// images stay), and never gives a worker a document Talos refuses there.
func TestKubeletServingAppliesToGeneratedConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("generates Talos secrets bundles")
	}

	for _, version := range []string{"v1.13", "v1.14"} {
		contract, err := talosconfig.ParseContractFromVersion(version)
		require.NoError(t, err)

		input, err := generate.NewInput("prod", "https://10.0.0.1:6443", constants.DefaultKubernetesVersion,
			generate.WithVersionContract(contract))
		require.NoError(t, err)

		for _, opts := range []options{
			{enabled: true},
			{enabled: true, verify: true, verified: metav1.ConditionTrue},
		} {
			patch, err := render.KubeletServing(newCluster(version, opts))
			require.NoError(t, err)

			for _, role := range roles {
				t.Run(fmt.Sprintf("%s/%s/verified=%s", version, role, opts.verified), func(t *testing.T) {
					machineType := machine.TypeWorker
					if role == controlPlane {
						machineType = machine.TypeControlPlane
					}

					base, err := input.Config(machineType)
					require.NoError(t, err)

					data, err := patch.Bytes(role)
					require.NoError(t, err)

					loaded, err := configpatcher.LoadPatch(data)
					require.NoError(t, err)

					out, err := configpatcher.Apply(configpatcher.WithConfig(base), []configpatcher.Patch{loaded})
					require.NoError(t, err)

					patched, err := out.Config()
					require.NoError(t, err)

					_, err = patched.ValidateAsClient(metalMode{})
					require.NoError(t, err, "Talos would refuse the patched configuration")

					assert.Equal(t, machineType, patched.Machine().Type(), "the role is kept")
					assert.Equal(t, true, patched.K8sKubeletConfig().ExtraConfig()[render.KubeletServerTLSBootstrapField])
					assert.Equal(t, base.K8sKubeletConfig().Image(), patched.K8sKubeletConfig().Image(), "the kubelet image is kept")

					if role != controlPlane {
						return
					}

					args := patched.K8sAPIServerConfig().ExtraArgs()
					assert.Equal(t, base.K8sAPIServerConfig().Image(), patched.K8sAPIServerConfig().Image(), "the kube-apiserver image is kept")

					if opts.verified == metav1.ConditionTrue {
						assert.Equal(t, []string{caPath}, args[render.KubeletCertificateAuthorityArg])
					} else {
						assert.NotContains(t, args, render.KubeletCertificateAuthorityArg)
					}
				})
			}
		}
	}
}

func TestKubeletServingRefusesInvalidVersion(t *testing.T) {
	for _, version := range []string{"", "1.14", "v1.14.1", "v1", "latest", "v1.14-beta.0", "v0.14", "v0.0"} {
		for _, opts := range []options{{}, {enabled: true}} {
			_, err := render.KubeletServing(newCluster(version, opts))
			require.ErrorIs(t, err, render.ErrInvalidTalosVersion, "%q", version)
			assert.Contains(t, err.Error(), "ichor-system/prod", "the error names the cluster")
		}
	}

	_, err := render.KubeletServing(nil)
	require.Error(t, err)
}

func TestKubeletCertificateAuthorityPath(t *testing.T) {
	assert.Equal(t, caPath, render.KubeletCertificateAuthorityPath)
}

// metalMode is the runtime mode of an installed machine, for validation.
type metalMode struct{}

func (metalMode) String() string        { return "metal" }
func (metalMode) RequiresInstall() bool { return false }
func (metalMode) InContainer() bool     { return false }
