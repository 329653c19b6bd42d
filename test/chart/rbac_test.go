package chart

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// controllerSA is the controller's ServiceAccount, in the release namespace.
const controllerSA = "prewarm-controller"

// controllerRoleRights are the rights the controller needs in the release namespace, and has
// there alone (a Role): its leader election Lease; the agents' Leases, watched to tell which
// agents are alive; the image caches' DaemonSets and their pods; the pull secrets it copies and
// the tokens it seals; the JumpStart catalog; the dry-run pod that asks how the API server
// admits pods; the witness's endpoint and its Service (the endpoint's owner). Each is "group
// resource verb name" (name * for any).
var controllerRoleRights = []string{
	" configmaps list *",
	" configmaps watch *",
	" pods create *",
	" pods list *",
	" pods watch *",
	" secrets create *",
	" secrets delete *",
	" secrets get *",
	" secrets list *",
	" secrets update *",
	" secrets watch *",
	" services get prewarm-witness",
	"apps daemonsets create *",
	"apps daemonsets delete *",
	"apps daemonsets list *",
	"apps daemonsets patch *",
	"apps daemonsets watch *",
	"coordination.k8s.io leases create *",
	"coordination.k8s.io leases get prewarm-controller.prewarm.io",
	"coordination.k8s.io leases list *",
	"coordination.k8s.io leases update prewarm-controller.prewarm.io",
	"coordination.k8s.io leases watch *",
	"discovery.k8s.io endpointslices create *",
	"discovery.k8s.io endpointslices delete prewarm-witness",
	"discovery.k8s.io endpointslices get prewarm-witness",
	"discovery.k8s.io endpointslices update prewarm-witness",
}

// notClusterWide are rights the controller must not hold in every namespace (or on every object
// of a cluster-scoped kind): "group resource verb name", name "" for a request naming no object
// or any object.
var notClusterWide = []string{
	// Leases: the cluster's node heartbeats (kube-node-lease) and control-plane leader leases
	// (kube-system) are no business of prewarm's.
	"coordination.k8s.io leases get ", "coordination.k8s.io leases list ", "coordination.k8s.io leases update ",
	"coordination.k8s.io leases create ", "coordination.k8s.io leases delete ", "coordination.k8s.io leases patch ",
	// DaemonSets: it makes them only for image caches, in its own namespace.
	"apps daemonsets get ", "apps daemonsets list ", "apps daemonsets create ", "apps daemonsets update ",
	"apps daemonsets patch ", "apps daemonsets delete ",
	// ConfigMaps: only its catalog. Pods: it lists a cache's namespace's pods on a node, but
	// watches and creates only its own.
	" configmaps get ", " configmaps list ", " configmaps watch ",
	" pods get ", " pods watch ", " pods create ", " pods delete ",
	// Tenants' Secrets: one by one, by name, never listed or watched, never written.
	" secrets list ", " secrets watch ", " secrets create ", " secrets update ", " secrets delete ",
	// Namespaces: read, never made.
	" namespaces create ",
	// Tenants' Deployments and Services: created and patched, never replaced or deleted (the
	// garbage collector deletes them with their parent).
	"apps deployments update ", "apps deployments delete ", " services update ", " services delete ",
	// CRDs: only its own API's, by name.
	"apiextensions.k8s.io customresourcedefinitions get ", "apiextensions.k8s.io customresourcedefinitions list ",
	"apiextensions.k8s.io customresourcedefinitions get certificates.cert-manager.io",
}

// The controller's Lease and DaemonSet rights, and the others it needs only in its own
// namespace, are a Role in the release namespace, whatever it is called, bound to its
// ServiceAccount there; no ClusterRole bound to it grants them anywhere.
func TestControllerRBACKeepsToTheReleaseNamespace(t *testing.T) {
	for _, ns := range []string{namespace, "ml-platform"} {
		t.Run(ns, func(t *testing.T) {
			rbac := controllerRBAC(t, renderIn(t, ns))
			if len(rbac.clusterRules) == 0 {
				t.Fatal("no ClusterRole is bound to the controller's ServiceAccount")
			}
			for _, right := range notClusterWide {
				group, resource, verb, name := splitRight(right)
				if grants(rbac.clusterRules, group, resource, verb, name) {
					t.Errorf("a ClusterRole grants the controller %s on %s/%s %q cluster-wide", verb, group, resource, name)
				}
			}
			if diff := cmp.Diff(controllerRoleRights, flatten(rbac.roleRules[ns])); diff != "" {
				t.Errorf("the controller's rights in the release namespace %s (-want +got):\n%s", ns, diff)
			}
			for other, rules := range rbac.roleRules {
				if other != ns {
					t.Errorf("a Role in namespace %s, not the release's (%s), is bound to the controller: %v", other, ns, flatten(rules))
				}
			}
		})
	}
}

