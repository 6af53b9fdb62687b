package cli_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientauthv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ichor-dev/ichor-policy/internal/cli"
	"github.com/ichor-dev/ichor-policy/internal/credclient"
	"github.com/ichor-dev/ichor-policy/internal/execcache"
	"github.com/ichor-dev/ichor-policy/test/harness"
)

// managementKubeconfig writes a person's kubeconfig for a server that is
// never reached (writing an exec kubeconfig sends nothing), with a token
// that must never be copied into it.
func managementKubeconfig(t *testing.T, dir string, exec *clientcmdapi.ExecConfig) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["mgmt"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1", CertificateAuthorityData: []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")}
	kc.AuthInfos["ada"] = &clientcmdapi.AuthInfo{Token: "s3cret-t0ken", Exec: exec}
	if exec != nil {
		kc.AuthInfos["ada"].Token = ""
	}
	kc.Contexts["mgmt"] = &clientcmdapi.Context{Cluster: "mgmt", AuthInfo: "ada", Namespace: "team-a"}
	kc.Contexts["other"] = &clientcmdapi.Context{Cluster: "mgmt", AuthInfo: "ada", Namespace: "team-b"}
	kc.CurrentContext = "mgmt"
	path := filepath.Join(dir, "config")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

func runAs(t *testing.T, argv0 string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.RunAs(t.Context(), argv0, args, strings.NewReader(""), &out, &errOut)
	t.Logf("$ %s %s\n%s%s(exit %d)", argv0, strings.Join(args, " "), out.String(), errOut.String(), code)
	return code, out.String(), errOut.String()
}

// readExecKubeconfig checks what an exec kubeconfig may hold: mode 0600, one
// user, whose only field is the exec plugin of client.authentication.k8s.io/v1
// with interactiveMode Never; no key, certificate or token anywhere.
func readExecKubeconfig(t *testing.T, path string) (*clientcmdapi.Config, *clientcmdapi.ExecConfig) {
	t.Helper()
	assert.Equal(t, os.FileMode(0o600), mode(t, path))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, secret := range []string{"client-key", "client-certificate", "token", "PRIVATE KEY", "s3cret-t0ken"} {
		assert.NotContains(t, string(raw), secret)
	}
	kc, err := clientcmd.Load(raw)
	require.NoError(t, err)
	require.Len(t, kc.AuthInfos, 1)
	for _, user := range kc.AuthInfos {
		require.NotNil(t, user.Exec)
		assert.Equal(t, clientcmdapi.AuthInfo{Exec: user.Exec, Extensions: user.Extensions}, *user)
		assert.Equal(t, "client.authentication.k8s.io/v1", user.Exec.APIVersion)
		assert.Equal(t, clientcmdapi.NeverExecInteractiveMode, user.Exec.InteractiveMode)
		assert.False(t, user.Exec.ProvideClusterInfo)
		return kc, user.Exec
	}
	return nil, nil
}

