// Package execcache keeps the credentials `ichor cluster exec-credential`
// was issued, so that each kubectl run does not cost a TalosCredentialRequest.
//
// A credential is a certificate and its private key, so the cache is held to
// the rules of a private key on disk: one file per key (the management API
// server, the TalosCluster, the kubeconfig context and the identity used to
// ask), mode 0600 in a directory 0700 of the user, written atomically (a
// temporary file renamed into place, so a reader sees the old file or the new
// one, never half of one). A file that is a symbolic link, not the user's, or
// readable by anyone else is never read; one that does not decode, is another
// key's, or whose certificate is not for its key is ignored; each is replaced
// by the next credential issued. Nothing the cache holds is trusted beyond
// "this process wrote it": a file that fails any check is a miss, never an
// error that stops kubectl.
package execcache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientauthv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"

	"github.com/ichor-dev/ichor-policy/internal/privatefile"
)

// maxFileSize bounds what is read of a cache file: a certificate and a key
// take a few kilobytes.
const maxFileSize = 64 << 10

// renewBefore is how long before its certificate expires a credential is
// renewed at most; a short one is renewed a tenth of its lifetime before.
const renewBefore = 5 * time.Minute

// Key names what a cached credential was issued for. Two keys that differ in
// any field never share a file, so two contexts, two people or two servers
// never share a credential.
type Key struct {
	// Server is the management API server's URL, and TLSServerName the
	// name its certificate is checked for.
	Server        string `json:"server"`
	TLSServerName string `json:"tlsServerName,omitempty"`
	// Namespace and Cluster name the TalosCluster, Purpose the credential.
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster"`
	Purpose   string `json:"purpose"`
	// Kubeconfig are the files the management kubeconfig is read from;
	// Context and User the context and the kubeconfig user used.
	Kubeconfig []string `json:"kubeconfig,omitempty"`
	Context    string   `json:"context,omitempty"`
	User       string   `json:"user,omitempty"`
	// Impersonate is who the caller impersonates (--as, --as-group,
	// --as-uid), as one string.
	Impersonate string `json:"impersonate,omitempty"`
	// Identity is a SHA-256 of what the caller authenticates with to the
	// management API server (its certificate, token, their files), so that
	// a kubeconfig user whose credential changed to another person's does
	// not reuse the first person's admin credential.
	Identity string `json:"identity,omitempty"`
	// TTL is the lifetime asked for (--ttl): a kubeconfig that asks for an
	// hour is never served the month another kubeconfig of the same
	// context asked for.
	TTL string `json:"ttl,omitempty"`
}

