// Package kubeconfig gathers the facts of a TalosCluster's kubeconfigRef: a
// kubeconfig a tenant wrote into a Secret, which the rule
// ichor/kubeconfig/decision judges before anything in it takes effect.
//
// The document is never handed to clientcmd, which would honour everything a
// kubeconfig can say inside the manager's process (a token file, a client
// certificate path, a command to run, an auth provider, a proxy, an
// impersonation). It is read as a generic document, every key is listed by
// its path and looked up in the schema of the kubeconfig types (so a key
// clientcmd would ignore, or match case-insensitively, is found, not
// ignored), and once the rule allows it, the client is built here from the
// allow-listed data alone: the server, the CA data, the TLS server name and
// the credential data.
package kubeconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/ichor-policy/internal/facts/servingcert"
)

// Bounds of what is read of a kubeconfig. A kubeconfig with a client
// certificate, its key and a CA is a few kilobytes.
const (
	// MaxBytes bounds the document that is parsed at all.
	MaxBytes = 256 << 10
	// MaxFields bounds the field paths listed in the facts; FieldCount
	// counts them all.
	MaxFields = 1000
	// maxText bounds each tenant string in the facts (a name, a key, the
	// server URL, an error).
	maxText = 256
	// MaxServerBytes bounds the server URL a client is built for.
	MaxServerBytes = 2048
)

// Field is one key present in the document: Path with the index of each
// list entry (users[0].user.tokenFile), Field without (users[].user.tokenFile),
// the name the rule's table knows it by.
type Field struct {
	Path  string `json:"path"`
	Field string `json:"field"`
}

// Server is the facts of the server URL of the context in use.
type Server struct {
	URL    string `json:"url"`
	Scheme string `json:"scheme"`
	Host   string `json:"host"`
	// UserInfo is whether the URL carries a user name or password.
	UserInfo bool   `json:"user_info"`
	Error    string `json:"error,omitempty"`
}

// Credentials says which credential data the user of the context in use
// carries, never the data.
type Credentials struct {
	Token                 bool `json:"token"`
	ClientCertificateData bool `json:"client_certificate_data"`
	ClientKeyData         bool `json:"client_key_data"`
}

// Context is the facts of the context in use (current-context, or the only
// one) and of the cluster and user it names.
type Context struct {
	Name         string `json:"name"`
	Cluster      string `json:"cluster"`
	User         string `json:"user"`
	ClusterFound bool   `json:"cluster_found"`
	UserFound    bool   `json:"user_found"`

	Server                Server      `json:"server"`
	CAData                bool        `json:"ca_data"`
	InsecureSkipTLSVerify bool        `json:"insecure_skip_tls_verify"`
	TLSServerName         string      `json:"tls_server_name"`
	Credentials           Credentials `json:"credentials"`
}

// Facts are the facts of a kubeconfig document.
type Facts struct {
	// Bytes is the document's size; a document over MaxBytes is not parsed.
	Bytes    int `json:"bytes"`
	MaxBytes int `json:"max_bytes"`
	// Parsed is whether it was read (YAML or JSON, no duplicate key, every
	// value of its field's type); Error says why not.
	Parsed bool   `json:"parsed"`
	Error  string `json:"error,omitempty"`
	// Fields are the keys present, each mapping's in sorted order, at most MaxFields;
	// FieldCount counts them all.
	Fields     []Field `json:"fields"`
	FieldCount int     `json:"field_count"`
	// UnknownFields are the paths of keys the kubeconfig schema does not
	// have (not descended into), at most MaxFields; they are among Fields
	// too.
	UnknownFields []string `json:"unknown_fields"`

	Contexts       int    `json:"contexts"`
	Clusters       int    `json:"clusters"`
	Users          int    `json:"users"`
	CurrentContext string `json:"current_context"`
	// Context is the context in use; nil when none is (no context, several
	// without current-context, or current-context names none).
	Context *Context `json:"context,omitempty"`
}

// Document is a read kubeconfig: its facts, and what a client is built from
// once the rule allows it.
type Document struct {
	Facts Facts

	cluster *clientcmdv1.Cluster
	user    *clientcmdv1.AuthInfo
}

// Read reads a kubeconfig. It never fails: what cannot be read is a fact.
func Read(data []byte) *Document {
	d := &Document{Facts: Facts{Bytes: len(data), MaxBytes: MaxBytes, Fields: []Field{}, UnknownFields: []string{}}}
	f := &d.Facts
	if len(data) > MaxBytes {
		f.Error = fmt.Sprintf("the kubeconfig is %d bytes, more than the %d read", len(data), MaxBytes)
		return d
	}
	// Strict: a key given twice is an error, not the last one winning.
	doc, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		f.Error = readError(err)
		return d
	}
	var generic any
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	if err := dec.Decode(&generic); err != nil {
		f.Error = readError(err)
		return d
	}
	if _, ok := generic.(map[string]any); !ok {
		f.Error = "the kubeconfig is not a mapping"
		return d
	}
	w := walker{facts: f}
	w.walk(generic, reflect.TypeFor[clientcmdv1.Config](), "", "")
	var cfg clientcmdv1.Config
	if err := json.Unmarshal(doc, &cfg); err != nil {
		f.Error = readError(err)
		return d
	}
	f.Parsed = true
	f.Contexts, f.Clusters, f.Users = len(cfg.Contexts), len(cfg.Clusters), len(cfg.AuthInfos)
	f.CurrentContext = clip(cfg.CurrentContext)
	d.selectContext(&cfg)
	return d
}