// TestExecKubeconfigCommandLine: the plugin's command is the binary as it
// was run (a name stays a name for the PATH, a path is made absolute, the
// path kubectl ran a plugin with is kept) or --exec-command; its arguments
// pin the kubeconfig, its context and the namespace, carry impersonation,
// and never a credential.
func TestExecKubeconfigCommandLine(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := managementKubeconfig(t, dir, nil)
	wd, err := os.Getwd()
	require.NoError(t, err)
	for _, tc := range []struct {
		argv0, flag, command string
	}{
		{"ichor", "", "ichor"},
		{"/home/ada/.krew/bin/kubectl-ichor", "", "/home/ada/.krew/bin/kubectl-ichor"},
		{"bin/ichor", "", filepath.Join(wd, "bin/ichor")},
		{"ichor", "/opt/ichor/ichor", "/opt/ichor/ichor"},
	} {
		out := filepath.Join(dir, strings.ReplaceAll(tc.argv0+tc.flag, "/", "_")+".kubeconfig")
		args := []string{"cluster", "kubeconfig", "demo", "--exec", "--kubeconfig", kubeconfig, "--out", out,
			"--as", "ichor:ada", "--as-group", "ichor:admins", "--as-group", "system:authenticated"}
		if tc.flag != "" {
			args = append(args, "--exec-command", tc.flag)
		}
		code, stdout, stderr := runAs(t, tc.argv0, args...)
		require.Equal(t, cli.ExitOK, code, stderr)
		assert.Contains(t, stdout, "it holds no credential.\nkubectl runs "+tc.command+" cluster exec-credential demo --namespace=team-a")
		kc, execCfg := readExecKubeconfig(t, out)
		assert.Equal(t, tc.command, execCfg.Command, tc.argv0)
		assert.Equal(t, []string{
			"cluster", "exec-credential", "demo", "--namespace=team-a", "--kubeconfig=" + kubeconfig, "--context=mgmt", "--ttl=1h0m0s",
			"--as=ichor:ada", "--as-group=ichor:admins", "--as-group=system:authenticated",
		}, execCfg.Args)
		assert.Empty(t, execCfg.Env)
		assert.Equal(t, "https://127.0.0.1:1", kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster].Server)
	}

	// Another context, -n, a lifetime and a proxy; several kubeconfig
	// files are passed in KUBECONFIG, every one absolute.
	second := filepath.Join(dir, "second")
	require.NoError(t, os.WriteFile(second, []byte("apiVersion: v1\nkind: Config\n"), 0o600))
	t.Chdir(dir)
	t.Setenv("KUBECONFIG", "config"+string(os.PathListSeparator)+second)
	out := filepath.Join(dir, "env.kubeconfig")
	code, _, stderr := runAs(t, "ichor", "cluster", "kubeconfig", "demo", "--exec", "--context", "other", "-n", "team-c", "--ttl", "20m", "--out", out,
		"--proxy-url", "http://proxy.example:3128")
	require.Equal(t, cli.ExitOK, code, stderr)
	_, execCfg := readExecKubeconfig(t, out)
	assert.Equal(t, []string{"cluster", "exec-credential", "demo", "--namespace=team-c", "--context=other", "--ttl=20m0s", "--proxy-url=http://proxy.example:3128"}, execCfg.Args)
	assert.Equal(t, []clientcmdapi.ExecEnvVar{{Name: "KUBECONFIG", Value: kubeconfig + string(os.PathListSeparator) + second}}, execCfg.Env)
}

