package execcache_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientauthv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"

	"github.com/ichor-dev/ichor-policy/internal/execcache"
)

var key = execcache.Key{
	Server: "https://mgmt.example:6443", Namespace: "team-a", Cluster: "demo", Purpose: "kubeconfig-admin",
	Kubeconfig: []string{"/home/ada/.kube/config"}, Context: "mgmt", User: "ada", Identity: "digest",
}

// issue makes a certificate and key valid from notBefore for lifetime, as
// the issuer would, and their ExecCredential.
func issue(t *testing.T, notBefore time.Time, lifetime time.Duration) (*clientauthv1.ExecCredential, *x509.Certificate) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ichor-credential:kubeconfig-admin"},
		NotBefore: notBefore, NotAfter: notBefore.Add(lifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pkcs8, err := x509.MarshalPKCS8PrivateKey(priv)
	require.NoError(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})
	return execcache.Credential(certPEM, keyPEM, execcache.RenewWithin(leaf.NotBefore, leaf.NotAfter)), leaf
}

func open(t *testing.T) (*execcache.Cache, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ichor", "exec-credential")
	c, err := execcache.Open(dir)
	require.NoError(t, err)
	return c, dir
}

func perm(t *testing.T, path string) os.FileMode {
	t.Helper()
	info, err := os.Lstat(path)
	require.NoError(t, err)
	return info.Mode().Perm()
}

// TestStoreAndLoad: a stored credential is a file 0600 in a directory 0700,
// holding the key's digest and the ExecCredential and nothing else; it is
// reused until it is due for renewal, then it is a miss.
func TestStoreAndLoad(t *testing.T) {
	c, dir := open(t)
	now := time.Now()
	cred, leaf := issue(t, now.Add(-time.Minute), time.Hour)
	require.NoError(t, c.Store(key, cred))

	assert.Equal(t, os.FileMode(0o700), perm(t, dir))
	assert.Equal(t, os.FileMode(0o600), perm(t, c.Path(key)))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file is left behind")

	data, err := os.ReadFile(c.Path(key))
	require.NoError(t, err)
	var doc map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(data, &doc))
	assert.ElementsMatch(t, []string{"key", "credential"}, keys(doc))
	assert.JSONEq(t, `"`+key.ID()+`"`, string(doc["key"]))
	var status struct {
		Status map[string]json.RawMessage `json:"status"`
	}
	require.NoError(t, json.Unmarshal(doc["credential"], &status))
	assert.ElementsMatch(t, []string{"expirationTimestamp", "clientCertificateData", "clientKeyData"}, keys(status.Status))

	got, err := c.Load(key, now)
	require.NoError(t, err)
	assertSame(t, cred, got)

	renewAt := execcache.RenewWithin(leaf.NotBefore, leaf.NotAfter)
	got, err = c.Load(key, renewAt.Add(-time.Second))
	require.NoError(t, err)
	assert.NotNil(t, got)
	got, err = c.Load(key, renewAt)
	require.NoError(t, err)
	assert.Nil(t, got, "a credential due for renewal is a miss")
	// Not valid yet here is no reason to ask again: the API server judges
	// its validity on its own clock, and a clock behind the issuer's would
	// otherwise ask at every run.
	got, err = c.Load(key, now.Add(-2*time.Minute))
	require.NoError(t, err)
	assert.NotNil(t, got)

	other := key
	other.Context = "another"
	got, err = c.Load(other, now)
	require.NoError(t, err)
	assert.Nil(t, got, "another context has its own file")
}

// TestRenewWithin: five minutes before expiry, or a tenth of the lifetime
// when that is shorter.
func TestRenewWithin(t *testing.T) {
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for lifetime, before := range map[time.Duration]time.Duration{
		time.Hour:            5 * time.Minute,
		365 * 24 * time.Hour: 5 * time.Minute,
		10 * time.Minute:     time.Minute,
		30 * time.Second:     3 * time.Second,
	} {
		assert.Equal(t, start.Add(lifetime-before), execcache.RenewWithin(start, start.Add(lifetime)), lifetime)
	}
	// A certificate that ends before it begins is renewed at its end, not
	// after it.
	assert.Equal(t, start, execcache.RenewWithin(start.Add(time.Hour), start))
}

