package engine

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/url"
	"strings"
	"time"

	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"

	"github.com/ichor-dev/ichor-policy/bundles"
)

func isURL(s string) bool {
	return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")
}

// ociResource is the OPA service (the registry) and resource (the reference)
// of an oci:// source. Its rules are a URL's: a bundle from a registry must
// be signed, and plain HTTP is the operator's explicit choice.
func ociResource(opts Options) (resource, service string, err error) {
	ref, err := bundles.ParseOCIRef(opts.Source)
	if err != nil {
		return "", "", err
	}
	if len(opts.VerificationKeys) == 0 {
		return "", "", fmt.Errorf("bundle source %s is a registry: give the key its bundles are signed with (--bundle-key)", ref)
	}
	if ref.PlainHTTP && !opts.AllowInsecureHTTP {
		return "", "", fmt.Errorf("bundle source %s is plain http: anyone on the path could serve an older signed bundle or none; use %s, or allow it explicitly (--bundle-allow-insecure-http)", ref, bundles.OCIScheme)
	}
	if opts.RegistryCredentials != "" && ref.PlainHTTP && !bundles.OnLoopback(ref.Registry) {
		// Sent with every request, a password over plain http is anyone's
		// on the path; to a registry on the manager's own loopback it
		// never leaves the host.
		return "", "", fmt.Errorf("bundle source %s is plain http: a registry credential (--bundle-registry-credentials) is sent only over https, or to a registry on this host's loopback", ref)
	}
	if opts.RegistryCredentials != "" {
		// Read now, so that a credential that cannot be used fails the
		// start with its reason; each pull reads it again.
		if _, err := registryBasicAuth(opts.RegistryCredentials, ref.Registry); err != nil {
			return "", "", err
		}
	}
	// OPA's downloader reads the repository and the tag or digest from the
	// resource, and the host from the service URL.
	return ref.Reference.String(), ref.ServiceURL(), nil
}

// splitURL makes an OPA service (scheme and host) and a bundle resource (the
// path and query) of a bundle URL.
func splitURL(raw string) (service, resource string, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", "", fmt.Errorf("bundle source %q is not a URL", bundles.RedactedSource(raw))
	}
	if u.User != nil {
		// OPA's client sends no credential of a URL's: the user would be
		// dropped in silence, and a password logged with the source.
		return "", "", fmt.Errorf("bundle source %s carries a user in its URL, which is never sent: serve the bundle without one (the signature is what makes it trusted), or from a registry (oci://, --bundle-registry-credentials)", bundles.RedactedSource(raw))
	}
	resource = strings.TrimPrefix(u.EscapedPath(), "/")
	if u.RawQuery != "" {
		resource += "?" + u.RawQuery
	}
	if resource == "" {
		return "", "", fmt.Errorf("bundle source %q names no bundle path", raw)
	}
	return u.Scheme + "://" + u.Host, resource, nil
}

// pollFile reloads a bundle file when its content changes. OPA reads a file
// source once; a reload copies the file, bounded and scanned, to the private
// path OPA reads and triggers it, which verifies and activates the new
// bundle or refuses it and keeps the last good one. A file beyond the limits
// is refused here, before OPA reads it.
func (e *Engine) pollFile(opts Options) {
	interval := pollInterval(opts)
	ctx, cancel := context.WithCancel(context.Background())
	e.stopPoll = cancel
	e.pollDone = make(chan struct{})
	last := e.sourceDigest
	go func() {
		defer close(e.pollDone)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			data, err := e.limits.ReadFile(e.source)
			d := digest(data, err)
			if d == last {
				continue
			}
			last = d
			if err == nil {
				err = e.writePrivate(data)
			}
			if err != nil {
				e.report("", err, opts.OnBundleStatus)
				continue
			}
			bp := bundleplugin.Lookup(e.mgr)
			if bp == nil {
				continue
			}
			// The outcome reaches bundleStatus through the plugin's listener.
			_ = bp.Trigger(ctx)
		}
	}()
}

// digest is the content digest of a file as read, or the error reading it,
// so that a file that disappears and comes back is noticed too.
func digest(data []byte, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%x", sha256.Sum256(data))
}
