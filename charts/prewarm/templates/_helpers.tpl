{{/* An image of prewarm's: <registry>/<name> unless its repository is set, by its digest when image.<name>.digest is set, else tagged with the chart's appVersion unless image.tag is set. */}}
{{- define "prewarm.image" -}}
{{- $img := index .root.Values.image .name -}}
{{- $repo := $img.repository | default (printf "%s/%s" (trimSuffix "/" .root.Values.image.registry) .name) -}}
{{- if $img.digest -}}
{{ $repo }}@{{ $img.digest }}
{{- else -}}
{{ $repo }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end -}}
{{- end }}
{{- define "prewarm.controllerImage" -}}
{{ include "prewarm.image" (dict "root" . "name" "controller") }}
{{- end }}
{{- define "prewarm.agentImage" -}}
{{ include "prewarm.image" (dict "root" . "name" "agent") }}
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "prewarm.labels" -}}
app.kubernetes.io/name: prewarm
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* Where a cache root (a path, or {path, nodePath, allowRootFilesystem}) is on the nodes. */}}
{{- define "prewarm.rootOnNode" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ .nodePath | default .path }}{{ end -}}
{{- end }}

{{/* The operator configuration, with the agent image, its pull secrets and the image cache's PriorityClass from the chart's values. */}}
{{- define "prewarm.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $ctl := get $cfg "controller" | default dict -}}
{{- if not (get $ctl "agentImage") -}}
{{- $_ := set $ctl "agentImage" (include "prewarm.agentImage" .) -}}
{{- end -}}
{{- if and .Values.image.pullSecrets (not (get $ctl "imagePullSecrets")) -}}
{{- $names := list -}}
{{- range .Values.image.pullSecrets }}{{ $names = append $names .name }}{{ end -}}
{{- $_ := set $ctl "imagePullSecrets" $names -}}
{{- end -}}
{{- if not (get $ctl "imageCachePriorityClass") -}}
{{- $_ := set $ctl "imageCachePriorityClass" .Values.priorityClass.imageCache.name -}}
{{- end -}}
{{- $_ := set $cfg "controller" $ctl -}}
{{- $_ := set $cfg "operatorNamespace" .Release.Namespace -}}
{{- $_ := set $cfg "apiVersion" "prewarm.io/v1alpha1" -}}
{{- $_ := set $cfg "kind" "OperatorConfiguration" -}}
{{ toYaml $cfg }}
{{- end }}

{{/* An integer value as Kubernetes reads one (values.yaml numbers are floats to Helm: 1000000 would print as 1e+06); a string (10%) as it is, quoted. */}}
{{- define "prewarm.int" -}}
{{- if kindIs "string" . }}{{ . | quote }}{{ else }}{{ int64 . }}{{ end -}}
{{- end }}

{{/* The pod template's metadata of a component (.component: controller or agent): its selector labels, the podLabels and podAnnotations of its values, the configuration's checksum. */}}
{{- define "prewarm.podMetadata" -}}
{{- $values := index .root.Values .component -}}
labels:
  {{- with omit $values.podLabels "app.kubernetes.io/name" "app.kubernetes.io/component" }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  app.kubernetes.io/name: prewarm
  app.kubernetes.io/component: {{ .component }}
annotations:
  {{- with omit $values.podAnnotations "prewarm.io/config-checksum" }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  prewarm.io/config-checksum: {{ include "prewarm.config" .root | sha256sum }}
{{- end }}

{{/* A monitor's scrape endpoint of a component (.component, .interval): its series get job="prewarm-<component>" (what the PrometheusRule's alerts select) and the pod's node; the controller's keep their own namespace label (the cache's), not the pod's. */}}
{{- define "prewarm.scrape" -}}
interval: {{ .interval }}
path: /metrics
{{- if eq .component "controller" }}
honorLabels: true
{{- end }}
relabelings:
  - targetLabel: job
    replacement: prewarm-{{ .component }}
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
{{- end }}

{{/* "true" when the agents read S3 files without a SHA-256 through the controller's witness (config.peers.witness). */}}
{{- define "prewarm.witnessed" -}}
{{- $p := .Values.config.peers -}}
{{- if and (not $p.disabled) (not ($p.witness | default dict).disabled) (ne ($p.trust | default "SourceDigests") "AllNodes") }}true{{ end -}}
{{- end }}
