package engine

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/ichor-dev/ichor-policy/bundles"
	"github.com/ichor-dev/ichor-policy/internal/smallfile"
)

// Registry credentials, for an oci:// bundle in a registry that asks who
// pulls.
//
// OPA's OCI downloader builds its client from the service's credentials
// plugin, which is the engine's limits plugin, and gives ORAS's auth client
// no credential of its own. So the limits transport adds it: to the
// registry's origin (scheme and host), and to the token services (realms)
// the registry names in its 401 answers, as docker does; never to another
// origin. A blob is often
// served by a redirect to a storage service: net/http strips the
// registry's Authorization from that request, and a presigned URL would
// refuse a second one.

// maxRegistryCredentialsBytes bounds the credentials file: a Secret holds at
// most 1 MiB.
const maxRegistryCredentialsBytes = 1 << 20

// dockerConfig is what the manager reads of a Docker config file: "auths"
// alone. It is read here rather than with oras-go's file store, whose
// errors quote a malformed entry's decoded value (a password), and which
// reads the file without a bound.
type dockerConfig struct {
	Auths map[string]dockerAuth `json:"auths"`
}

type dockerAuth struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// registryBasicAuth is the Authorization header of the credential for host
// in a Docker config file (what `docker login` writes, or the
// .dockerconfigjson of a kubernetes.io/dockerconfigjson Secret): a user
// name and a password or token, under "auths", keyed by the host as the
// bundle's reference names it (https:// and a path after it, as docker
// writes some, are allowed). Credential helpers (credsStore, credHelpers)
// are not run: the manager executes nothing a file names. No error quotes
// a value of the file.
func registryBasicAuth(path, host string) (string, error) {
	data, err := readCredentialFile(path, maxRegistryCredentialsBytes, "registry credentials")
	if err != nil {
		return "", err
	}
	var config dockerConfig
	if json.Unmarshal(data, &config) != nil {
		return "", fmt.Errorf("registry credentials: %s is not a Docker config file (a JSON object with \"auths\")", path)
	}
	entry, found := config.Auths[host]
	if !found {
		// Another spelling of the host (a URL of it, another case, a
		// default port, Docker Hub's names): one entry, or several that
		// agree, never one picked at random from several.
		want := hostKey(host)
		for key, a := range config.Auths {
			if hostKey(authsHost(key)) != want {
				continue
			}
			if found && a != entry {
				return "", fmt.Errorf("registry credentials: %s holds several different entries for %s under \"auths\": keep one", path, host)
			}
			entry, found = a, true
		}
	}
	user, password := entry.Username, entry.Password
	if entry.Auth != "" {
		decoded, err := base64.StdEncoding.DecodeString(entry.Auth)
		var ok bool
		if user, password, ok = strings.Cut(string(decoded), ":"); err != nil || !ok {
			return "", fmt.Errorf("registry credentials: %s: the \"auth\" of %s is not the base64 of user:password", path, host)
		}
	}
	switch {
	case !found:
		return "", fmt.Errorf("registry credentials: %s holds no entry for %s under \"auths\"", path, host)
	case entry.IdentityToken != "" || entry.RegistryToken != "":
		return "", fmt.Errorf("registry credentials: %s holds an identity or registry token for %s, which the manager does not use: log in with a user name and a password or access token", path, host)
	case user == "" || password == "":
		return "", fmt.Errorf("registry credentials: %s holds no user name and password for %s", path, host)
	}
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password)), nil
}

// authsHost is the host of a key of "auths": docker writes a host, or a URL
// (https://index.docker.io/v1/).
func authsHost(key string) string {
	key = strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	host, _, _ := strings.Cut(key, "/")
	return host
}

// hostKey is a registry host as the credential is looked up by: lower case,
// without the default https port, and Docker Hub's names as one (docker
// login writes https://index.docker.io/v1/; its registry is
// registry-1.docker.io).
func hostKey(host string) string {
	host = strings.TrimSuffix(strings.ToLower(host), ":443")
	switch host {
	case "docker.io", "index.docker.io", "registry-1.docker.io":
		return "docker.io"
	}
	return host
}

