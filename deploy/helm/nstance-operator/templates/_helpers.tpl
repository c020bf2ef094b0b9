{{/*
Naming and labels shared by every template of the nstance-operator chart.
*/}}

{{/* Chart name, or nameOverride. */}}
{{- define "nstance-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Base name of the release's objects: fullnameOverride, else the release name when it already contains the
chart name (`helm install nstance-operator ...` gives "nstance-operator"), else "<release>-<chart>".
*/}}
{{- define "nstance-operator.fullname" -}}
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

{{- define "nstance-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nstance-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nstance-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nstance-operator.labels" -}}
helm.sh/chart: {{ include "nstance-operator.chart" . }}
{{ include "nstance-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nstance
{{- end }}

{{- define "nstance-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Service in front of the webhook server. */}}
{{- define "nstance-operator.webhookService" -}}
{{- printf "%s-webhook" (include "nstance-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* cert-manager Certificate whose CA is injected into the webhook configuration. */}}
{{- define "nstance-operator.webhookCertificate" -}}
{{- include "nstance-operator.webhookService" . }}
{{- end }}

{{/* Secret holding the webhook's serving certificate. */}}
{{- define "nstance-operator.webhookTLSSecret" -}}
{{- if .Values.webhook.certManager }}
{{- printf "%s-tls" (include "nstance-operator.webhookService" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- required "webhook.tlsSecretName is required when webhook.enabled is true and webhook.certManager is false" .Values.webhook.tlsSecretName }}
{{- end }}
{{- end }}

{{/* ServiceAccount whose tokens go into Cluster API's kubeconfig Secret (NSTANCE_CAPI_SERVICEACCOUNT). */}}
{{- define "nstance-operator.capiServiceAccount" -}}
{{- default "nstance-capi-workload" .Values.capi.serviceAccount.name }}
{{- end }}

{{/* ClusterRole (and binding) of that ServiceAccount: one per release. */}}
{{- define "nstance-operator.capiWorkloadRole" -}}
{{- printf "%s-capi-workload" (include "nstance-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
