{{/*
Names. The full name is the release name, with the chart name appended
unless the release name already contains it (Helm's convention).
*/}}
{{- define "ichor-policy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ichor-policy.fullname" -}}
{{- include "ichor-policy.fullnameUnchecked" . }}
{{- $full := include "ichor-policy.fullnameUnchecked" . }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $full) }}
{{- fail (printf "the full name %q (the release name, or fullnameOverride) is no DNS label that starts with a letter: the Services named after it would be refused part-way through the install. Give a release name of lowercase letters, digits and '-' that starts with a letter, or set fullnameOverride" $full) }}
{{- end }}
{{- /* YAML 1.1 reads these words, unquoted, as a boolean or null, not a name. */}}
{{- if has $full (list "y" "n" "yes" "no" "on" "off" "true" "false" "null") }}
{{- fail (printf "the full name %q (fullnameOverride) reads as a boolean or null, not a name, where the manifests write it: give another" $full) }}
{{- end }}
{{- end }}

{{- define "ichor-policy.fullnameUnchecked" -}}
{{- /*
At most 55 characters, not 63: the Services are named it and "-webhook" or
"-metrics", and a Service's name is a DNS label of at most 63 (review 189:
a release name of 43 to 53 characters failed part-way through the install,
so no release of a longer full name ever ran to be renamed by this).
*/}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ichor-policy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ichor-policy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ichor
{{- end }}

{{- define "ichor-policy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ichor-policy.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end }}

{{- define "ichor-policy.serviceAccountName" -}}
{{- if eq .Values.serviceAccount.name "default" }}
{{- fail "serviceAccount.name: not default: every pod of the namespace that names no account would run with the manager's rights (bind on cluster-admin, approve on kubelet-serving) and be left out of the recorders as the manager is; name an account of the manager's own" }}
{{- end }}
{{- if .Values.serviceAccount.create }}
{{- default (include "ichor-policy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The manager's own roles, generated from the code's RBAC markers. */}}
{{- define "ichor-policy.managerRoleName" -}}
{{- printf "%s-manager" (include "ichor-policy.fullname" .) }}
{{- end }}

{{- define "ichor-policy.webhookServiceName" -}}
{{- printf "%s-webhook" (include "ichor-policy.fullname" .) }}
{{- end }}

{{/*
Fixed names: the RBAC markers of package webhookcerts name them
(resourceNames), and the manager's roles are generated from the markers, so
they cannot follow the release name. deploy/chart's tests check the rendered
roles grant exactly these.
*/}}
{{- define "ichor-policy.webhookConfigurationName" -}}
ichor-policy-webhook
{{- end }}

{{- define "ichor-policy.webhookCertSecretName" -}}
ichor-policy-webhook-cert
{{- end }}

{{/* cert-manager mode: the Certificate and the Secret it fills. */}}
{{- define "ichor-policy.certificateName" -}}
{{- printf "%s-webhook" (include "ichor-policy.fullname" .) }}
{{- end }}

{{- define "ichor-policy.certManagerSecretName" -}}
{{- printf "%s-webhook-tls" (include "ichor-policy.fullname" .) }}
{{- end }}

{{/* The Service's DNS names, which the serving certificate carries. */}}
{{- define "ichor-policy.webhookDNSNames" -}}
{{- $svc := include "ichor-policy.webhookServiceName" . }}
- {{ $svc }}.{{ .Release.Namespace }}.svc
- {{ $svc }}
- {{ $svc }}.{{ .Release.Namespace }}
- {{ $svc }}.{{ .Release.Namespace }}.svc.{{ .Values.webhook.clusterDomain }}
{{- end }}

{{- define "ichor-policy.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The documents of a multi-document YAML file of the chart, parsed, empty ones
dropped, as a list under "docs" (a template can only return a string).
*/}}
{{- define "ichor-policy.documents" -}}
{{- $docs := list }}
{{- range regexSplit "(?m)^---[ \t]*$" (.root.Files.Get .path) -1 }}
{{- $doc := fromYaml . }}
{{- if $doc.Error }}
{{- fail (printf "%s: %s" $.path $doc.Error) }}
{{- end }}
{{- if $doc.kind }}
{{- $docs = append $docs $doc }}
{{- end }}
{{- end }}
{{- toYaml (dict "docs" $docs) }}
{{- end }}

{{/*
"true" when manager.extraArgs turn the manager's boolean flag on, as the
manager's flag parser reads them: the bare flag or FLAG=VALUE for a value
strconv.ParseBool takes as true, the last one given winning. Call with
(list FLAG ARGS).
*/}}
{{- define "ichor-policy.flagOn" -}}
{{- $flag := index . 0 }}
{{- $on := false }}
{{- range index . 1 }}
{{- if eq . $flag }}
{{- $on = true }}
{{- else if hasPrefix (printf "%s=" $flag) . }}
{{- $on = has (trimPrefix (printf "%s=" $flag) .) (list "1" "t" "T" "true" "TRUE" "True") }}
{{- end }}
{{- end }}
{{- if $on }}true{{ end }}
{{- end }}

{{/*
The ValidatingAdmissionPolicyBindings the chart renders, comma-separated: the
manager is not ready until each exists (--admission-policy-bindings). Helm
applies them after the manager's rights and Deployment (review 256 F1).
deploy/chart's tests hold this list to the bindings rendered.
*/}}
{{- define "ichor-policy.policyBindings" -}}
{{- $full := include "ichor-policy.fullname" . -}}
{{- $names := list "ichor-credential-requester" -}}
{{- range list "admin-bindings" "bundle-epoch" "credential-answers" "verdicts" "approver-messages" "webhook-configuration" -}}
{{- $names = append $names (printf "%s-%s" $full .) -}}
{{- end -}}
{{- join "," $names -}}
{{- end }}
