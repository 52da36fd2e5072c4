{{/*
Names. The RBAC templates use only these helpers and .Release.Namespace, so that they stay static
YAML a reviewer (and tests/unit/test_chart_rbac.py) can read without rendering.
*/}}
{{- define "trtforge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "trtforge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "trtforge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object the chart renders. Never copied onto the operator's children. */}}
{{- define "trtforge.labels" -}}
helm.sh/chart: {{ include "trtforge.chart" . }}
{{ include "trtforge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trtforge
{{- end -}}

{{- define "trtforge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trtforge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "trtforge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "trtforge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespace build Jobs run in (and the only one whose store credentials exist). */}}
{{- define "trtforge.buildNamespace" -}}
{{- default .Release.Namespace .Values.build.namespace -}}
{{- end -}}

{{/* registry/repository:tag or registry/repository@digest; the tag defaults to the chart's appVersion
(and the image's tagSuffix: -full for the full runtime). */}}
{{- define "trtforge.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- $registry := default $root.Values.global.imageRegistry $img.registry -}}
{{- $repo := ternary $img.repository (printf "%s/%s" $registry $img.repository) (eq $registry "") -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- $appTag := printf "%s%s" $root.Chart.AppVersion (default "" $img.tagSuffix) -}}
{{- printf "%s:%s" $repo (default $appTag $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* The secret holding the S3 credentials (keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY). */}}
{{- define "trtforge.s3SecretName" -}}
{{- default (printf "%s-store-s3" (include "trtforge.fullname" .)) .Values.store.s3.existingSecret -}}
{{- end -}}

{{- define "trtforge.pvcClaimName" -}}
{{- default (printf "%s-engines" (include "trtforge.fullname" .)) .Values.store.pvc.claimName -}}
{{- end -}}

{{/* The store URI the operator, build Jobs and (through the broker) runtime pods use. */}}
{{- define "trtforge.storeURI" -}}
{{- if eq .Values.store.type "s3" -}}
{{- printf "s3://%s/%s" .Values.store.s3.bucket (trimAll "/" .Values.store.s3.prefix) | trimSuffix "/" -}}
{{- else -}}
{{- printf "pvc://%s/%s" (include "trtforge.pvcClaimName" .) (trimAll "/" .Values.store.pvc.path) | trimSuffix "/" -}}
{{- end -}}
{{- end -}}

{{/* The engine broker: its own Deployment, Service and ServiceAccount (templates/broker-*.yaml). */}}
{{- define "trtforge.brokerName" -}}
{{- printf "%s-broker" (include "trtforge.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* What runtime pods and verify Jobs fetch through: the broker Service. */}}
{{- define "trtforge.brokerURL" -}}
{{- printf "http://%s.%s.svc:%d" (include "trtforge.brokerName" .) .Release.Namespace (int .Values.service.brokerPort) -}}
{{- end -}}

{{- define "trtforge.brokerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "trtforge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end -}}

{{- define "trtforge.brokerLabels" -}}
helm.sh/chart: {{ include "trtforge.chart" . }}
{{ include "trtforge.brokerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trtforge
{{- end -}}

{{/* PodDisruptionBudget's API: policy/v1 where the cluster serves it (1.21+), else policy/v1beta1
(1.20 and older). `helm install` sees the cluster's kinds; `helm template` knows only the kube version
(--kube-version, or --api-versions policy/v1/PodDisruptionBudget). */}}
{{- define "trtforge.pdbAPIVersion" -}}
{{- if or (.Capabilities.APIVersions.Has "policy/v1/PodDisruptionBudget") (semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version) -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end -}}
{{- end -}}
