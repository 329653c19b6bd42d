{{/* The images, tagged with the chart's appVersion unless a tag is set. */}}
{{- define "prewarm.controllerImage" -}}
{{ .Values.image.controller.repository }}:{{ .Values.image.controller.tag | default .Chart.AppVersion }}
{{- end }}
{{- define "prewarm.agentImage" -}}
{{ .Values.image.agent.repository }}:{{ .Values.image.agent.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "prewarm.labels" -}}
app.kubernetes.io/name: prewarm
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* The operator configuration, with the agent image defaulted from image.agent. */}}
{{- define "prewarm.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $ctl := get $cfg "controller" | default dict -}}
{{- if not (get $ctl "agentImage") -}}
{{- $_ := set $ctl "agentImage" (include "prewarm.agentImage" .) -}}
{{- end -}}
{{- $_ := set $cfg "controller" $ctl -}}
{{- $_ := set $cfg "apiVersion" "prewarm.io/v1alpha1" -}}
{{- $_ := set $cfg "kind" "OperatorConfiguration" -}}
{{ toYaml $cfg }}
{{- end }}