// ID is the key's name on disk: a SHA-256 of every field.
func (k Key) ID() string {
	data, err := json.Marshal(k)
	if err != nil {
		// A struct of strings always marshals.
		panic(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// entry is a cache file: the key it was written for and the ExecCredential
// as it was printed, nothing else.
type entry struct {
	Key        string                      `json:"key"`
	Credential clientauthv1.ExecCredential `json:"credential"`
}

// Cache is a directory of cached credentials.
type Cache struct {
	dir string
}

// DefaultDir is where the cache lives: ichor/exec-credential under the
// user's cache directory ($XDG_CACHE_HOME or ~/.cache on Linux,
// ~/Library/Caches on macOS).
func DefaultDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("the user's cache directory: %w", err)
	}
	return filepath.Join(base, "ichor", "exec-credential"), nil
}

// Open makes the directory (0700) if it does not exist and checks it: a
// directory of the user's, not a symbolic link; group and world access are
// taken away.
func Open(dir string) (*Cache, error) {
	if err := mayMake(dir); err != nil {
		return nil, fmt.Errorf("the credential cache %s is not made: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the credential cache %s: %w", dir, err)
	}
	info, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("the credential cache %s: %w", dir, err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("the credential cache %s is not a directory (a symbolic link?); remove it", dir)
	}
	if err := ownedByUser(info); err != nil {
		return nil, fmt.Errorf("the credential cache %s: %w", dir, err)
	}
	if openToOthers(info) {
		if err := os.Chmod(dir, 0o700); err != nil { //nolint:gosec // a directory is searched: 0700 is its 0600
			return nil, fmt.Errorf("the credential cache %s is open to others and cannot be closed: %w", dir, err)
		}
	}
	now := time.Now()
	removeLeftovers(dir, now)
	removeExpired(dir, now)
	return &Cache{dir: dir}, nil
}

// mayMake refuses, to root run by sudo, to make dir inside the directory of
// the user who ran it (makesIn): with their HOME kept (sudo -E), root made
// their cache directory its own, and every run of theirs after it found
// the cache not theirs and asked again, each time a credential, an Event
// and a decision, with root's private key left in their home, which they
// could not remove (review 234 F2). A directory there already is checked
// by Open as any.
func mayMake(dir string) error {
	for parent := dir; ; {
		info, err := os.Lstat(parent)
		if err == nil {
			return makesIn(parent, info)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil // MkdirAll says what is wrong
		}
		next := filepath.Dir(parent)
		if next == parent {
			return nil
		}
		parent = next
	}
}

// expiredAge is how long after its renewal a cached credential, and its
// lock, are removed: by then its certificate has expired, and no run of
// the plugin can still be renewing it.
const expiredAge = 24 * time.Hour

// removeExpired removes the credentials whose renewal is a day past, with
// their locks, and the locks a day old whose credential is gone. A key
// that changes (a kubeconfig whose token file rotates, its digest in the
// key) leaves its entry behind, a private key each, which nothing else
// would remove. Only files last written over a day ago are read; a file
// that does not decode is left for Load to report. Nothing is removed
// while a run holds its lock (removeUnlocked).
func removeExpired(dir string, now time.Time) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	stale := func(path string) bool {
		info, err := os.Lstat(path)
		return err == nil && info.Mode().IsRegular() && now.Sub(info.ModTime()) > expiredAge
	}
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), refusalSuffix); ok && isID(name) {
			// A refusal holds for seconds and holds no key: one a day old
			// goes, unlocked.
			if path := filepath.Join(dir, e.Name()); stale(path) {
				_ = os.Remove(path)
			}
			continue
		}
		var id, credPath string
		if name, ok := strings.CutSuffix(e.Name(), ".json"); ok && isID(name) {
			id, credPath = name, filepath.Join(dir, e.Name())
		} else if name, ok := strings.CutSuffix(e.Name(), ".lock"); ok && isID(name) {
			if _, err := os.Lstat(filepath.Join(dir, name+".json")); !errors.Is(err, os.ErrNotExist) {
				continue // the credential's own entry judges it
			}
			id = name
		} else {
			continue
		}
		lockPath := filepath.Join(dir, id+".lock")
		expired := func() bool {
			if credPath == "" {
				_, err := os.Lstat(filepath.Join(dir, id+".json"))
				return errors.Is(err, os.ErrNotExist) && stale(lockPath)
			}
			if !stale(credPath) {
				return false
			}
			data, err := readPrivate(credPath)
			if err != nil {
				return false
			}
			cred, _, err := decode(data, id)
			return err == nil && now.Sub(cred.Status.ExpirationTimestamp.Time) > expiredAge
		}
		if expired() {
			removeUnlocked(lockPath, credPath, expired)
		}
	}
}

// isID tells a key's ID: the hex of a SHA-256.
func isID(s string) bool {
	if len(s) != sha256.Size*2 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// leftoverAge is how old a temporary file of Store must be to be taken for
// a leftover: a run killed between writing it and renaming it into place
// (its rename takes well under a second).
const leftoverAge = time.Minute

// removeLeftovers removes the temporary files that runs killed mid-Store
// left: each holds a private key, and nothing else would ever remove it.
// What cannot be removed stays, as it would have.
func removeLeftovers(dir string, now time.Time) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !isLeftover(e.Name()) || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < leftoverAge {
			continue
		}
		_ = os.Remove(filepath.Join(dir, e.Name()))
	}
}

// isLeftover tells the name of a temporary file of Store or StoreRefusal:
// "." and the file it replaces ("<id>.json" or "<id>.refusal"), then digits
// (privatefile.Write, through renameio).
func isLeftover(name string) bool {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return false
	}
	for _, suffix := range []string{".json", refusalSuffix} {
		id, digits, ok := strings.Cut(rest, suffix)
		if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
			continue
		}
		if isID(id) {
			return true
		}
	}
	return false
}

// Path is the file of k.
func (c *Cache) Path(k Key) string {
	return filepath.Join(c.dir, k.ID()+".json")
}

// RenewWithin is when a credential valid from start to end is renewed: 5
// minutes before it expires, or a tenth of its lifetime before when that is
// shorter, so that a credential of a few minutes is still reused.
func RenewWithin(start, end time.Time) time.Time {
	// A credential that ends before it begins has no margin: it is renewed
	// at its end, never after it.
	margin := max(end.Sub(start)/10, 0)
	margin = min(margin, renewBefore)
	return end.Add(-margin)
}

