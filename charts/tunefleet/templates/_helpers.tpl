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

{{- /* The namespaces this release watches, sorted and comma-joined; "*" for all. */ -}}
{{- define "tunefleet.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- .Values.operator.watchNamespaces | uniq | sortAlpha | join "," -}}
{{- else -}}*{{- end -}}
{{- end -}}

{{- /*
Several releases may share a cluster only on disjoint namespaces: two operators reconciling
one profile would fight over its status and Jobs, and two webhooks would both admit its pods.
Every release's main ClusterRole says what it watches (tunefleet.io/watch-namespaces); an
install or upgrade that would overlap another release fails here, naming it. Renderers
without cluster access (helm template) see no other release and check nothing.
*/ -}}
{{- define "tunefleet.checkWatchOverlap" -}}
{{- $mine := include "tunefleet.watchNamespaces" . | splitList "," -}}
{{- $roles := lookup "rbac.authorization.k8s.io/v1" "ClusterRole" "" "" -}}
{{- range ($roles.items | default list) -}}
{{- $ann := .metadata.annotations | default dict -}}
{{- $theirs := index $ann "tunefleet.io/watch-namespaces" | default "" -}}
{{- $release := index $ann "meta.helm.sh/release-name" | default "" -}}
{{- $releaseNs := index $ann "meta.helm.sh/release-namespace" | default "" -}}
{{- if and $theirs (not (and (eq $release $.Release.Name) (eq $releaseNs $.Release.Namespace))) -}}
{{- $theirList := splitList "," $theirs -}}
{{- $both := list -}}
{{- range $mine -}}{{- if has . $theirList -}}{{- $both = append $both . -}}{{- end -}}{{- end -}}
{{- if or (has "*" $mine) (has "*" $theirList) $both -}}
{{- fail (printf "operator.watchNamespaces (%s) overlaps tunefleet release %s in namespace %s, which watches %s: releases that share a cluster must watch disjoint namespaces (and neither may watch all of them); set operator.watchNamespaces of each to its own namespaces" (join "," $mine) $release $releaseNs $theirs) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* The label that names an operator pod's replica slot (deployment.yaml, webhook.yaml). */ -}}
{{- define "tunefleet.slotLabel" -}}
tunefleet.io/webhook-slot
{{- end -}}

{{- /* Slot N's Deployment: slot 0 keeps the release's fullname, the others end in -N. Called
  with (list $ N). */ -}}
{{- define "tunefleet.slotName" -}}
{{- $name := include "tunefleet.fullname" (index . 0) -}}
{{- if index . 1 }}{{ printf "%s-%d" $name (index . 1) }}{{ else }}{{ $name }}{{ end -}}
{{- end -}}

{{- /* Slot N's own webhook Service (webhook.yaml, the helm test). Called with (list $ N). */ -}}
{{- define "tunefleet.slotService" -}}
{{- printf "%s-webhook-%d" (include "tunefleet.fullname" (index . 0)) (index . 1) -}}
{{- end -}}