// TestExecKubeconfigRefuses: what --exec does not write, before anything is
// sent.
func TestExecKubeconfigRefuses(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := managementKubeconfig(t, dir, nil)
	nested := managementKubeconfig(t, t.TempDir(), &clientcmdapi.ExecConfig{
		APIVersion: "client.authentication.k8s.io/v1", Command: "ichor",
		Args: []string{"cluster", "exec-credential", "demo"}, InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	})
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"a token on the command line", []string{"--kubeconfig", kubeconfig, "--token", "s3cret-t0ken"}, cli.ExitUsage, "--token would be written into the kubeconfig in clear"},
		{"a proxy's password", []string{"--kubeconfig", kubeconfig, "--proxy-url", "http://me:s3cret@proxy.example:3128"}, cli.ExitUsage, "--proxy-url names a user"},
		{"a server's password", []string{"--kubeconfig", kubeconfig, "--server", "https://me:s3cret@api.example:6443"}, cli.ExitUsage, "--server names a user"},
		{"break-glass", []string{"--kubeconfig", kubeconfig, "--break-glass"}, cli.ExitUsage, "--exec does not apply to --break-glass"},
		{"a lifetime above the cap", []string{"--kubeconfig", kubeconfig, "--ttl", "8761h"}, cli.ExitUsage, `LifetimeTooLong: the lifetime 8761h0m0s is above the cap of 8760h0m0s for purpose "kubeconfig-admin"`},
		{"a management context that runs the plugin", []string{"--kubeconfig", nested}, cli.ExitUsage, `runs "ichor" exec-credential itself`},
		{"the kubeconfig in use", []string{"--kubeconfig", kubeconfig, "--out", kubeconfig, "--force"}, cli.ExitUsage, "it is the file you use now"},
		// Carried to every run of the plugin, it would fail each at once
		// (review 186).
		{"no time to ask", []string{"--kubeconfig", kubeconfig, "--timeout", "0s"}, cli.ExitUsage, "--timeout 0s: give a duration above 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "refused")
			args := append([]string{"cluster", "kubeconfig", "demo", "--exec", "--out", out}, tc.args...)
			code, _, stderr := runAs(t, "ichor", args...)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, stderr, tc.want)
			assert.NoFileExists(t, out)
		})
	}

	// The plugin refuses to run under such a context too.
	code, stdout, stderr := runAs(t, "ichor", "cluster", "exec-credential", "demo", "--kubeconfig", nested)
	assert.Equal(t, cli.ExitUsage, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "exec-credential itself")

	// Nor does any credential command take a timeout that ends it before
	// it starts.
	for _, args := range [][]string{
		{"cluster", "exec-credential", "demo", "--kubeconfig", kubeconfig, "--timeout", "-1s"},
		{"cluster", "kubeconfig", "demo", "--kubeconfig", kubeconfig, "--out", filepath.Join(dir, "refused"), "--timeout", "0s"},
		{"cluster", "talosconfig", "demo", "--kubeconfig", kubeconfig, "--out", filepath.Join(dir, "refused"), "--timeout", "0s"},
	} {
		code, stdout, stderr := runAs(t, "ichor", args...)
		assert.Equal(t, cli.ExitUsage, code, args[1])
		assert.Empty(t, stdout, args[1])
		assert.Contains(t, stderr, "give a duration above 0", args[1])
		assert.NoFileExists(t, filepath.Join(dir, "refused"))
	}
}

// TestExecCredentialMarksWhatItStarts: a management kubeconfig whose own
// credential plugin runs ichor's through a wrapper (a shell here) is not
// known by its arguments, and each run would start the next, one every
// --timeout (review 253 F2). The processes a run starts carry a mark, and a
// run that finds it refuses before asking anything.
func TestExecCredentialMarksWhatItStarts(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv(credclient.ExecRunningEnv, "")
	dir := t.TempDir()
	seen := filepath.Join(dir, "seen")
	kubeconfig := managementKubeconfig(t, dir, &clientcmdapi.ExecConfig{
		APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/sh",
		Args:            []string{"-c", `printf %s "$` + credclient.ExecRunningEnv + `" > "$0"; exit 1`, seen},
		InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	})
	// No CA to parse, so that the client is made and asks its plugin
	// (nothing listens at the server).
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	require.NoError(t, err)
	kc.Clusters["mgmt"].CertificateAuthorityData = nil
	kc.Clusters["mgmt"].InsecureSkipTLSVerify = true
	require.NoError(t, clientcmd.WriteToFile(*kc, kubeconfig))
	code, stdout, _ := runAs(t, "ichor", "cluster", "exec-credential", "demo", "--kubeconfig", kubeconfig, "--timeout", "20s")
	assert.NotEqual(t, cli.ExitOK, code)
	assert.Empty(t, stdout)
	got, err := os.ReadFile(seen)
	require.NoError(t, err, "the management kubeconfig's plugin was not run")
	assert.Equal(t, "1", string(got), "what the run started was not marked")

	// A run started by that plugin carries the mark.
	assert.Empty(t, os.Getenv(credclient.ExecRunningEnv), "the mark outlived the run")
	require.NoError(t, os.Remove(seen))
	t.Setenv(credclient.ExecRunningEnv, "1")
	code, stdout, stderr := runAs(t, "ichor", "cluster", "exec-credential", "demo", "--kubeconfig", kubeconfig, "--timeout", "20s")
	assert.Equal(t, cli.ExitUsage, code)
	assert.Empty(t, stdout)
	assert.Contains(t, stderr, "run by another exec-credential")
	assert.NoFileExists(t, seen, "the nested run asked")
}

