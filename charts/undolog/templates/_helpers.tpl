{{- define "undolog.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The helm create convention: fullnameOverride, else <release>-<name> (the release alone when
     it already holds the name). */}}
{{- define "undolog.fullname" -}}
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

{{- define "undolog.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "undolog.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "undolog.selectorLabels" -}}
app.kubernetes.io/name: {{ include "undolog.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "undolog.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "undolog.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* What the operator does with sagas, entries and webhooks: the same rules in a ClusterRole
     (all namespaces) or in a Role per watched namespace. No wildcards. */}}
{{- define "undolog.sagaRules" -}}
- apiGroups: [undolog.io]
  resources: [sagas]
  # delete: retention removes finished sagas once due (their entries go by garbage collection)
  verbs: [get, list, watch, patch, delete]
- apiGroups: [undolog.io]
  resources: [undoentries]
  verbs: [get, list, watch, create, patch]
- apiGroups: [undolog.io]
  # webhooks/status: whether the participant answers (its breaker, a column of kubectl get wh)
  resources: [sagas/status, undoentries/status, webhooks/status]
  verbs: [get, patch]
- apiGroups: [undolog.io]
  resources: [webhooks]
  # patch: an empty one, once, so that what an earlier release stored is stored as v1beta1
  verbs: [get, list, watch, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.rbac.readWebhookSecrets }}
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
{{- end }}

{{/* The operator image: by digest when one is given (immutable), else by tag. */}}
{{- define "undolog.image" -}}
{{- $repository := include "undolog.repository" . -}}
{{- if .Values.image.digest -}}
{{ printf "%s@%s" $repository .Values.image.digest | quote }}
{{- else -}}
{{ printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
{{- end -}}
{{- end }}

{{/* image.repository, its registry replaced by global.imageRegistry when a parent chart sets one
(a mirror): the first part is a registry when it has a dot or a port, or is localhost. */}}
{{- define "undolog.repository" -}}
{{- $registry := (.Values.global).imageRegistry | default "" -}}
{{- $parts := splitList "/" .Values.image.repository -}}
{{- $first := first $parts -}}
{{- $hosted := and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- if not $registry -}}
{{ .Values.image.repository }}
{{- else if $hosted -}}
{{ printf "%s/%s" $registry (rest $parts | join "/") }}
{{- else -}}
{{ printf "%s/%s" $registry .Values.image.repository }}
{{- end -}}
{{- end }}

{{/* Every pod's pull secrets: the chart's imagePullSecrets and a parent's global.imagePullSecrets. */}}
{{- define "undolog.imagePullSecrets" -}}
{{- $secrets := concat (.Values.imagePullSecrets | default list) ((.Values.global).imagePullSecrets | default list) -}}
{{- with $secrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The archive's connection (operator and dashboard): --archive-dsn from its parts, or nothing. */}}
{{- define "undolog.archiveArgs" -}}
{{- with .Values.archive }}
{{- if and .enabled (not .dsnSecret.name) }}
{{- if not .host }}{{ fail "archive.enabled needs archive.dsnSecret.name or archive.host" }}{{ end }}
- --archive-dsn=host={{ .host }} port={{ .port }} dbname={{ .database }} user={{ .user }} sslmode={{ .sslmode }}
{{- end }}
{{- end }}
{{- end }}

{{/* The archive's secrets as libpq and UndoLog read them: the whole DSN, or the password alone. */}}
{{- define "undolog.archiveEnv" -}}
{{- with .Values.archive }}
{{- if and .enabled .dsnSecret.name }}
- name: UNDOLOG_ARCHIVE_DSN
  valueFrom:
    secretKeyRef:
      name: {{ .dsnSecret.name }}
      key: {{ .dsnSecret.key }}
{{- end }}
{{- if and .enabled .passwordSecret.name }}
- name: PGPASSWORD  # libpq reads it for a connection string without a password
  valueFrom:
    secretKeyRef:
      name: {{ .passwordSecret.name }}
      key: {{ .passwordSecret.key }}
{{- end }}
{{- end }}
{{- end }}

{{/* Where a component's pods run, from its values (dashboard, gateway): the knobs the
     operator's own pods take at the top level. */}}
{{- define "undolog.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}