// boundRBAC are the rules bound to the controller's ServiceAccount: its ClusterRoles', and its
// Roles' by namespace.
type boundRBAC struct {
	clusterRules []rbacv1.PolicyRule
	roleRules    map[string][]rbacv1.PolicyRule
}

// controllerRBAC returns the rules the rendered objects bind to the controller's ServiceAccount
// in the release namespace; a binding to a role that is not rendered fails the test.
func controllerRBAC(t *testing.T, objs []*unstructured.Unstructured) boundRBAC {
	t.Helper()
	ns := ""
	for _, u := range objs {
		if u.GetKind() == "ServiceAccount" && u.GetName() == controllerSA {
			ns = u.GetNamespace()
		}
	}
	if ns == "" {
		t.Fatalf("no ServiceAccount %s rendered", controllerSA)
	}
	roles := map[string]rbacv1.ClusterRole{} // "Kind namespace/name"
	for _, u := range objs {
		if u.GetKind() == "Role" || u.GetKind() == "ClusterRole" {
			var r rbacv1.ClusterRole // a Role's fields are a ClusterRole's, but for aggregation
			convert(t, u, &r)
			roles[key(u)] = r
		}
	}
	out := boundRBAC{roleRules: map[string][]rbacv1.PolicyRule{}}
	for _, u := range objs {
		if u.GetKind() != "RoleBinding" && u.GetKind() != "ClusterRoleBinding" {
			continue
		}
		var b rbacv1.RoleBinding
		convert(t, u, &b)
		if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == controllerSA && s.Namespace == ns
		}) {
			continue
		}
		roleNS := ""
		if b.RoleRef.Kind == "Role" {
			roleNS = u.GetNamespace()
		}
		role, ok := roles[b.RoleRef.Kind+" "+roleNS+"/"+b.RoleRef.Name]
		if !ok {
			t.Fatalf("%s binds %s %s, which the chart does not render", key(u), b.RoleRef.Kind, b.RoleRef.Name)
		}
		if role.AggregationRule != nil {
			t.Fatalf("%s binds the aggregated %s %s: this test cannot tell its rules", key(u), b.RoleRef.Kind, b.RoleRef.Name)
		}
		switch {
		case u.GetKind() == "ClusterRoleBinding":
			out.clusterRules = append(out.clusterRules, role.Rules...)
		default: // a RoleBinding grants its role's rules in its own namespace only
			out.roleRules[u.GetNamespace()] = append(out.roleRules[u.GetNamespace()], role.Rules...)
		}
	}
	return out
}

func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s: %v", key(u), err)
	}
}

// grants reports whether rules allow verb on resource of group for the object named name; an
// empty name is a request that names no object (a list) or one that may name any.
func grants(rules []rbacv1.PolicyRule, group, resource, verb, name string) bool {
	has := func(list []string, v string) bool {
		return slices.Contains(list, v) || slices.Contains(list, rbacv1.ResourceAll)
	}
	for _, r := range rules {
		if has(r.APIGroups, group) && has(r.Resources, resource) && has(r.Verbs, verb) &&
			(len(r.ResourceNames) == 0 || (name != "" && slices.Contains(r.ResourceNames, name))) {
			return true
		}
	}
	return false
}

// flatten lists every right rules grant, as "group resource verb name" (name * for any),
// sorted and without repeats.
func flatten(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{"*"}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					for _, n := range names {
						out = append(out, fmt.Sprintf("%s %s %s %s", g, res, v, n))
					}
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// splitRight splits "group resource verb name" (the group or the name may be empty).
func splitRight(s string) (group, resource, verb, name string) {
	f := strings.Split(s, " ")
	return f[0], f[1], f[2], f[3]
}