// TestExecCredentialReadsExecInfo: the plugin reads KUBERNETES_EXEC_INFO with
// client-go's types and refuses another version or kind, printing nothing.
func TestExecCredentialReadsExecInfo(t *testing.T) {
	kubeconfig := managementKubeconfig(t, t.TempDir(), nil)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	for info, want := range map[string]string{
		`{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","spec":{"interactive":false}}`: "not an ExecCredential of client.authentication.k8s.io/v1",
		`{"apiVersion":"client.authentication.k8s.io/v1","kind":"Other"}`:                                            "not an ExecCredential of client.authentication.k8s.io/v1",
		`{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":"x"}}`:        "not an ExecCredential of client.authentication.k8s.io/v1",
		"\x1b[2J": `not an ExecCredential`,
	} {
		t.Setenv("KUBERNETES_EXEC_INFO", info)
		code, stdout, stderr := runAs(t, "ichor", "cluster", "exec-credential", "demo", "--kubeconfig", kubeconfig)
		assert.Equal(t, cli.ExitUsage, code, info)
		assert.Empty(t, stdout, info)
		assert.Contains(t, stderr, want, info)
		assert.NotContains(t, stderr, "\x1b", "escaped")
	}
}

// execHelperKubeconfig and execHelperResult name, in the environment of this test binary run again as
// a client-go program, the kubeconfig it uses and the file it answers in.
const (
	execHelperKubeconfig = "ICHOR_TEST_EXEC_KUBECONFIG"
	execHelperResult     = "ICHOR_TEST_EXEC_RESULT"
)

// execClientResult is what the client-go program saw.
type execClientResult struct {
	Username        string   `json:"username"`
	Groups          []string `json:"groups"`
	ReviewError     string   `json:"reviewError"`
	NamespacesError string   `json:"namespacesError"`
}

// TestExecCredentialClientHelper is not a test: testExecCredentialPlugin runs
// the test binary again with it, as a fresh client-go program (kubectl, k9s
// and controllers are such programs), so that each call runs the plugin in a
// new process, with no credential in memory: client-go keeps one per process.
func TestExecCredentialClientHelper(t *testing.T) {
	kubeconfig := os.Getenv(execHelperKubeconfig)
	if kubeconfig == "" {
		t.Skip("run by TestClusterCommands/ExecCredentialPlugin")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	cfg.Timeout = time.Minute
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	var r execClientResult
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		r.ReviewError = err.Error()
	} else {
		r.Username, r.Groups = review.Status.UserInfo.Username, review.Status.UserInfo.Groups
		if _, err := cs.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{}); err != nil {
			r.NamespacesError = err.Error()
		}
	}
	data, err := json.Marshal(r)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(os.Getenv(execHelperResult), data, 0o600))
}

// execClient runs a fresh client-go program with the exec kubeconfig; its
// standard error is the plugin's.
func (ce *clusterEnv) execClient(t *testing.T, kubeconfig string) (execClientResult, string) {
	t.Helper()
	result := filepath.Join(t.TempDir(), "result.json")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestExecCredentialClientHelper$", "-test.count=1") //nolint:gosec // this test binary, run again
	cmd.Env = append(os.Environ(), execHelperKubeconfig+"="+kubeconfig, execHelperResult+"="+result)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "client-go program: %s\n%s", out, stderr.String())
	data, err := os.ReadFile(result)
	require.NoError(t, err)
	var r execClientResult
	require.NoError(t, json.Unmarshal(data, &r))
	t.Logf("client-go program: %+v; stderr: %s", r, stderr.String())
	return r, stderr.String()
}

// admissions counts the admin credential requests made so far: the webhook
// writes one Event (named after the request) for each it admits, before the
// request exists, so the count is exact once a command has returned;
// requests themselves are deleted once answered.
func (ce *clusterEnv) admissions(t *testing.T) int {
	t.Helper()
	return len(ce.events(t, "KubeconfigAdmin"))
}

