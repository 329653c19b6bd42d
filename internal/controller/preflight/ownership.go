// Package preflight settles, before the controller's reconcilers start, what depends on the
// cluster: that no other controller serves prewarm's API groups, and whether the API server
// gives GPU pods the tolerations of their extended resources.
package preflight

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
)

// HyperPod's inference operator serves the same API group and kinds as prewarm, in the same
// namespace: two controllers on one cluster would both reconcile every InferenceEndpointConfig
// and JumpStartModel, each rewriting the other's Deployments and status. The controller
// refuses to start beside it.

// hyperPodControllerLabel is the label of the HyperPod inference operator's controller
// Deployment (its chart's namePrefix, hyperpod-inference-operator).
const hyperPodControllerLabel = "control-plane=hyperpod-inference-operator-controller-manager"

// prewarmCRDs are the CRDs of the compatibility group that prewarm serves.
var prewarmCRDs = []string{
	"inferenceendpointconfigs.inference.sagemaker.aws.amazon.com",
	"jumpstartmodels.inference.sagemaker.aws.amazon.com",
	"modeldatacacheconfigs.inference.sagemaker.aws.amazon.com",
	"inferenceimagecaches.inference.sagemaker.aws.amazon.com",
	"modelweightscacheconfigs.inference.sagemaker.aws.amazon.com",
	"modelimagecaches.inference.sagemaker.aws.amazon.com",
	"sagemakerendpointregistrations.inference.sagemaker.aws.amazon.com",
	"inferencegatewayconfigs.inference.sagemaker.aws.amazon.com",
}

// The controller checks, at start, who installed the API it serves (those CRDs only, by name)
// and who else runs.
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,resourceNames=inferenceendpointconfigs.inference.sagemaker.aws.amazon.com;jumpstartmodels.inference.sagemaker.aws.amazon.com;modeldatacacheconfigs.inference.sagemaker.aws.amazon.com;inferenceimagecaches.inference.sagemaker.aws.amazon.com;modelweightscacheconfigs.inference.sagemaker.aws.amazon.com;modelimagecaches.inference.sagemaker.aws.amazon.com;sagemakerendpointregistrations.inference.sagemaker.aws.amazon.com;inferencegatewayconfigs.inference.sagemaker.aws.amazon.com,verbs=get

// CheckAPIOwnership returns an error saying what to do when the API group is another operator's
// on this cluster: a CRD prewarm serves that prewarm did not install (it lacks
// inferencev1.APILabel), or the HyperPod inference operator's controller running.
func CheckAPIOwnership(ctx context.Context, c client.Client) error {
	for _, name := range prewarmCRDs {
		crd := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"}}
		err := c.Get(ctx, types.NamespacedName{Name: name}, crd)
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("the CRD %s is not installed: install prewarm's CRDs (the chart's crds/, or config/crd/bases) before the controller", name)
		case err != nil:
			return fmt.Errorf("reading the CRD %s: %w", name, err)
		case crd.Labels[inferencev1.APILabel] != "true":
			return fmt.Errorf("the CRD %s was not installed by prewarm (it lacks the label %s=true; %s): another operator, most likely the SageMaker HyperPod inference operator, owns this API on this cluster, "+
				"and two controllers would fight over the same objects. Uninstall that operator and its CRDs, then install prewarm's (docs/operations.md, \"Running beside HyperPod\")",
				name, inferencev1.APILabel, installedBy(crd))
		}
	}
	deps := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DeploymentList"}}
	sel, err := metav1.ParseToLabelSelector(hyperPodControllerLabel)
	if err != nil {
		return err
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return err
	}
	if err := c.List(ctx, deps, client.MatchingLabelsSelector{Selector: s}); err != nil {
		return fmt.Errorf("looking for the HyperPod inference operator's controller: %w", err)
	}
	if len(deps.Items) > 0 {
		d := deps.Items[0]
		return fmt.Errorf("the SageMaker HyperPod inference operator runs on this cluster (Deployment %s/%s, label %s): it reconciles the same InferenceEndpointConfigs and JumpStartModels as prewarm, "+
			"and the two would fight over them. Run one of them: uninstall HyperPod's inference operator (helm uninstall, or remove the EKS add-on) before prewarm's controller starts (docs/operations.md, \"Running beside HyperPod\")",
			d.Namespace, d.Name, hyperPodControllerLabel)
	}
	return nil
}

// installedBy says what a CRD's metadata tells of who installed it.
func installedBy(crd *metav1.PartialObjectMetadata) string {
	var said []string
	if r := crd.Annotations["meta.helm.sh/release-name"]; r != "" {
		said = append(said, fmt.Sprintf("Helm release %s/%s", crd.Annotations["meta.helm.sh/release-namespace"], r))
	}
	if ca := crd.Annotations["cert-manager.io/inject-ca-from"]; ca != "" {
		said = append(said, "its conversion webhook's CA comes from "+ca)
	}
	var managers []string
	for _, f := range crd.ManagedFields {
		if !strings.Contains(strings.Join(managers, ","), f.Manager) {
			managers = append(managers, f.Manager)
		}
	}
	if len(managers) > 0 {
		said = append(said, "written by "+strings.Join(managers, ", "))
	}
	if len(said) == 0 {
		return "nothing says who installed it"
	}
	return strings.Join(said, "; ")
}
