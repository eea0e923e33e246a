{{/* Name of the operator's objects. */}}
{{- define "sandboxrun.operator" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
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