// cacheFile is the one credential file of the cache.
func cacheFile(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	require.NoError(t, err)
	require.Len(t, files, 1, "one context, one file")
	return files[0]
}

// cachedEntry reads a cache file as the test sees it: exactly the key and
// the ExecCredential.
type cachedEntry struct {
	Key        string                      `json:"key"`
	Credential clientauthv1.ExecCredential `json:"credential"`
}

func readCache(t *testing.T, path string) (cachedEntry, *x509.Certificate) {
	t.Helper()
	assert.Equal(t, os.FileMode(0o600), mode(t, path))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var e cachedEntry
	require.NoError(t, dec.Decode(&e))
	s := e.Credential.Status
	require.NotNil(t, s)
	assert.Empty(t, s.Token)
	require.NotNil(t, s.ExpirationTimestamp)
	pair, err := tls.X509KeyPair([]byte(s.ClientCertificateData), []byte(s.ClientKeyData))
	require.NoError(t, err, "the cached key is the certificate's")
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	require.NoError(t, err)
	return e, leaf
}

func writeCache(t *testing.T, path string, e cachedEntry) {
	t.Helper()
	data, err := json.Marshal(e)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

// testExecCredentialPlugin: a kubeconfig written with --exec, used by fresh
// client-go programs against the real API server, with the real webhook and
// issuer. The first call asks for one credential; a second within its
// lifetime asks for none; an expired one asks for one; a cache that is a
// link, another server's, garbage or readable by others is never used and is
// replaced with one request; and once the person is revoked (ichor cluster
// admins revoke) and loses the grant, the cached credential is refused by
// the API server and the plugin, asked again, fails with the reason code and
// prints nothing.
func (ce *clusterEnv) testExecCredentialPlugin(t *testing.T) {
	ctx := t.Context()
	ichor, err := harness.BuildIchor(t.TempDir())
	require.NoError(t, err)
	cacheHome := filepath.Join(ce.dir, "cache-home")
	t.Setenv("XDG_CACHE_HOME", cacheHome)
	cacheDir := filepath.Join(cacheHome, "ichor", "exec-credential")

	// Writing the kubeconfig asks for nothing.
	before := ce.admissions(t)
	kubeconfig := filepath.Join(ce.dir, "ada.exec.kubeconfig")
	code, stdout, stderr := ce.ichor(t, "cluster", "kubeconfig", "demo", "--exec", "--exec-command", ichor, "--kubeconfig", ce.kubeconfig["ada"], "--out", kubeconfig)
	require.Equal(t, cli.ExitOK, code, stderr)
	assert.Contains(t, stdout, "cached in "+cacheDir)
	_, execCfg := readExecKubeconfig(t, kubeconfig)
	assert.Equal(t, ichor, execCfg.Command)
	assert.Equal(t, []string{"cluster", "exec-credential", "demo", "--namespace=team-a", "--kubeconfig=" + ce.kubeconfig["ada"], "--context=ada", "--ttl=1h0m0s"}, execCfg.Args)
	assert.Equal(t, before, ce.admissions(t), "writing an exec kubeconfig sent a request")
	assert.NoDirExists(t, cacheDir)

	// The first call asks for exactly one credential, of an hour, for Ada
	// (revoked by Rita before: the manager binds her anew). Her new binding
	// may take a moment to reach the API server's authorizer; the calls
	// that wait for it use the cached credential.
	asked := time.Now()
	r, _ := ce.execClient(t, kubeconfig)
	require.Empty(t, r.ReviewError)
	assert.Equal(t, before+1, ce.admissions(t))
	require.NoError(t, wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		if r.NamespacesError == "" {
			return true, nil
		}
		r, _ = ce.execClient(t, kubeconfig)
		return r.NamespacesError == "", nil
	}), "the admin credential is cluster-admin: %s", r.NamespacesError)
	assert.Equal(t, before+1, ce.admissions(t))
	assert.Equal(t, os.FileMode(0o700), mode(t, cacheDir))
	path := cacheFile(t, cacheDir)
	first, leaf := readCache(t, path)
	assert.Equal(t, leaf.Subject.CommonName, r.Username, "the API server authenticated the cached certificate")
	assert.Equal(t, "ichor-admin:u:ichor:ada", r.Username)
	assert.True(t, slices.ContainsFunc(r.Groups, func(g string) bool { return strings.HasPrefix(g, "ichor-admin:u:ichor:ada:") }), "no group of Ada's own: %v", r.Groups)
	assert.Equal(t, time.Hour, leaf.NotAfter.Sub(leaf.NotBefore))
	// kubectl is told to ask again when the cache would: the lifetime
	// counted on this machine's clock from the request, which was sent
	// after asked, so never after the certificate's own renewal.
	expires := first.Credential.Status.ExpirationTimestamp.Time
	assert.False(t, expires.After(execcache.RenewWithin(leaf.NotBefore, leaf.NotAfter)), "kubectl asks again after the certificate's renewal: %s", expires)
	earliest := execcache.RenewWithin(asked, asked.Add(time.Hour))
	assert.False(t, expires.Before(earliest.Truncate(time.Second)), "kubectl asks again before the lifetime asked for is near its end: %s", expires)
	// The cache holds the credential and nothing of the person's own
	// kubeconfig.
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	adaCfg, err := clientcmd.LoadFromFile(ce.kubeconfig["ada"])
	require.NoError(t, err)
	assert.NotContains(t, string(data), strings.TrimSpace(string(adaCfg.AuthInfos["ada"].ClientKeyData)))
	assert.NotContains(t, string(data), ce.kubeconfig["ada"])

	// A second call, in a new process, within the lifetime: none.
	r, _ = ce.execClient(t, kubeconfig)
	require.Empty(t, r.ReviewError)
	assert.Equal(t, before+1, ce.admissions(t), "a cached credential was asked for again")
	again, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, data, again)

	// Expired (its expiry rewritten into the past): exactly one.
	first.Credential.Status.ExpirationTimestamp = &metav1.Time{Time: time.Now().Add(-time.Minute)}
	writeCache(t, path, first)
	r, _ = ce.execClient(t, kubeconfig)
	require.Empty(t, r.ReviewError)
	assert.Equal(t, before+2, ce.admissions(t))
	renewed, renewedLeaf := readCache(t, path)
	assert.NotEqual(t, leaf.SerialNumber, renewedLeaf.SerialNumber)
	assert.True(t, renewed.Credential.Status.ExpirationTimestamp.After(time.Now()))

	ce.testExecCacheHostile(t, kubeconfig, path, before+2)

	// Revocation of a person who leaves: Rita revokes Ada's binding, and
	// Ada loses her grant (she may still ask, as anyone with create on
	// requests may). The cached credential still authenticates and may do
	// nothing; asked again, the plugin fails with the reason code and
	// kubectl with it.
	code, _, stderr = ce.ichor(t, "cluster", "admins", "revoke", "ichor:ada", "--kubeconfig", ce.kubeconfig["rita"])
	require.Equal(t, cli.ExitOK, code, stderr)
	grant := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: "ada-ichor-admin"}}
	require.NoError(t, ce.env.Client.Get(ctx, client.ObjectKeyFromObject(grant), grant))
	require.NoError(t, ce.env.Client.Delete(ctx, grant))
	askOnly := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: "ada-ask-only"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "ask-for-credentials"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "ichor:ada"}},
	}
	require.NoError(t, ce.env.Client.Create(ctx, askOnly))
	// The subtests after this one know Ada as an admin. Deferred, not a
	// cleanup: the test's context, which waitAllowed polls with, is
	// cancelled before cleanups run.
	defer func() {
		_ = ce.env.Client.Delete(ctx, askOnly)
		require.NoError(t, ce.env.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: grant.Namespace, Name: grant.Name},
			RoleRef:    grant.RoleRef,
			Subjects:   grant.Subjects,
		}))
		waitAllowed(t, ce.env, "ichor:ada", authorizationv1.ResourceAttributes{Namespace: teamNS, Group: "ichor.dev", Resource: "talosclusters", Subresource: "kubeconfig-admin", Name: "demo", Verb: "download"})
	}()
	waitAllowed(t, ce.env, "ichor:ada", authorizationv1.ResourceAttributes{Namespace: teamNS, Group: "ichor.dev", Resource: "taloscredentialrequests", Verb: "create"})
	require.NoError(t, wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		r, _ := ce.execClient(t, kubeconfig)
		return strings.Contains(r.NamespacesError, "forbidden"), nil
	}), "the cached admin credential still works without its binding")
	expire(t, path)
	r, stderr = ce.execClient(t, kubeconfig)
	assert.Empty(t, r.Username)
	assert.Contains(t, r.ReviewError, "exit code 1")
	assert.Contains(t, stderr, "NotAuthorized")

	// Run as kubectl runs it: nothing on standard output, the reason on
	// standard error, a status that is not zero. Within RefusalHold of the
	// refusal above, the refusal is held: said again, with when it is
	// asked again, and nothing asked (review 253 F4).
	cmd := exec.CommandContext(ctx, execCfg.Command, execCfg.Args...)
	cmd.Env = append(os.Environ(), `KUBERNETES_EXEC_INFO={"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":false}}`)
	var pluginOut, pluginErr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &pluginOut, &pluginErr
	err = cmd.Run()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr)
	assert.Equal(t, cli.ExitError, exitErr.ExitCode())
	assert.Empty(t, pluginOut.String())
	assert.Contains(t, pluginErr.String(), "no admin credential for cluster demo")
	assert.Contains(t, pluginErr.String(), `NotAuthorized: user "ichor:ada" may not download talosclusters/kubeconfig-admin "demo"`)
	assert.Contains(t, pluginErr.String(), "and held: asked again from")
	t.Logf("the plugin, refused:\n%s", pluginErr.String())
}