// selectContext finds the context in use: current-context, as clientcmd
// reads it, or, without one, the only context there is (where clientcmd
// would take none: a Secret written with a single context and no
// current-context is read as meant).
func (d *Document) selectContext(cfg *clientcmdv1.Config) {
	var ctx *clientcmdv1.NamedContext
	switch {
	case cfg.CurrentContext != "":
		for i := range cfg.Contexts {
			if cfg.Contexts[i].Name == cfg.CurrentContext {
				ctx = &cfg.Contexts[i]
				break
			}
		}
	case len(cfg.Contexts) == 1:
		ctx = &cfg.Contexts[0]
	}
	if ctx == nil {
		return
	}
	c := &Context{Name: clip(ctx.Name), Cluster: clip(ctx.Context.Cluster), User: clip(ctx.Context.AuthInfo)}
	d.Facts.Context = c
	for i := range cfg.Clusters {
		if cfg.Clusters[i].Name == ctx.Context.Cluster {
			d.cluster = &cfg.Clusters[i].Cluster
			break
		}
	}
	for i := range cfg.AuthInfos {
		if cfg.AuthInfos[i].Name == ctx.Context.AuthInfo {
			d.user = &cfg.AuthInfos[i].AuthInfo
			break
		}
	}
	if d.cluster != nil {
		c.ClusterFound = true
		c.Server = serverFacts(d.cluster.Server)
		c.CAData = len(d.cluster.CertificateAuthorityData) > 0
		c.InsecureSkipTLSVerify = d.cluster.InsecureSkipTLSVerify
		c.TLSServerName = clip(d.cluster.TLSServerName)
	}
	if d.user != nil {
		c.UserFound = true
		c.Credentials = Credentials{
			Token:                 d.user.Token != "",
			ClientCertificateData: len(d.user.ClientCertificateData) > 0,
			ClientKeyData:         len(d.user.ClientKeyData) > 0,
		}
	}
}

// serverFacts are the facts of a server URL. A password in it is a
// credential: the URL in the facts (and so in the decision log) is without
// its user information, and a URL that cannot be read is not repeated.
func serverFacts(server string) Server {
	u, err := url.Parse(server)
	if err != nil {
		return Server{Error: urlError(err)}
	}
	s := Server{Scheme: clip(u.Scheme), Host: clip(u.Host), UserInfo: u.User != nil}
	u.User = nil
	s.URL = clip(u.String())
	return s
}

// RESTConfig is the client configuration of the context in use, built from
// the allow-listed data alone: whatever else the document says (a path, a
// command, a proxy, an impersonation) cannot take effect, whatever the rule
// said. insecure is whether the rule allowed insecure-skip-tls-verify.
func (d *Document) RESTConfig(insecure bool) (*rest.Config, error) {
	if d.cluster == nil || d.user == nil {
		return nil, fmt.Errorf("the kubeconfig has no complete context in use")
	}
	cfg := &rest.Config{
		Host:        d.cluster.Server,
		BearerToken: d.user.Token,
		TLSClientConfig: rest.TLSClientConfig{
			ServerName: d.cluster.TLSServerName,
			CAData:     d.cluster.CertificateAuthorityData,
			CertData:   d.user.ClientCertificateData,
			KeyData:    d.user.ClientKeyData,
		},
	}
	if insecure && d.cluster.InsecureSkipTLSVerify {
		cfg.Insecure = true
		// client-go refuses a CA with Insecure.
		cfg.CAData = nil
	}
	return cfg, nil
}

// walker lists the keys of the document by path, against the schema of the
// kubeconfig types.
type walker struct {
	facts *Facts
}

