{{/*
Names are fixed, as in manifests/: the APIServices and ClusterRoles are cluster-wide, so a cluster
holds one metricscale, whatever the release is called.
*/}}

{{/* The namespace of every namespaced object. */}}
{{- define "metricscale.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end }}

{{/* The labels of every object: those of manifests/kustomization.yaml, Helm's, customLabels. */}}
{{- define "metricscale.commonLabels" -}}
{{- $labels := dict
      "app.kubernetes.io/part-of" "metricscale"
      "app.kubernetes.io/version" .Chart.AppVersion
      "app.kubernetes.io/managed-by" .Release.Service
      "app.kubernetes.io/instance" .Release.Name
      "helm.sh/chart" (printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_") -}}
{{- toYaml (merge $labels (.Values.customLabels | default dict)) -}}
{{- end }}

{{/*
metadata of an object. Takes a dict: root (the top context), name, app (the
app.kubernetes.io/name label, optional), component (optional), labels and annotations (optional
dicts), namespace ("" for a cluster-scoped object, "-" for the chart's namespace, else that one).
*/}}
{{- define "metricscale.metadata" -}}
{{- $root := .root -}}
{{- $namespace := .namespace | default "" -}}
name: {{ .name }}
{{- if eq $namespace "-" }}
namespace: {{ include "metricscale.namespace" $root }}
{{- else if $namespace }}
namespace: {{ $namespace }}
{{- end }}
{{- $labels := dict -}}
{{- with .app }}{{ $_ := set $labels "app.kubernetes.io/name" . }}{{ end -}}
{{- with .component }}{{ $_ := set $labels "app.kubernetes.io/component" . }}{{ end -}}
{{- $labels = merge $labels (.labels | default dict) (include "metricscale.commonLabels" $root | fromYaml) }}
labels:
  {{- toYaml $labels | nindent 2 }}
{{- $annotations := merge (dict) (.annotations | default dict) ($root.Values.customAnnotations | default dict) }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The labels of a pod template: the Deployment's, and podLabels. */}}
{{- define "metricscale.podLabels" -}}
{{- $labels := dict "app.kubernetes.io/name" .app "app.kubernetes.io/component" .component -}}
{{- toYaml (merge $labels (.podLabels | default dict) (include "metricscale.commonLabels" .root | fromYaml)) -}}
{{- end }}

{{- define "metricscale.adapterServiceAccount" -}}
{{- default "metricscale-adapter" .Values.serviceAccount.name -}}
{{- end }}

{{- define "metricscale.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end }}

{{/*
The certificate mode: certificates.mode, or prometheus-adapter's switches tls.enable and
certManager.enabled, which choose their mode over the default (self-managed).
*/}}
{{- define "metricscale.certificatesMode" -}}
{{- $mode := .Values.certificates.mode -}}
{{- if not (has $mode (list "self-managed" "tls" "cert-manager")) -}}
{{- fail (printf "certificates.mode is %q: choose self-managed, tls or cert-manager" $mode) -}}
{{- end -}}
{{- if and .Values.tls.enable .Values.certManager.enabled -}}
{{- fail "tls.enable and certManager.enabled are both true: choose one way to get the serving certificate" -}}
{{- end -}}
{{- if .Values.tls.enable -}}
{{- if not (has $mode (list "self-managed" "tls")) -}}
{{- fail (printf "tls.enable is true but certificates.mode is %s: choose one" $mode) -}}
{{- end -}}
{{- $mode = "tls" -}}
{{- else if .Values.certManager.enabled -}}
{{- if not (has $mode (list "self-managed" "cert-manager")) -}}
{{- fail (printf "certManager.enabled is true but certificates.mode is %s: choose one" $mode) -}}
{{- end -}}
{{- $mode = "cert-manager" -}}
{{- end -}}
{{- $mode -}}
{{- end }}

{{/* The adapter's PriorityClass: priorityClassName, else the critical one when it serves
metrics.k8s.io (as metrics-server: every cpu and memory HPA of the cluster reads it). */}}
{{- define "metricscale.adapterPriorityClass" -}}
{{- if .Values.priorityClassName -}}
{{- .Values.priorityClassName -}}
{{- else if .Values.resourceMetrics.enabled -}}
system-cluster-critical
{{- end -}}
{{- end }}

{{/* The Prometheus URL the adapter is given. */}}
{{- define "metricscale.prometheusURL" -}}
{{- tpl .Values.prometheus.url . -}}
{{- with .Values.prometheus.port }}:{{ . }}{{ end -}}
{{- .Values.prometheus.path -}}
{{- end }}

{{/* A PodDisruptionBudget's minAvailable or maxUnavailable, not both. */}}
{{- define "metricscale.budget" -}}
{{- $min := .budget.minAvailable -}}
{{- $max := .budget.maxUnavailable -}}
{{- if and (not (kindIs "invalid" $min)) (not (kindIs "invalid" $max)) -}}
{{- fail (printf "%s: set minAvailable or maxUnavailable, not both" .what) -}}
{{- end -}}
{{- if not (kindIs "invalid" $min) }}
minAvailable: {{ $min }}
{{- else if not (kindIs "invalid" $max) }}
maxUnavailable: {{ $max }}
{{- else -}}
{{- fail (printf "%s: set minAvailable or maxUnavailable" .what) -}}
{{- end -}}
{{- end }}