// Load is the credential cached for k, if it is usable at now. An absent
// file, or a credential due for renewal, is (nil, nil). A file that is not
// to be trusted or does not hold a credential for k is (nil, error): a miss
// the caller shows as a warning, never a reason to stop.
func (c *Cache) Load(k Key, now time.Time) (*clientauthv1.ExecCredential, error) {
	path := c.Path(k)
	data, err := readPrivate(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ignoring the cached credential %s: %w", path, err)
	}
	cred, lifetime, err := decode(data, k.ID())
	if err != nil {
		return nil, fmt.Errorf("ignoring the cached credential %s: %w", path, err)
	}
	// The expiry written is counted on this machine's clock, its
	// certificate's dates on its signer's (a clock here ahead of the
	// issuer's by more than the lifetime would make every credential due
	// at once, and kubectl ask before each of its requests); an expiry
	// further off than a whole lifetime was not written by this plugin.
	renewAt := cred.Status.ExpirationTimestamp.Time
	if renewAt.Sub(now) > lifetime {
		return nil, fmt.Errorf("ignoring the cached credential %s: its expiry %s is further off than its certificate's lifetime, %s",
			path, renewAt.UTC().Format(time.RFC3339), lifetime)
	}
	if !now.Before(renewAt) {
		return nil, nil
	}
	return cred, nil
}

// decode checks a cache file's content: strictly the entry of key id, an
// ExecCredential of client.authentication.k8s.io/v1 holding a certificate
// and its key and nothing else. It returns the credential and its
// certificate's lifetime.
func decode(data []byte, id string) (*clientauthv1.ExecCredential, time.Duration, error) {
	var e entry
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return nil, 0, fmt.Errorf("it does not decode: %w", err)
	}
	if dec.More() {
		return nil, 0, errors.New("it holds more than one document")
	}
	if e.Key != id {
		return nil, 0, errors.New("it was written for another server, cluster, context or user")
	}
	cred := &e.Credential
	s := cred.Status
	switch {
	case cred.APIVersion != clientauthv1.SchemeGroupVersion.String() || cred.Kind != "ExecCredential":
		return nil, 0, fmt.Errorf("it holds %s %s, not an ExecCredential of %s", cred.APIVersion, cred.Kind, clientauthv1.SchemeGroupVersion)
	case s == nil || s.Token != "" || s.ClientCertificateData == "" || s.ClientKeyData == "" || s.ExpirationTimestamp == nil:
		return nil, 0, errors.New("it does not hold exactly a client certificate, its key and an expiry")
	}
	pair, err := tls.X509KeyPair([]byte(s.ClientCertificateData), []byte(s.ClientKeyData))
	if err != nil {
		return nil, 0, fmt.Errorf("its certificate and key do not go together: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, 0, fmt.Errorf("its certificate does not parse: %w", err)
	}
	return cred, leaf.NotAfter.Sub(leaf.NotBefore), nil
}

// Store writes cred as the credential of k: a temporary file of mode 0600 in
// the directory, renamed over the file of k (over a symbolic link too, which
// is replaced, never followed).
func (c *Cache) Store(k Key, cred *clientauthv1.ExecCredential) error {
	data, err := json.Marshal(entry{Key: k.ID(), Credential: *cred})
	if err != nil {
		return fmt.Errorf("encode the credential: %w", err)
	}
	if err := replace(c.Path(k), data); err != nil {
		return fmt.Errorf("cache the credential: %w", err)
	}
	// A credential issued ends a refusal held before it.
	if err := os.Remove(c.RefusalPath(k)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the refusal held for the credential: %w", err)
	}
	return nil
}

// RefusalHold is how long a refusal of the credential is held: runs within
// it are refused from the cache, without a request (review 253 F4: a
// revoked person's k9s, or any client that retries, asked the management
// server every few seconds, each time a request refused and a decision
// logged). Short, since a person granted again waits it out.
const RefusalHold = 30 * time.Second

// refusalSuffix ends the name of a refusal's file: "<id>.refusal".
const refusalSuffix = ".refusal"

// maxRefusalMessage bounds the message a refusal keeps.
const maxRefusalMessage = 4 << 10

// Refusal is a refusal of k's credential as the cache holds it: when it was
// asked for, until when it holds, and the refusal's message.
type Refusal struct {
	Key     string    `json:"key"`
	Asked   time.Time `json:"asked"`
	Until   time.Time `json:"until"`
	Message string    `json:"message"`
}

// RefusalPath is the file of k's refusal.
func (c *Cache) RefusalPath(k Key) string {
	return filepath.Join(c.dir, k.ID()+refusalSuffix)
}