// TestOpenRemovesWritesKilledMidway: a temporary file that a run killed
// between writing and renaming left (it holds a private key) is removed by
// the next run once it is a minute old; one being written now, and anything
// not of that name, are left.
func TestOpenRemovesWritesKilledMidway(t *testing.T) {
	c, dir := open(t)
	cred, _ := issue(t, time.Now(), time.Hour)
	require.NoError(t, c.Store(key, cred))
	name := key.ID() + ".json"
	old := time.Now().Add(-2 * time.Minute)
	files := map[string]bool{
		"." + name + "5577006791947779410": false, // killed mid-write: removed
		"." + name + "8674665223082153551": true,  // being written now: kept
		"." + name + "x123":                true,  // not a temporary name
		".other.json123":                   true,
		name:                               true, // the credential itself
	}
	for f := range files {
		path := filepath.Join(dir, f)
		if f != name {
			require.NoError(t, os.WriteFile(path, []byte("key"), 0o600))
		}
		if f != "."+name+"8674665223082153551" {
			require.NoError(t, os.Chtimes(path, old, old))
		}
	}
	_, err := execcache.Open(dir)
	require.NoError(t, err)
	for f, kept := range files {
		_, err := os.Lstat(filepath.Join(dir, f))
		if kept {
			assert.NoError(t, err, f)
		} else {
			assert.ErrorIs(t, err, os.ErrNotExist, f)
		}
	}
}

// TestOpenRemovesCredentialsLongExpired (review 62, F4): a key that
// changes (a rotating token file's digest is in it) leaves its entry, a
// private key, behind for good; a run removes those a day past their
// renewal, with their locks, and the locks left alone a day. What is
// still in use, recent, or not the cache's is left.
func TestOpenRemovesCredentialsLongExpired(t *testing.T) {
	c, dir := open(t)
	now := time.Now()
	dayAgo := now.Add(-25 * time.Hour)
	put := func(k execcache.Key, notBefore time.Time, lifetime time.Duration, written time.Time) string {
		t.Helper()
		cred, _ := issue(t, notBefore, lifetime)
		require.NoError(t, c.Store(k, cred))
		unlock, err := c.Lock(t.Context(), k)
		require.NoError(t, err)
		unlock()
		for _, path := range []string{c.Path(k), strings.TrimSuffix(c.Path(k), ".json") + ".lock"} {
			require.NoError(t, os.Chtimes(path, written, written))
		}
		return strings.TrimSuffix(filepath.Base(c.Path(k)), ".json")
	}
	keyed := func(id string) execcache.Key { k := key; k.Identity = id; return k }
	expired := put(keyed("rotated-away"), now.Add(-72*time.Hour), time.Hour, dayAgo)
	valid := put(keyed("long-lived"), now.Add(-72*time.Hour), 30*24*time.Hour, dayAgo)
	recent := put(keyed("just-renewed"), now.Add(-26*time.Hour), time.Hour, now)
	// Due for renewal an hour ago: a run may be renewing it now.
	lapsed := put(keyed("lapsed"), now.Add(-26*time.Hour), 25*time.Hour, dayAgo)
	orphanLock := strings.Repeat("ab", 32) + ".lock"
	require.NoError(t, os.WriteFile(filepath.Join(dir, orphanLock), nil, 0o600))
	require.NoError(t, os.Chtimes(filepath.Join(dir, orphanLock), dayAgo, dayAgo))
	notOurs := filepath.Join(dir, "notes.json")
	require.NoError(t, os.WriteFile(notOurs, []byte("{}"), 0o600))
	require.NoError(t, os.Chtimes(notOurs, dayAgo, dayAgo))

	_, err := execcache.Open(dir)
	require.NoError(t, err)
	exists := func(name string) bool {
		_, err := os.Lstat(filepath.Join(dir, name))
		return err == nil
	}
	assert.False(t, exists(expired+".json"), "a credential a day past its renewal")
	assert.False(t, exists(expired+".lock"), "its lock")
	assert.False(t, exists(orphanLock), "a day-old lock without a credential")
	for _, id := range []string{valid, recent, lapsed} {
		assert.True(t, exists(id+".json"), id)
		assert.True(t, exists(id+".lock"), id)
	}
	assert.True(t, exists("notes.json"), "a file not the cache's")
	got, err := c.Load(keyed("long-lived"), now)
	require.NoError(t, err)
	assert.NotNil(t, got)

	// Nothing is removed while a run holds its lock: it may be renewing
	// the credential, or waiting on a lock whose credential never came (a
	// request refused again and again).
	held := put(keyed("being-renewed"), now.Add(-72*time.Hour), time.Hour, dayAgo)
	unlock, err := c.Lock(t.Context(), keyed("being-renewed"))
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(dir, held+".json")))
	orphan := filepath.Join(dir, held+".lock")
	require.NoError(t, os.Chtimes(orphan, dayAgo, dayAgo))
	held2 := put(keyed("also-being-renewed"), now.Add(-72*time.Hour), time.Hour, dayAgo)
	unlock2, err := c.Lock(t.Context(), keyed("also-being-renewed"))
	require.NoError(t, err)
	_, err = execcache.Open(dir)
	require.NoError(t, err)
	assert.True(t, exists(held+".lock"), "a lock held, its credential gone")
	assert.True(t, exists(held2+".json"), "a credential whose lock is held")
	unlock()
	unlock2()
	_, err = execcache.Open(dir)
	require.NoError(t, err)
	assert.False(t, exists(held+".lock"), "let go, it is removed")
	assert.False(t, exists(held2+".json"))
}

