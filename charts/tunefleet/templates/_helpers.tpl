{{- define "tunefleet.name" -}}tunefleet{{- end -}}

{{- define "tunefleet.fullname" -}}
{{- if contains "tunefleet" .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-tunefleet" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "tunefleet.labels" -}}
app.kubernetes.io/name: tunefleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tunefleet.selectorLabels" -}}
app.kubernetes.io/name: tunefleet
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tunefleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ include "tunefleet.fullname" . }}
{{- else -}}{{ required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{- define "tunefleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
