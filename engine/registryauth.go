package engine

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"

	"oras.land/oras-go/v2/registry/remote/credentials"
)

// Registry credentials, for an oci:// bundle in a registry that asks who
// pulls.
//
// OPA's OCI downloader builds its client from the service's credentials
// plugin, which is the engine's limits plugin, and gives ORAS's auth client
// no credential of its own. So the limits transport adds it: to the
// registry's host, and to the token services (realms) the registry names in
// its 401 answers, as docker does; never to another host. A blob is often
// served by a redirect to a storage service: net/http strips the
// registry's Authorization from that request, and a presigned URL would
// refuse a second one.

// maxRegistryCredentialsBytes bounds the credentials file: a Secret holds at
// most 1 MiB.
const maxRegistryCredentialsBytes = 1 << 20

// registryBasicAuth is the Authorization header of the credential for host
// in a Docker config file (what `docker login` writes, or the
// .dockerconfigjson of a kubernetes.io/dockerconfigjson Secret): a user
// name and a password or token, under "auths". Credential helpers
// (credsStore, credHelpers) are not run: the manager executes nothing a
// file names.
func registryBasicAuth(path, host string) (string, error) {
	info, err := os.Stat(path)
	switch {
	case err != nil:
		return "", fmt.Errorf("registry credentials: %w", err)
	case !info.Mode().IsRegular():
		return "", fmt.Errorf("registry credentials: %s is not a file", path)
	case info.Size() > maxRegistryCredentialsBytes:
		return "", fmt.Errorf("registry credentials: %s is %d bytes, more than the %d a Docker config file needs", path, info.Size(), maxRegistryCredentialsBytes)
	}
	store, err := credentials.NewFileStore(path)
	if err != nil {
		return "", fmt.Errorf("registry credentials: %s: %w", path, err)
	}
	cred, err := store.Get(context.Background(), host)
	switch {
	case err != nil:
		return "", fmt.Errorf("registry credentials: %s: %w", path, err)
	case cred.RefreshToken != "" || cred.AccessToken != "":
		return "", fmt.Errorf("registry credentials: %s holds an identity token for %s, which the manager does not exchange: log in with a user name and a password or access token", path, host)
	case cred.Username == "" || cred.Password == "":
		return "", fmt.Errorf("registry credentials: %s holds no user name and password for %s under \"auths\"", path, host)
	}
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(cred.Username+":"+cred.Password)), nil
}

// registryAuth adds a registry's credential to the requests of one pull.
type registryAuth struct {
	// host is the registry's host (and port).
	host string
	// header is the Authorization header of its credential.
	header string

	mu sync.Mutex
	// realms are the hosts of the token services the registry named.
	realms map[string]bool
}

// authorize is req with the credential, if req goes to the registry or a
// token service it named and carries no Authorization yet (ORAS's bearer
// token, once it has one, is left alone).
func (a *registryAuth) authorize(req *http.Request) *http.Request {
	if a == nil || req.Header.Get("Authorization") != "" || !a.trusted(req.URL.Host) {
		return req
	}
	out := req.Clone(req.Context())
	out.Header.Set("Authorization", a.header)
	return out
}

func (a *registryAuth) trusted(host string) bool {
	if host == a.host {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.realms[host]
}

// learn keeps the token service a 401 of the registry itself names.
func (a *registryAuth) learn(req *http.Request, resp *http.Response) {
	if a == nil || resp.StatusCode != http.StatusUnauthorized || req.URL.Host != a.host {
		return
	}
	for _, challenge := range resp.Header.Values("Www-Authenticate") {
		realm, ok := bearerRealm(challenge)
		if !ok {
			continue
		}
		u, err := url.Parse(realm)
		if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != req.URL.Scheme) {
			// Never a realm over plain http for a registry over https.
			continue
		}
		a.mu.Lock()
		if a.realms == nil {
			a.realms = map[string]bool{}
		}
		a.realms[u.Host] = true
		a.mu.Unlock()
	}
}

// bearerRealm is the realm of a Bearer challenge
// (Bearer realm="https://...",service="...",scope="...").
func bearerRealm(challenge string) (string, bool) {
	scheme, params, ok := strings.Cut(strings.TrimSpace(challenge), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	for param := range strings.SplitSeq(params, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(param), "=")
		if ok && strings.EqualFold(key, "realm") && len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
			return value[1 : len(value)-1], true
		}
	}
	return "", false
}
