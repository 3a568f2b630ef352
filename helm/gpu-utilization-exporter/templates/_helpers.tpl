{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "gpu-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's resources. */}}
{{- define "gpu-exporter.fullname" -}}
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

{{/* Labels the selectors use. */}}
{{- define "gpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "gpu-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpu-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: exporter
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpu-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-exporter.webConfigSecret" -}}
{{- default (printf "%s-web-config" (include "gpu-exporter.fullname" .)) .Values.webConfig.existingSecret }}
{{- end }}

{{/* The selector labels of the monitors and the PrometheusRule: monitor.release as release=<it>
(kube-prometheus-stack's default serviceMonitorSelector, podMonitorSelector and ruleSelector), then
the given extra labels. Call with (list $ extraLabels). */}}
{{- define "gpu-exporter.selectedLabels" -}}
{{- $root := index . 0 }}
{{- include "gpu-exporter.labels" $root }}
{{- $extra := deepCopy (index . 1) }}
{{- with $root.Values.monitor.release }}
{{- $_ := set $extra "release" . }}
{{- end }}
{{- with $extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The name of the cluster label: `cluster_label` of thresholds.yml (files/thresholds.yml is a
symlink to exporter/gpu_exporter/thresholds.yml, the one config of rules and dashboards). */}}
{{- define "gpu-exporter.clusterLabel" -}}
{{- $name := get (fromYaml (.Files.Get "files/thresholds.yml")) "cluster_label" }}
{{- if not $name }}
{{- fail "files/thresholds.yml (exporter/gpu_exporter/thresholds.yml) has no cluster_label" }}
{{- end }}
{{- $name }}
{{- end }}

{{/* Relabeling shared by the ServiceMonitor and the PodMonitor (see values.yaml: monitor). */}}
{{- define "gpu-exporter.monitorRelabelings" -}}
- action: replace
  targetLabel: job
  replacement: {{ .Values.monitor.jobName }}
{{- with .Values.monitor.cluster }}
- action: replace
  targetLabel: {{ include "gpu-exporter.clusterLabel" $ }}
  replacement: {{ . | quote }}
{{- end }}
- action: replace
  sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
- action: replace
  sourceLabels: [__meta_kubernetes_namespace]
  targetLabel: exporter_namespace
- action: replace
  sourceLabels: [__meta_kubernetes_pod_name]
  targetLabel: exporter_pod
- action: labeldrop
  regex: (pod|namespace|container)
{{- with .Values.monitor.relabelings }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Scheme, TLS and basic auth of a monitor endpoint. */}}
{{- define "gpu-exporter.monitorEndpoint" -}}
interval: {{ .Values.monitor.interval }}
scrapeTimeout: {{ .Values.monitor.scrapeTimeout }}
path: /metrics
scheme: {{ .Values.webConfig.scheme | lower }}
{{- if and .Values.webConfig.enabled (eq .Values.webConfig.scheme "HTTPS") }}
tlsConfig:
  {{- toYaml .Values.webConfig.monitorTLSConfig | nindent 2 }}
{{- end }}
{{- with .Values.webConfig.monitorBasicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  {{- include "gpu-exporter.monitorRelabelings" . | nindent 2 }}
{{- with .Values.monitor.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The ingest token Secret: the given one, or the one the chart creates. */}}
{{- define "gpu-exporter.ingestTokenSecret" -}}
{{- default (printf "%s-ingest-token" (include "gpu-exporter.fullname" .)) .Values.ingest.token.existingSecret }}
{{- end }}
