package kubeconfig

import "testing"

// A list (or a watch's error answer) is bounded as one; anything else as one
// object's answer.
func TestIsCollection(t *testing.T) {
	for path, want := range map[string]bool{
		"/apis/certificates.k8s.io/v1/certificatesigningrequests":  true,
		"/apis/certificates.k8s.io/v1/certificatesigningrequests/": true,
		"/api/v1/nodes":                  true,
		"/api/v1/namespaces/a/pods":      true,
		"/apis/g/v1/namespaces/a/things": true,
		"/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-1":          false,
		"/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-1/approval": false,
		"/api/v1/namespaces/a":          false,
		"/api/v1/namespaces/a/pods/p":   false,
		"/apis/authorization.k8s.io/v1": false,
		"/version":                      false,
		"/api":                          false,
		"/apis":                         false,
		"/":                             false,
		"":                              false,
	} {
		if got := isCollection(path); got != want {
			t.Errorf("isCollection(%q) = %v, want %v", path, got, want)
		}
	}
}
