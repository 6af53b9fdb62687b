package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// The bounds of what -f reads: a manifest is something a person or kubectl
// wrote, and a directory or a stream may hold anything, so each is read
// within bounds before it is decoded.
const (
	// maxManifestBytes is the most bytes read of one input (a file or
	// standard input): far above what kubectl prints for thousands of CSRs.
	maxManifestBytes = 32 << 20
	// maxManifestFiles is the most files read of a directory.
	maxManifestFiles = 1000
	// maxRequests is the most requests decided in one command.
	maxRequests = 10000
)

// manifestExtensions are the files of a directory that -f reads, as kubectl
// reads them.
var manifestExtensions = []string{".yaml", ".yml", ".json"}

// csrInputs are the requests that -f named. List is true when they are to be
// printed one JSON line each: several documents, a List, or a directory.
type csrInputs struct {
	csrs []*certificatesv1.CertificateSigningRequest
	list bool
}

// readCSRManifests reads every document of every -f value: a file, a
// directory (its .yaml, .yml and .json files, in name order, not its
// subdirectories), or standard input ("-"); YAML documents separated by
// "---" or a stream of JSON objects, through apimachinery's YAML-or-JSON
// decoder. A document is a certificates.k8s.io/v1 CertificateSigningRequest,
// or a List or CertificateSigningRequestList of them; anything else is
// refused, naming the document.
func readCSRManifests(stdin io.Reader, files []string, wrap pemWrap) (csrInputs, error) {
	var in csrInputs
	if n := slices.Index(files, "-"); n >= 0 && slices.Contains(files[n+1:], "-") {
		return in, usage.Errorf(`-f "-" (standard input) is given twice`)
	}
	in.list = len(files) > 1
	for _, file := range files {
		names, dir, err := manifestFiles(file)
		if err != nil {
			return in, err
		}
		in.list = in.list || dir || len(names) > 1
		for _, name := range names {
			if err := in.read(stdin, name, wrap); err != nil {
				return in, err
			}
		}
	}
	return in, nil
}

// manifestFiles are the files that one -f value names; dir says it named a
// directory.
func manifestFiles(file string) (names []string, dir bool, err error) {
	if file == "-" {
		return []string{file}, false, nil
	}
	st, err := os.Stat(file)
	if err != nil {
		// A file named on the command line that cannot be read is the
		// caller's to fix, like one that is not a CSR manifest.
		return nil, false, usage.Errorf("read %s: %w", file, err)
	}
	if !st.IsDir() {
		return []string{file}, false, nil
	}
	entries, err := os.ReadDir(file)
	if err != nil {
		return nil, true, usage.Errorf("read directory %s: %w", file, err)
	}
	for _, e := range entries {
		if !slices.Contains(manifestExtensions, strings.ToLower(filepath.Ext(e.Name()))) {
			continue
		}
		name := filepath.Join(file, e.Name())
		// A link to a file is read, as kubectl reads it; a link to
		// anything else (a directory, a device, a FIFO) is not, nor one
		// that leads nowhere.
		if e.Type()&os.ModeSymlink != 0 {
			if target, err := os.Stat(name); err == nil && target.Mode().IsRegular() {
				names = append(names, name)
			}
			continue
		}
		if e.Type().IsRegular() {
			names = append(names, name)
		}
	}
	switch {
	case len(names) > maxManifestFiles:
		return nil, true, usage.Errorf("directory %s holds %d manifest files, more than the %d read at once", file, len(names), maxManifestFiles)
	case len(names) == 0:
		// Named and empty, as an empty file is: nothing would be checked,
		// and a pipeline gating on it would pass.
		return nil, true, usage.Errorf("directory %s holds no manifest file (%s)", file, strings.Join(manifestExtensions, ", "))
	}
	return names, true, nil
}

// read reads one file, or standard input, and adds its requests.
func (in *csrInputs) read(stdin io.Reader, file string, wrap pemWrap) error {
	data, err := readBounded(stdin, file)
	if err != nil {
		return err
	}
	// Named in messages on one line: a directory's file names are anyone's
	// who could write there, and one with a newline would print a line of
	// its own.
	file = line(file)
	if block, _ := pem.Decode(data); block != nil {
		return pemError(file, block.Type, wrap)
	}
	var docs []json.RawMessage
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(yamlReadableStream(data)), 4096)
	for {
		var doc json.RawMessage
		err := d.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return usage.Errorf("%s document %d is neither YAML nor JSON: %v", file, len(docs)+1, err)
		}
		// An empty document (a leading "---", only comments) is none.
		if len(doc) == 0 || string(doc) == "null" {
			continue
		}
		docs = append(docs, doc)
		if len(docs) > maxRequests {
			return usage.Errorf("%s holds more than %d documents", file, maxRequests)
		}
	}
	if len(docs) == 0 {
		return usage.Errorf("%s holds no manifest", file)
	}
	in.list = in.list || len(docs) > 1
	for i, doc := range docs {
		what := file
		if len(docs) > 1 {
			what = fmt.Sprintf("%s document %d", file, i+1)
		}
		if err := in.add(doc, what); err != nil {
			return err
		}
	}
	return nil
}

