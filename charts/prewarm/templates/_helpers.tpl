{{/* An image of prewarm's: <registry>/<name> unless its repository is set, tagged with the chart's appVersion unless image.tag is set. */}}
{{- define "prewarm.image" -}}
{{- $img := index .root.Values.image .name -}}
{{- $repo := $img.repository | default (printf "%s/%s" (trimSuffix "/" .root.Values.image.registry) .name) -}}
{{ $repo }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
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