// TestLoadExpirationTimestamp: the stored expirationTimestamp bounds the
// reuse too (it is what kubectl was told).
func TestLoadExpirationTimestamp(t *testing.T) {
	c, _ := open(t)
	now := time.Now()
	cred, _ := issue(t, now.Add(-time.Minute), time.Hour)
	past := cred.Status.ExpirationTimestamp.Add(-2 * time.Hour)
	cred.Status.ExpirationTimestamp.Time = past
	require.NoError(t, c.Store(key, cred))
	got, err := c.Load(key, now)
	require.NoError(t, err)
	assert.Nil(t, got)
}

// TestLoadCountsOnThisMachinesClock: the expiry written is this machine's
// count, not the certificate's dates, which are its signer's clock: a
// certificate ended by this clock (one ahead of the issuer's) is reused
// until that expiry, not asked for again at each run (review 164); but an
// expiry further off than a whole lifetime was not written by the plugin.
func TestLoadCountsOnThisMachinesClock(t *testing.T) {
	c, _ := open(t)
	now := time.Now()
	cred, _ := issue(t, now.Add(-3*time.Hour), time.Hour)
	cred.Status.ExpirationTimestamp.Time = now.Add(50 * time.Minute)
	require.NoError(t, c.Store(key, cred))
	got, err := c.Load(key, now)
	require.NoError(t, err)
	assert.NotNil(t, got, "a credential this clock counts as valid was asked for again")

	cred.Status.ExpirationTimestamp.Time = now.Add(2 * time.Hour)
	require.NoError(t, c.Store(key, cred))
	got, err = c.Load(key, now)
	require.ErrorContains(t, err, "further off than its certificate's lifetime")
	assert.Nil(t, got)
}