// StoreRefusal holds the refusal of k's credential, asked for at asked,
// for RefusalHold from then. The message is cut to 4 KiB, at a character.
func (c *Cache) StoreRefusal(k Key, message string, asked time.Time) error {
	if len(message) > maxRefusalMessage {
		// A character the cut splits is dropped whole.
		message = strings.ToValidUTF8(message[:maxRefusalMessage], "")
	}
	data, err := json.Marshal(Refusal{Key: k.ID(), Asked: asked.UTC(), Until: asked.Add(RefusalHold).UTC(), Message: message})
	if err != nil {
		return fmt.Errorf("encode the refusal: %w", err)
	}
	if err := replace(c.RefusalPath(k), data); err != nil {
		return fmt.Errorf("hold the refusal: %w", err)
	}
	return nil
}

// replace writes data as the file at path, mode 0600: to a temporary file
// beside it, never in a shared temporary directory, renamed over it, so a
// reader sees the old file or the new one whole. A symbolic link there is
// the user's own (the directory is theirs alone), but privatefile refuses to
// replace one naming a device or a directory, and every run then asked for
// a credential again (review 253 F6): the link goes, its target untouched.
func replace(path string, data []byte) error {
	if info, err := os.Lstat(path); err == nil && info.Mode()&os.ModeSymlink != 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove the symbolic link %s: %w", path, err)
		}
	}
	return privatefile.Write(path, data)
}

// LoadRefusal is the refusal of k's credential held at now, if any. None,
// or one whose time is over, is (nil, nil); a file that is not to be
// trusted, does not decode strictly, is another key's, or holds longer than
// RefusalHold (not written by this plugin, or a clock stepped back) is
// (nil, error): a miss the caller shows as a warning, and asks.
func (c *Cache) LoadRefusal(k Key, now time.Time) (*Refusal, error) {
	path := c.RefusalPath(k)
	data, err := readPrivate(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ignoring the refusal held in %s: %w", path, err)
	}
	var r Refusal
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	switch err := dec.Decode(&r); {
	case err != nil:
		return nil, fmt.Errorf("ignoring the refusal held in %s: it does not decode: %w", path, err)
	case dec.More():
		return nil, fmt.Errorf("ignoring the refusal held in %s: it holds more than one document", path)
	case r.Key != k.ID():
		return nil, fmt.Errorf("ignoring the refusal held in %s: it was written for another server, cluster, context or user", path)
	case r.Until.Sub(r.Asked) != RefusalHold || r.Until.Sub(now) > RefusalHold:
		return nil, fmt.Errorf("ignoring the refusal held in %s: it holds from %s to %s, not %s from a time past",
			path, r.Asked.Format(time.RFC3339), r.Until.Format(time.RFC3339), RefusalHold)
	case !now.Before(r.Until):
		return nil, nil
	}
	return &r, nil
}

// Lock holds the lock of k until the returned function is called, so that
// kubectl runs in parallel with an expired credential ask for one between
// them, not one each: the others wait, then find it cached. It gives up at
// ctx's end; where the system has no file locks it does nothing.
func (c *Cache) Lock(ctx context.Context, k Key) (func(), error) {
	return lockFile(ctx, filepath.Join(c.dir, k.ID()+".lock"))
}

// readPrivate reads a file that must be the user's own regular file,
// unreadable by group and world, without following a symbolic link.
func readPrivate(path string) ([]byte, error) {
	f, err := openNoFollow(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	switch {
	case !info.Mode().IsRegular():
		return nil, fmt.Errorf("it is not a regular file (%s)", info.Mode().Type())
	case openToOthers(info):
		return nil, fmt.Errorf("its mode %04o lets others read or write it", info.Mode().Perm())
	case info.Size() > maxFileSize:
		return nil, fmt.Errorf("it is larger than %d bytes", maxFileSize)
	}
	if err := ownedByUser(info); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("it is larger than %d bytes", maxFileSize)
	}
	return data, nil
}

// Credential is the ExecCredential of a certificate and its key, renewed at
// renewAt: what exec-credential prints and caches.
func Credential(certPEM, keyPEM []byte, renewAt time.Time) *clientauthv1.ExecCredential {
	at := metav1.NewTime(renewAt.UTC().Truncate(time.Second))
	return &clientauthv1.ExecCredential{
		TypeMeta: metav1.TypeMeta{APIVersion: clientauthv1.SchemeGroupVersion.String(), Kind: "ExecCredential"},
		Status: &clientauthv1.ExecCredentialStatus{
			ExpirationTimestamp:   &at,
			ClientCertificateData: string(certPEM),
			ClientKeyData:         string(keyPEM),
		},
	}
}
