// Package v1alpha1 holds the ichor.dev/v1alpha1 API: the Talos clusters and
// machines Ichor manages and the short-lived credentials it issues for them.
//
// The CRD manifests in deploy/crds and zz_generated.deepcopy.go are generated
// from the markers in this package by tools/controller-gen/generate.sh; edit the
// Go types and regenerate, never the YAML.
//
// +kubebuilder:object:generate=true
// +groupName=ichor.dev
package v1alpha1

//go:generate ../../tools/controller-gen/generate.sh

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "ichor.dev", Version: "v1alpha1"}

	// SchemeBuilder adds the kinds of this package to a scheme; each kind
	// registers itself in an init function beside its type. It is
	// apimachinery's builder, so the API package depends on nothing else.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds every kind of this package to a scheme; call it once
	// on the manager's scheme (and on a test's) before using a client.
	AddToScheme = SchemeBuilder.AddToScheme
)

// knownTypes are the kinds registered by the init functions beside them.
var knownTypes []runtime.Object

func register(objects ...runtime.Object) {
	knownTypes = append(knownTypes, objects...)
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, knownTypes...)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