// registryAuth adds a registry's credential to the requests of one pull.
type registryAuth struct {
	// registry is the registry's origin: scheme and host (and port).
	registry url.URL
	// header is the Authorization header of its credential.
	header string

	mu sync.Mutex
	// realms are the origins of the token services the registry named.
	realms map[url.URL]bool
}

// newRegistryAuth is the credential of header for the registry at the
// service URL service.
func newRegistryAuth(service *url.URL, header string) *registryAuth {
	return &registryAuth{registry: origin(service), header: header}
}

// origin is a URL's scheme and host, without the scheme's default port: the
// credential is sent to an origin, never over another scheme to the same
// host (a redirect to plain http).
func origin(u *url.URL) url.URL {
	scheme, host := strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	if port := u.Port(); (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
		host = strings.TrimSuffix(host, ":"+port)
	}
	return url.URL{Scheme: scheme, Host: host}
}

// authorize is req with the credential, if req goes to the registry or a
// token service it named and carries no Authorization yet (ORAS's bearer
// token, once it has one, is left alone).
func (a *registryAuth) authorize(req *http.Request) *http.Request {
	if a == nil || req.Header.Get("Authorization") != "" || !a.trusted(origin(req.URL)) {
		return req
	}
	out := req.Clone(req.Context())
	out.Header.Set("Authorization", a.header)
	return out
}

func (a *registryAuth) trusted(o url.URL) bool {
	if o == a.registry {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.realms[o]
}

// learn keeps the token service a 401 of the registry itself names: over
// https, or the registry's own scheme (a plain-http registry on this host's
// loopback, the only one given the credential, may name a plain-http token
// service on the loopback too).
func (a *registryAuth) learn(req *http.Request, resp *http.Response) {
	if a == nil || resp.StatusCode != http.StatusUnauthorized || origin(req.URL) != a.registry {
		return
	}
	for _, challenge := range resp.Header.Values("Www-Authenticate") {
		realm, ok := bearerRealm(challenge)
		if !ok {
			continue
		}
		u, err := url.Parse(realm)
		if err != nil || u.Host == "" {
			continue
		}
		o := origin(u)
		// A plain-http token service only for a plain-http registry, and
		// only on this host's loopback, as the credential is taken for
		// such a registry at all: sent elsewhere, it would cross the
		// network in clear.
		if o.Scheme != "https" && (o.Scheme != a.registry.Scheme || !bundles.OnLoopback(o.Host)) {
			continue
		}
		a.mu.Lock()
		if a.realms == nil {
			a.realms = map[url.URL]bool{}
		}
		a.realms[o] = true
		a.mu.Unlock()
	}
}

// bearerRealm is the realm of a Bearer challenge
// (Bearer realm="https://...",service="...",scope="..."), its quoted
// strings read as RFC 9110 writes them (a comma or an escaped quote
// inside), as ORAS reads them.
func bearerRealm(challenge string) (string, bool) {
	scheme, params, ok := strings.Cut(strings.TrimSpace(challenge), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	for params != "" {
		var key, value string
		key, params, ok = strings.Cut(strings.TrimLeft(params, " ,"), "=")
		if !ok {
			return "", false
		}
		if value, params, ok = paramValue(params); !ok {
			return "", false
		}
		if strings.EqualFold(strings.TrimSpace(key), "realm") {
			return value, true
		}
	}
	return "", false
}

// paramValue reads a parameter's value at the start of s, a token or a
// quoted string, and returns it unquoted and what follows it.
func paramValue(s string) (value, rest string, ok bool) {
	s = strings.TrimLeft(s, " ")
	if !strings.HasPrefix(s, `"`) {
		value, rest, _ = strings.Cut(s, ",")
		return strings.TrimSpace(value), rest, true
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i++; i == len(s) {
				return "", "", false
			}
			b.WriteByte(s[i])
		case '"':
			return b.String(), s[i+1:], true
		default:
			b.WriteByte(s[i])
		}
	}
	return "", "", false
}

// readCredentialFile reads a file of the operator's naming a credential
// (what says what it is, for errors): a regular file, opened without
// waiting and read to at most limit bytes (smallfile). No error quotes its
// content.
func readCredentialFile(path string, limit int, what string) ([]byte, error) {
	data, err := smallfile.Read(path, int64(limit))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return data, nil
}