// assertSame compares credentials as they are written: a time read back is
// in the local zone.
func assertSame(t *testing.T, want, got *clientauthv1.ExecCredential) {
	t.Helper()
	w, err := json.Marshal(want)
	require.NoError(t, err)
	g, err := json.Marshal(got)
	require.NoError(t, err)
	assert.JSONEq(t, string(w), string(g))
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestLoadRefuses: what a cache file must not be. Each is a miss with a
// reason, never a crash, and the next Store replaces it with the user's own
// file, never writing through a link.
func TestLoadRefuses(t *testing.T) {
	now := time.Now()
	good, _ := issue(t, now.Add(-time.Minute), time.Hour)
	goodJSON := func(id string, cred *clientauthv1.ExecCredential) []byte {
		data, err := json.Marshal(map[string]any{"key": id, "credential": cred})
		require.NoError(t, err)
		return data
	}
	mismatched := good.DeepCopy()
	other, _ := issue(t, now.Add(-time.Minute), time.Hour)
	mismatched.Status.ClientKeyData = other.Status.ClientKeyData
	withToken := good.DeepCopy()
	withToken.Status.Token = "a token"
	v1beta1 := good.DeepCopy()
	v1beta1.APIVersion = "client.authentication.k8s.io/v1beta1"
	anotherServer := key
	anotherServer.Server = "https://other.example:6443"

	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, path string)
		why   string
	}{
		{"a symbolic link to another file", func(t *testing.T, path string) {
			target := filepath.Join(t.TempDir(), "target")
			require.NoError(t, os.WriteFile(target, goodJSON(key.ID(), good), 0o600))
			require.NoError(t, os.Symlink(target, path))
		}, "it is a symbolic link"},
		// Links the user made themselves (the directory is theirs alone):
		// the file the next Store writes was refused in their place, and
		// every run asked for a credential again (review 253 F6).
		{"a symbolic link to a device", func(t *testing.T, path string) {
			require.NoError(t, os.Symlink(os.DevNull, path))
		}, "it is a symbolic link"},
		{"a symbolic link to a directory", func(t *testing.T, path string) {
			require.NoError(t, os.Symlink(t.TempDir(), path))
		}, "it is a symbolic link"},
		{"readable by the group", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, goodJSON(key.ID(), good), 0o640))
			require.NoError(t, os.Chmod(path, 0o640))
		}, "lets others read or write it"},
		{"writable by the world", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, goodJSON(key.ID(), good), 0o602))
			require.NoError(t, os.Chmod(path, 0o602))
		}, "lets others read or write it"},
		{"garbage", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte("\x1b[2J{garbage"), 0o600))
		}, "it does not decode"},
		{"empty", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, nil, 0o600))
		}, "it does not decode"},
		{"another server's key", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, goodJSON(anotherServer.ID(), good), 0o600))
		}, "it was written for another server"},
		{"a key that is not its certificate's", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, goodJSON(key.ID(), mismatched), 0o600))
		}, "do not go together"},
		{"a token besides the certificate", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, goodJSON(key.ID(), withToken), 0o600))
		}, "does not hold exactly a client certificate"},
		{"another version", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, goodJSON(key.ID(), v1beta1), 0o600))
		}, "not an ExecCredential of client.authentication.k8s.io/v1"},
		{"an unknown field", func(t *testing.T, path string) {
			data := goodJSON(key.ID(), good)
			data = append(data[:len(data)-1], []byte(`,"kubeconfig":"x"}`)...)
			require.NoError(t, os.WriteFile(path, data, 0o600))
		}, "unknown field"},
		{"two documents", func(t *testing.T, path string) {
			data := goodJSON(key.ID(), good)
			require.NoError(t, os.WriteFile(path, append(append(data, '\n'), data...), 0o600))
		}, "more than one document"},
		{"too large", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte(strings.Repeat(" ", 65<<10)), 0o600))
		}, "larger than"},
		{"a directory", func(t *testing.T, path string) {
			require.NoError(t, os.Mkdir(path, 0o700))
		}, "not a regular file"},
		{"a FIFO (a read would block)", func(t *testing.T, path string) {
			require.NoError(t, syscall.Mkfifo(path, 0o600))
		}, "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := open(t)
			path := c.Path(key)
			tc.setup(t, path)
			var target []byte
			if dest, err := os.Readlink(path); err == nil && isRegular(dest) {
				target, err = os.ReadFile(dest)
				require.NoError(t, err)
				defer func() {
					after, err := os.ReadFile(dest)
					require.NoError(t, err)
					assert.Equal(t, target, after, "the link's target was written")
				}()
			}
			got, err := c.Load(key, now)
			assert.Nil(t, got)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.why)

			if tc.name == "a directory" {
				return // a directory is not replaced by a rename; nobody makes one there
			}
			fresh, _ := issue(t, now.Add(-time.Minute), time.Hour)
			require.NoError(t, c.Store(key, fresh))
			info, err := os.Lstat(path)
			require.NoError(t, err)
			assert.True(t, info.Mode().IsRegular())
			assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
			got, err = c.Load(key, now)
			require.NoError(t, err)
			assertSame(t, fresh, got)
		})
	}
}

func isRegular(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular()
}

// TestOpenChecksTheDirectory: the directory is made 0700, a looser one is
// closed, and a symbolic link in its place is refused.
func TestOpenChecksTheDirectory(t *testing.T) {
	base := t.TempDir()
	loose := filepath.Join(base, "loose")
	require.NoError(t, os.Mkdir(loose, 0o755)) //nolint:gosec // loose on purpose
	require.NoError(t, os.Chmod(loose, 0o755))
	_, err := execcache.Open(loose)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), perm(t, loose))

	link := filepath.Join(base, "link")
	require.NoError(t, os.Symlink(loose, link))
	_, err = execcache.Open(link)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not a directory")
}

