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

{{/* A string setting of thresholds.yml; (list $ key). */}}
{{- define "gpu-exporter.threshold" -}}
{{- $root := index . 0 }}
{{- $value := get (fromYaml ($root.Files.Get "files/thresholds.yml")) (index . 1) }}
{{- if not $value }}
{{- fail (printf "files/thresholds.yml (exporter/gpu_exporter/thresholds.yml) has no %s" (index . 1)) }}
{{- end }}
{{- $value }}
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

{{/* --- prometheus/alertmanager.yml -> AlertmanagerConfig (templates/alertmanagerconfig.yaml) --- */}}

{{/* The Secret with the receivers' secrets: one key per file under /etc/alertmanager/secrets/. */}}
{{- define "gpu-exporter.alertmanagerSecret" -}}
{{- .Values.alertmanagerConfig.secretName | default (printf "%s-alertmanager" (include "gpu-exporter.fullname" .)) }}
{{- end }}

{{/* An Alertmanager config key in the CRD's camelCase: send_resolved -> sendResolved, with the
CRD's own spelling of initialisms (api_url -> apiURL, require_tls -> requireTLS). */}}
{{- define "gpu-exporter.amKey" -}}
{{- $special := dict "api_url" "apiURL" "require_tls" "requireTLS" "tls_config" "tlsConfig" "source_matchers" "sourceMatch" "target_matchers" "targetMatch" }}
{{- get $special . | default (camelcase . | untitle) }}
{{- end }}

{{/* Matcher strings (name="v", name=~"re", name!="v", name!~"re") as CRD matchers, a YAML list. */}}
{{- define "gpu-exporter.amMatchers" -}}
{{- $pattern := `^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"\\]*)"\s*$` }}
{{- $out := list }}
{{- range . }}
{{- if not (regexMatch $pattern .) }}
{{- fail (printf "files/alertmanager.yml: matcher %q is not of the form name<op>\"value\" (without escapes)" .) }}
{{- end }}
{{- $out = append $out (dict "name" (regexReplaceAll $pattern . "${1}") "matchType" (regexReplaceAll $pattern . "${2}") "value" (regexReplaceAll $pattern . "${3}")) }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* Quote the match types = and =~ in YAML text: a bare `=` is YAML 1.1's value tag, which some
parsers (PyYAML) refuse; `!=` and `!~` are quoted by toYaml already. */}}
{{- define "gpu-exporter.amQuote" -}}
{{- regexReplaceAll "(?m)(matchType: )(=~?)$" . "${1}\"${2}\"" }}
{{- end }}

{{/* One route of the tree, recursively; (list route ctx). */}}
{{- define "gpu-exporter.amRoute" -}}
{{- $in := index . 0 }}
{{- $ctx := index . 1 }}
{{- $out := dict }}
{{- range $key, $value := $in }}
{{- if eq $key "matchers" }}
{{- $_ := set $out "matchers" (include "gpu-exporter.amMatchers" $value | fromYamlArray) }}
{{- else if eq $key "routes" }}
{{- $routes := list }}
{{- range $value }}
{{- $routes = append $routes (include "gpu-exporter.amRoute" (list . $ctx) | fromYaml) }}
{{- end }}
{{- if $routes }}
{{- $_ := set $out "routes" $routes }}
{{- end }}
{{- else if has $key (list "receiver" "group_by" "group_wait" "group_interval" "repeat_interval" "continue") }}
{{- $_ := set $out (include "gpu-exporter.amKey" $key) $value }}
{{- else }}
{{- fail (printf "files/alertmanager.yml: route key %s has no AlertmanagerConfig translation here" $key) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* Every receiver a route tree names (the route's and its routes', recursively), a YAML list. */}}
{{- define "gpu-exporter.amRouteReceivers" -}}
{{- $names := list }}
{{- with .receiver }}{{ $names = append $names . }}{{ end }}
{{- range .routes }}
{{- $names = concat $names (include "gpu-exporter.amRouteReceivers" . | fromYamlArray) }}
{{- end }}
{{- toYaml $names }}
{{- end }}

{{/* A receiver config (or a part of one), recursively; (list config ctx). A `<key>_file` setting
becomes `<key>` from the Secret, key = the file's name; empty settings are left out. */}}
{{- define "gpu-exporter.amObject" -}}
{{- $in := index . 0 }}
{{- $ctx := index . 1 }}
{{- $out := dict }}
{{- range $key, $value := $in }}
{{- if kindIs "invalid" $value }}
{{- else if hasSuffix "_file" $key }}
{{- $_ := set $out (include "gpu-exporter.amKey" (trimSuffix "_file" $key)) (dict "name" $ctx.secret "key" (base $value)) }}
{{- else if kindIs "map" $value }}
{{- $_ := set $out (include "gpu-exporter.amKey" $key) (include "gpu-exporter.amObject" (list $value $ctx) | fromYaml) }}
{{- else }}
{{- $_ := set $out (include "gpu-exporter.amKey" $key) $value }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}