var (
	rawExtension = reflect.TypeFor[runtime.RawExtension]()
	plainKey     = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// walk looks at value, of type t, found at path (generic: without indices).
// It descends into structs and lists of structs; a key the struct does not
// have, with exactly that name, is unknown and not descended into.
func (w *walker) walk(value any, t reflect.Type, path, generic string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch v := value.(type) {
	case map[string]any:
		if t.Kind() != reflect.Struct || t == rawExtension {
			return
		}
		for _, key := range sortedKeys(v) {
			p, g := join(path, key), join(generic, key)
			w.add(p, g)
			sf, ok := fieldByJSONName(t, key)
			if !ok {
				// Held to MaxFields as Fields is, in the same order, so an
				// unknown field listed in Fields is listed here (review 28
				// L3: 29,608 of them took 213 ms to decide).
				if len(w.facts.UnknownFields) < MaxFields {
					w.facts.UnknownFields = append(w.facts.UnknownFields, p)
				}
				continue
			}
			w.walk(v[key], sf.Type, p, g)
		}
	case []any:
		if t.Kind() != reflect.Slice {
			return
		}
		for i, item := range v {
			w.walk(item, t.Elem(), path+"["+strconv.Itoa(i)+"]", generic+"[]")
		}
	}
}

func (w *walker) add(path, generic string) {
	w.facts.FieldCount++
	if len(w.facts.Fields) < MaxFields {
		w.facts.Fields = append(w.facts.Fields, Field{Path: path, Field: generic})
	}
}

// join appends a key to a path; a key that is not a plain name (it is the
// tenant's) is quoted, escaped and cut.
func join(path, key string) string {
	if !plainKey.MatchString(key) {
		key = "[" + strconv.QuoteToASCII(servingcert.Clip(key, 64)) + "]"
		return path + key
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func fieldByJSONName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		sf := t.Field(i)
		tag, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if tag == name && tag != "" && tag != "-" {
			return sf, true
		}
	}
	return reflect.StructField{}, false
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	// Sorted, so that the facts of a document are always the same.
	slices.Sort(keys)
	return keys
}

func clip(s string) string {
	return servingcert.Clip(s, maxText)
}

// The parsers' words about a document they cannot read quote it: YAML's a
// value of the wrong tag or a key that is no string (sigs.k8s.io/yaml
// prints the value under a null key whole, a token or a private key a
// templating left keyless), url's a part of the address (a password
// after its colon). The facts are the condition's message, a Warning
// Event's and the decision log's, each readable by more people than the
// Secret: an error is said in the parser's words only when they are a
// shape that quotes nothing of the document, otherwise in a fixed one
// (review 236 F1).
var (
	// yamlSyntax is a syntax error of go-yaml's scanner or parser: a fixed
	// problem, at a line, quoting at most single characters ("did not
	// find expected ',' or '}'").
	yamlSyntax = regexp.MustCompile(`^yaml: (line [0-9]+: )?([a-zA-Z ,]|'[^']')+$`)
	// jsonType is encoding/json's value of the wrong type, named by its
	// kind and the schema path of keys (which the facts list anyway).
	jsonType = regexp.MustCompile(`^json: cannot unmarshal [a-z]+ into Go struct field [A-Za-z0-9._-]+ of type [A-Za-z0-9.*\[\]]+$`)
	// badBase64 is encoding/base64's, at a position.
	badBase64 = regexp.MustCompile(`^illegal base64 data at input byte [0-9]+$`)
	// errorLines are the line numbers go-yaml's errors give, each at the
	// start of the error or of one of its lines.
	errorLines = regexp.MustCompile(`(?m)(?:^yaml: |^\s+)line ([0-9]+):`)
	// urlWords is url's error once its quoted parts are taken out.
	urlWords = regexp.MustCompile(`^[a-zA-Z /:.,-]+$`)
	quoted   = regexp.MustCompile(` ?"(?:[^"\\]|\\.)*"`)
)

// readError says why a document could not be read, quoting nothing of it.
func readError(err error) string {
	msg := err.Error()
	switch {
	case len(msg) <= maxText && (yamlSyntax.MatchString(msg) || jsonType.MatchString(msg) || badBase64.MatchString(msg)):
		return msg
	case strings.Contains(msg, "already set in map"):
		return "a key is given twice" + atLines(msg)
	case strings.HasPrefix(msg, "unsupported map key"), strings.HasPrefix(msg, "yaml: invalid map key"):
		return "a mapping key is not a string (null, binary, a list or a mapping)" + atLines(msg)
	case strings.HasPrefix(msg, "yaml: cannot decode"):
		return "a value is not of the type its tag names" + atLines(msg)
	}
	return "not YAML or JSON that can be read" + atLines(msg) + " (the parser's words are not repeated: they may quote the document)"
}

// atLines is " at line N, M" for the lines msg names, or "".
func atLines(msg string) string {
	var lines []string
	for _, m := range errorLines.FindAllStringSubmatch(msg, 10) {
		lines = append(lines, m[1])
	}
	if len(lines) == 0 {
		return ""
	}
	return " at line " + strings.Join(lines, ", ")
}

// urlError is url.Parse's error without the parts of the address it
// quotes.
func urlError(err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	words := strings.TrimSpace(quoted.ReplaceAllString(err.Error(), ""))
	if len(words) > maxText || !urlWords.MatchString(words) {
		return "the server URL cannot be parsed"
	}
	return words
}