// yamlReadableStream is data, when it is a stream of JSON documents (as
// kubectl get -o json writes), with the characters JSON keeps as they are and
// a YAML reader refuses written as JSON escapes (yamlReadableJSON): the
// documents are read as YAML, and a request named with a C1 control would
// otherwise be refused as "neither YAML nor JSON". Anything else is returned
// as it is.
func yamlReadableStream(data []byte) []byte {
	d := json.NewDecoder(bytes.NewReader(data))
	for {
		var doc json.RawMessage
		err := d.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return yamlReadableJSON(data)
		}
		if err != nil {
			return data
		}
	}
}

// readBounded reads a whole file, or standard input, of at most
// maxManifestBytes.
func readBounded(stdin io.Reader, file string) ([]byte, error) {
	r := stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, usage.Errorf("read %s: %w", file, err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxManifestBytes+1))
	switch {
	case err != nil && file == "-":
		return nil, fmt.Errorf("read standard input: %w", err)
	case err != nil:
		return nil, usage.Errorf("read %s: %w", file, err)
	case len(data) > maxManifestBytes:
		return nil, usage.Errorf("%s is larger than %d bytes, the most read of one input", file, maxManifestBytes)
	}
	return data, nil
}

// add adds the requests of one document: a request, or a list's items.
func (in *csrInputs) add(doc []byte, what string) error {
	var meta struct {
		metav1.TypeMeta
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(doc, &meta); err != nil {
		// Say what it is, not which Go type it did not fit.
		var wrongType *json.UnmarshalTypeError
		if errors.As(err, &wrongType) {
			if wrongType.Field == "" {
				return usage.Errorf("%s is a JSON %s, not a Kubernetes object", what, wrongType.Value)
			}
			return usage.Errorf("%s is not a Kubernetes object: its %s is a JSON %s", what, wrongType.Field, wrongType.Value)
		}
		return usage.Errorf("%s is not a Kubernetes object: %v", what, err)
	}
	csrList := metav1.TypeMeta{APIVersion: certificatesv1.SchemeGroupVersion.String(), Kind: "CertificateSigningRequestList"}
	switch meta.TypeMeta {
	case metav1.TypeMeta{APIVersion: "v1", Kind: "List"}, csrList:
		in.list = true
		for i, item := range meta.Items {
			csr, err := decodeCSR(item, fmt.Sprintf("%s item %d", what, i), meta.TypeMeta == csrList)
			if err != nil {
				return err
			}
			if err := in.append(csr); err != nil {
				return err
			}
		}
		return nil
	}
	csr, err := decodeCSR(doc, what, false)
	if err != nil {
		return err
	}
	return in.append(csr)
}

func (in *csrInputs) append(csr *certificatesv1.CertificateSigningRequest) error {
	if len(in.csrs) >= maxRequests {
		return usage.Errorf("more than %d requests: decide them in several commands", maxRequests)
	}
	in.csrs = append(in.csrs, csr)
	return nil
}

// addFileFlag adds -f, kubectl's flag for the manifests to read.
func addFileFlag(f *pflag.FlagSet, files *[]string) {
	f.StringArrayVarP(files, "file", "f", nil, `a CSR manifest, list, or file of several (YAML or JSON), or a directory of them; "-" for standard input (repeatable)`)
}

// fetchCSRs gets the named requests from the API server the kubeconfig flags
// name, with the rights of the person running the command, as kubectl get
// csr NAME would print them.
func fetchCSRs(ctx context.Context, k genericclioptions.RESTClientGetter, names []string) (csrInputs, error) {
	in := csrInputs{list: len(names) > 1}
	if len(names) > maxRequests {
		return in, usage.Errorf("%d names: at most %d requests are decided in one command", len(names), maxRequests)
	}
	c, _, _, err := kube.Client(k)
	if err != nil {
		return in, err
	}
	for _, name := range names {
		var csr certificatesv1.CertificateSigningRequest
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &csr); err != nil {
			return in, fmt.Errorf("get certificatesigningrequest %s: %w", name, err)
		}
		in.csrs = append(in.csrs, &csr)
	}
	return in, nil
}

// csrSource reads the requests from -f, or from the cluster by NAME.
func csrSource(ctx context.Context, s streams, k genericclioptions.RESTClientGetter, files, names []string, wrap pemWrap) (csrInputs, error) {
	switch {
	case len(files) > 0 && len(names) > 0:
		return csrInputs{}, usage.Errorf("give the requests' NAMEs or -f FILE, not both")
	case len(names) > 0:
		return fetchCSRs(ctx, k, names)
	case len(files) == 0:
		return csrInputs{}, usage.Errorf("give the requests' NAMEs (read from the cluster) or -f FILE (\"-\" reads standard input)")
	}
	return readCSRManifests(s.in, files, wrap)
}

// addClusterFlags adds kubectl's client flags, for a command that reads
// requests from the cluster by NAME.
func addClusterFlags(f *pflag.FlagSet) *genericclioptions.ConfigFlags {
	k := kube.NewConfigFlags()
	// A CSR is cluster-scoped: -n would mean nothing.
	k.Namespace = nil
	k.AddFlags(f)
	return k
}
