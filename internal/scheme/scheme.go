// Package scheme builds the runtime.Scheme every prewarm component uses: the built-in kinds,
// the compatibility API and prewarm's own API.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	inferencev1alpha1 "github.com/prewarm/prewarm/api/v1alpha1"
	"github.com/prewarm/prewarm/internal/keda"
)

// New returns a scheme with every kind prewarm reads or writes.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, inferencev1.AddToScheme, inferencev1alpha1.AddToScheme, prewarmv1alpha1.AddToScheme, keda.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err) // only a programming error can make registration fail
		}
	}
	return s
}
