{{/* Name of the operator's objects. */}}
{{- define "sandboxrun.operator" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* An image's reference, from (list IMAGE $): <registry>/<repository>:<tag>, the registry
global.imageRegistry unless the image names one, the tag the chart's appVersion unless given;
empty when the image has no repository. */}}
{{- define "sandboxrun.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- if $image.repository -}}
{{- $registry := $image.registry | default ($root.Values.global | default dict).imageRegistry -}}
{{- $tag := $image.tag | default $root.Chart.AppVersion | toString -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) $image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $tag -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels every object of the chart carries. */}}
{{- define "sandboxrun.labels" -}}
app.kubernetes.io/name: sandboxrun
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector of the operator Pods. */}}
{{- define "sandboxrun.operatorSelector" -}}
app.kubernetes.io/name: sandboxrun
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Name of the policy ConfigMap. */}}
{{- define "sandboxrun.policy" -}}
{{- printf "%s-policy" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the frontend's objects. */}}
{{- define "sandboxrun.frontend" -}}
{{- printf "%s-mcp" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector of the frontend Pods. */}}
{{- define "sandboxrun.frontendSelector" -}}
app.kubernetes.io/name: sandboxrun
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: frontend
{{- end -}}

{{/* Combinations of values that cannot work, refused before anything is applied. */}}
{{- define "sandboxrun.validate" -}}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElection) }}
{{- fail "operator.replicas > 1 needs operator.leaderElection=true: two operators without a Lease would both create sandbox Pods" }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.frontend.enabled) }}
{{- fail "ingress.enabled needs frontend.enabled=true: the Ingress routes to the frontend Service" }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
{{- fail "ingress.enabled needs at least one host in ingress.hosts (e.g. mcp.example.com)" }}
{{- end }}
{{- end -}}
