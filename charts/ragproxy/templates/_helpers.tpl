{{/* Chart name, truncated to the 63 characters Kubernetes allows in a name. */}}
{{- define "ragproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart unless the release name already contains the chart name. */}}
{{- define "ragproxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ragproxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ragproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ragproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ragproxy.labels" -}}
helm.sh/chart: {{ include "ragproxy.chart" . }}
{{ include "ragproxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ragproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ragproxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ragproxy.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret holding tokens and keys: the user's existing one, or the chart's. */}}
{{- define "ragproxy.secretName" -}}
{{- default (include "ragproxy.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{/* Whether any secret value is configured (chart-made or existing). */}}
{{- define "ragproxy.hasSecret" -}}
{{- if or .Values.secrets.existingSecret .Values.secrets.adminToken .Values.secrets.qdrantApiKey .Values.secrets.embedderApiKey .Values.secrets.routingSaltSecret .Values.secrets.redisUrl .Values.secrets.llmApiKeys }}true{{ end }}
{{- end }}

{{/* Whether the admin API listens on a loopback address only. */}}
{{- define "ragproxy.adminIsLoopback" -}}
{{- $host := toString .Values.config.admin.host }}
{{- if or (eq $host "127.0.0.1") (eq $host "localhost") (eq $host "::1") }}true{{ end }}
{{- end }}

{{/*
config.upstreams.llm with secrets.llmApiKeys filled in by position, as JSON (RAGPROXY_UPSTREAMS__LLM).
*/}}
{{- define "ragproxy.llmUpstreamsWithKeys" -}}
{{- $keys := .Values.secrets.llmApiKeys }}
{{- $out := list }}
{{- range $i, $backend := .Values.config.upstreams.llm }}
{{- $copy := deepCopy $backend }}
{{- if and (lt $i (len $keys)) (index $keys $i) }}
{{- $_ := set $copy "api_key" (index $keys $i) }}
{{- end }}
{{- $out = append $out $copy }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* Refuse combinations that cannot work, with a message naming the values to change. */}}
{{- define "ragproxy.validate" -}}
{{- if and .Values.config.admin.enabled (not (include "ragproxy.adminIsLoopback" .)) (not .Values.secrets.adminToken) (not .Values.secrets.existingSecret) }}
{{- fail "config.admin.host is not loopback: set secrets.adminToken or secrets.existingSecret (key admin-token)" }}
{{- end }}
{{- if and (eq .Values.mode "gateway") (eq (toString .Values.config.server.host) "127.0.0.1") }}
{{- fail "mode gateway needs config.server.host: 0.0.0.0 (the Service cannot reach a loopback address)" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.adminService.enabled) }}
{{- fail "serviceMonitor.enabled needs adminService.enabled (metrics are served on the admin port)" }}
{{- end }}
{{- if and .Values.adminService.enabled (include "ragproxy.adminIsLoopback" .) }}
{{- fail "adminService.enabled needs config.admin.host: 0.0.0.0 (and an admin token)" }}
{{- end }}
{{- end }}