// expire rewrites the cached credential's expiry into the past.
func expire(t *testing.T, path string) {
	t.Helper()
	e, _ := readCache(t, path)
	e.Credential.Status.ExpirationTimestamp = &metav1.Time{Time: time.Now().Add(-time.Minute)}
	writeCache(t, path, e)
}

// testExecCacheHostile: a cache file the plugin must not trust costs one
// request and is replaced by the person's own file, 0600; nothing is
// written through a link.
func (ce *clusterEnv) testExecCacheHostile(t *testing.T, kubeconfig, path string, count int) {
	valid, err := os.ReadFile(path)
	require.NoError(t, err)
	var other cachedEntry
	require.NoError(t, json.Unmarshal(valid, &other))
	other.Key = execcache.Key{Server: "https://other.example:6443", Namespace: teamNS, Cluster: "demo", Purpose: "kubeconfig-admin"}.ID()
	target := filepath.Join(ce.dir, "not-the-cache")
	for name, setup := range map[string]func(){
		"a link to another file": func() {
			require.NoError(t, os.WriteFile(target, valid, 0o600))
			require.NoError(t, os.Remove(path))
			require.NoError(t, os.Symlink(target, path))
		},
		"another server's key": func() { writeCache(t, path, other) },
		"garbage":              func() { require.NoError(t, os.WriteFile(path, []byte("{\x1b]0;owned\x07"), 0o600)) },
		"readable by others":   func() { require.NoError(t, os.Chmod(path, 0o644)) },
	} {
		setup()
		r, stderr := ce.execClient(t, kubeconfig)
		require.Empty(t, r.ReviewError, name)
		count++
		assert.Equal(t, count, ce.admissions(t), name)
		assert.Contains(t, stderr, "ignoring the cached credential", name)
		assert.NotContains(t, stderr, "\x1b", "%s: the warning is escaped", name)
		info, err := os.Lstat(path)
		require.NoError(t, err)
		assert.True(t, info.Mode().IsRegular(), name)
		readCache(t, path)
	}
	kept, err := os.ReadFile(target)
	require.NoError(t, err)
	assert.Equal(t, valid, kept, "the link's target was written")
}