// The superuser run by sudo with the user's HOME kept (sudo -E kubectl ...)
// makes no cache inside that user's directory: one it made was root's, and
// every run of the user's after it found the cache not theirs and asked for
// a credential again (review 234 F2). Root not run by that user (a CI
// container whose HOME a host user owns) makes its cache as before (review
// 237 F2), and its own directories as any.
func TestRootRunBySudoMakesNoCacheInTheUsersDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a directory is given to another user")
	}
	home := t.TempDir()
	require.NoError(t, os.Chown(home, 1000, 1000))
	dir := filepath.Join(home, ".cache", "ichor", "exec-credential")
	t.Setenv("SUDO_UID", "1000")
	_, err := execcache.Open(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "belongs to uid 1000, who ran sudo")
	assert.NoDirExists(t, filepath.Join(home, ".cache"))
	_, err = execcache.Open(filepath.Join(t.TempDir(), ".cache", "ichor", "exec-credential"))
	require.NoError(t, err, "root's own directory")

	t.Setenv("SUDO_UID", "1001")
	_, err = execcache.Open(dir)
	require.NoError(t, err, "run by another user")
	os.Unsetenv("SUDO_UID") //nolint:errcheck // t.Setenv restores it
	require.NoError(t, os.RemoveAll(filepath.Join(home, ".cache")))
	_, err = execcache.Open(dir)
	require.NoError(t, err, "not run by sudo")
}

// TestKeysNeverShare: a key differing in any one field is another file.
func TestKeysNeverShare(t *testing.T) {
	seen := map[string]string{key.ID(): "base"}
	changes := map[string]func(*execcache.Key){
		"server":      func(k *execcache.Key) { k.Server = "https://other.example:6443" },
		"server name": func(k *execcache.Key) { k.TLSServerName = "other" },
		"namespace":   func(k *execcache.Key) { k.Namespace = "team-b" },
		"cluster":     func(k *execcache.Key) { k.Cluster = "prod" },
		"purpose":     func(k *execcache.Key) { k.Purpose = "kubeconfig-super-admin" },
		"kubeconfig":  func(k *execcache.Key) { k.Kubeconfig = []string{"/home/bob/.kube/config"} },
		"context":     func(k *execcache.Key) { k.Context = "other" },
		"user":        func(k *execcache.Key) { k.User = "bob" },
		"impersonate": func(k *execcache.Key) { k.Impersonate = "bob" },
		"identity":    func(k *execcache.Key) { k.Identity = "other" },
		"ttl":         func(k *execcache.Key) { k.TTL = "720h0m0s" },
	}
	// Every field of the key is changed above: a field added to it and
	// left out here fails.
	require.Len(t, changes, reflect.TypeFor[execcache.Key]().NumField())
	for name, change := range changes {
		k := key
		k.Kubeconfig = append([]string(nil), key.Kubeconfig...)
		change(&k)
		id := k.ID()
		assert.NotContains(t, seen, id, name)
		seen[id] = name
	}
}

// TestLockSerializes: while one run holds a key's lock another waits, and
// gives up at its deadline; another key's lock is free.
func TestLockSerializes(t *testing.T) {
	c, _ := open(t)
	unlock, err := c.Lock(t.Context(), key)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err = c.Lock(ctx, key)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "another exec-credential held it")

	other := key
	other.Cluster = "prod"
	unlockOther, err := c.Lock(t.Context(), other)
	require.NoError(t, err)
	unlockOther()

	unlock()
	unlock, err = c.Lock(t.Context(), key)
	require.NoError(t, err)
	unlock()
}

