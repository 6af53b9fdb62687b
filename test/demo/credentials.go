package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ichor-dev/ichor-policy/test/harness"
	"github.com/ichor-dev/ichor-policy/webhook/webhooktest"
)

// credentials has an operator (alice, ichor-operator) ask for a read-only
// talosconfig and a viewer (bob, ichor-viewer) try the same, with the
// shipped roles and the real CLI. It returns the operator's talosconfig path.
func credentials(ctx context.Context, env *harness.Env, opts Options, say func(string, ...any)) (string, error) {
	roles, err := webhooktest.ShippedRoles()
	if err != nil {
		return "", err
	}
	for i := range roles {
		if err := env.Client.Create(ctx, &roles[i]); err != nil {
			return "", fmt.Errorf("create shipped role %s: %w", roles[i].Name, err)
		}
	}
	users := map[string]string{"alice": "ichor-operator", "bob": "ichor-viewer"}
	kubeconfigs := map[string]string{}
	for user, role := range users {
		if err := env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "demo-" + user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user}},
		}); err != nil {
			return "", fmt.Errorf("bind %s to %s: %w", user, role, err)
		}
		cfg, err := env.UserConfig(user)
		if err != nil {
			return "", err
		}
		path := filepath.Join(opts.WorkDir, user+".kubeconfig")
		if err := writeKubeconfig(cfg, user, path); err != nil {
			return "", err
		}
		kubeconfigs[user] = path
	}

	out := filepath.Join(opts.WorkDir, "alice-reader.talosconfig")
	say("   $ ichor cluster talosconfig demo -n demo --ttl 1h --out %s   (as alice, ichor-operator)", out)
	stdout, stderr, err := run(ctx, opts.Ichor, "cluster", "talosconfig", "demo", "-n", "demo", "--ttl", "1h",
		"--out", out, "--kubeconfig", kubeconfigs["alice"])
	indent(say, stderr+stdout)
	if err != nil {
		return "", fmt.Errorf("ichor cluster talosconfig as alice: %w", err)
	}
	info, err := os.Stat(out)
	if err != nil {
		return "", fmt.Errorf("the talosconfig was not written: %w", err)
	}
	say("   wrote %s (mode %v)", out, info.Mode().Perm())

	var events corev1.EventList
	if err := env.Client.List(ctx, &events, client.InNamespace("demo")); err != nil {
		return "", fmt.Errorf("list Events: %w", err)
	}
	for _, e := range events.Items {
		if e.Reason == "TalosconfigReader" {
			say("   Event on TalosCluster demo: %s %s: %s", e.Type, e.Reason, e.Message)
		}
	}

	say("   $ ichor cluster talosconfig demo -n demo   (as bob, ichor-viewer)")
	stdout, stderr, err = run(ctx, opts.Ichor, "cluster", "talosconfig", "demo", "-n", "demo",
		"--out", filepath.Join(opts.WorkDir, "bob-reader.talosconfig"), "--kubeconfig", kubeconfigs["bob"])
	indent(say, stderr+stdout)
	if err == nil {
		return "", fmt.Errorf("the viewer was issued a talosconfig")
	}
	return out, nil
}

func run(ctx context.Context, bin string, args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// The CLI must not find a talosconfig of the person running the demo.
	cmd.Env = append(os.Environ(), "TALOSCONFIG="+filepath.Join(os.TempDir(), "ichor-demo-no-talosconfig"))
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

func indent(say func(string, ...any), text string) {
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		if line != "" {
			say("     %s", line)
		}
	}
}

// writeKubeconfig writes a client certificate configuration as a kubeconfig.
func writeKubeconfig(cfg *rest.Config, user, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["demo"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["demo"] = &clientcmdapi.Context{Cluster: "demo", AuthInfo: user, Namespace: "demo"}
	kc.CurrentContext = "demo"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig of %s: %w", user, err)
	}
	return nil
}