// TestRefusals: a refusal is held for RefusalHold from the time it was
// asked, in a file 0600 of its own, its message cut at a character; a
// credential stored ends it. A refusal file that is not the user's own, is
// another key's, or holds longer than the plugin holds one (forged, or a
// clock stepped back) is a miss said as an error, never believed (review
// 253 F4).
func TestRefusals(t *testing.T) {
	c, dir := open(t)
	asked := time.Now()
	long := strings.Repeat("é", 4<<10)
	require.NoError(t, c.StoreRefusal(key, "refused: "+long, asked))
	path := c.RefusalPath(key)
	assert.Equal(t, os.FileMode(0o600), perm(t, path))

	r, err := c.LoadRefusal(key, asked.Add(time.Second))
	require.NoError(t, err)
	require.NotNil(t, r)
	assert.True(t, r.Until.Equal(asked.Add(execcache.RefusalHold)), "held until %s", r.Until)
	assert.LessOrEqual(t, len(r.Message), 4<<10)
	assert.True(t, strings.HasPrefix(r.Message, "refused: é"))
	assert.True(t, utf8.ValidString(r.Message), "cut inside a character")

	r, err = c.LoadRefusal(key, asked.Add(execcache.RefusalHold))
	assert.NoError(t, err)
	assert.Nil(t, r, "held past its time")
	other := key
	other.Cluster = "prod"

	valid, err := os.ReadFile(path)
	require.NoError(t, err)
	var held execcache.Refusal
	require.NoError(t, json.Unmarshal(valid, &held))
	rewrite := func(edit func(*execcache.Refusal)) []byte {
		r := held
		edit(&r)
		data, err := json.Marshal(r)
		require.NoError(t, err)
		return data
	}
	for name, tc := range map[string]struct {
		data []byte
		mode os.FileMode
		want string
	}{
		"held a year":         {data: rewrite(func(r *execcache.Refusal) { r.Until = r.Until.AddDate(1, 0, 0) }), want: "not 30s from a time past"},
		"asked in the future": {data: rewrite(func(r *execcache.Refusal) { r.Asked, r.Until = r.Asked.Add(time.Hour), r.Until.Add(time.Hour) }), want: "not 30s from a time past"},
		"another key's":       {data: rewrite(func(r *execcache.Refusal) { r.Key = other.ID() }), want: "written for another"},
		"more fields":         {data: []byte(`{"key":"` + key.ID() + `","extra":1}`), want: "does not decode"},
		"two documents":       {data: append(append([]byte{}, valid...), valid...), want: "more than one document"},
		"open to others":      {data: valid, mode: 0o644, want: "lets others read or write it"},
	} {
		require.NoError(t, os.Remove(path), name)
		mode := tc.mode
		if mode == 0 {
			mode = 0o600
		}
		require.NoError(t, os.WriteFile(path, tc.data, mode), name)
		require.NoError(t, os.Chmod(path, mode), name)
		r, err := c.LoadRefusal(key, asked.Add(time.Second))
		assert.Nil(t, r, name)
		assert.ErrorContains(t, err, tc.want, name)
	}

	// A link is never followed; stored over, the link goes, its target
	// untouched.
	require.NoError(t, os.Remove(path))
	target := filepath.Join(t.TempDir(), "refusal")
	require.NoError(t, os.WriteFile(target, valid, 0o600))
	require.NoError(t, os.Symlink(target, path))
	r, err = c.LoadRefusal(key, asked.Add(time.Second))
	assert.Nil(t, r)
	assert.ErrorContains(t, err, "symbolic link")
	require.NoError(t, c.StoreRefusal(key, "refused again", asked))
	r, err = c.LoadRefusal(key, asked)
	require.NoError(t, err)
	assert.Equal(t, "refused again", r.Message)
	kept, err := os.ReadFile(target)
	require.NoError(t, err)
	assert.Equal(t, valid, kept, "the link's target was written")
	info, err := os.Lstat(path)
	require.NoError(t, err)
	assert.True(t, info.Mode().IsRegular(), "the link stayed")

	// A credential issued ends the refusal.
	cred, _ := issue(t, time.Now(), time.Hour)
	require.NoError(t, c.Store(key, cred))
	_, err = os.Lstat(path)
	assert.ErrorIs(t, err, os.ErrNotExist)

	// A day-old refusal, and a refusal's write killed midway a minute ago,
	// go at the next Open; a recent one stays.
	require.NoError(t, c.StoreRefusal(key, "old", asked))
	require.NoError(t, c.StoreRefusal(other, "recent", asked))
	leftover := filepath.Join(dir, "."+key.ID()+".refusal5577006791947779410")
	require.NoError(t, os.WriteFile(leftover, nil, 0o600))
	dayAgo := time.Now().Add(-25 * time.Hour)
	for _, p := range []string{path, leftover} {
		require.NoError(t, os.Chtimes(p, dayAgo, dayAgo))
	}
	_, err = execcache.Open(dir)
	require.NoError(t, err)
	for _, p := range []string{path, leftover} {
		_, err = os.Lstat(p)
		assert.ErrorIs(t, err, os.ErrNotExist, p)
	}
	_, err = os.Lstat(c.RefusalPath(other))
	assert.NoError(t, err, "a recent refusal was removed")
}
