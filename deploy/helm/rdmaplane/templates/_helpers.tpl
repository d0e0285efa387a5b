{{/* Labels every object gets beside its own (never in selectors: those are immutable). */}}
{{- define "rdmaplane.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: rdmaplane
{{- end -}}

{{- define "rdmaplane.image" -}}
image: {{ printf "%s:%s" .Values.image.repository (toString .Values.image.tag) | quote }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{- define "rdmaplane.podExtras" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations: {{ toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Is cert-manager to issue the webhook's certificate? */}}
{{- define "rdmaplane.certManager" -}}
{{- $mode := toString .Values.webhook.certManager.enabled -}}
{{- if or (eq $mode "true") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) -}}
true
{{- end -}}
{{- end -}}

{{/* The webhook's Service DNS names (the serving certificate's hosts). */}}
{{- define "rdmaplane.webhookHosts" -}}
- rdmaplane-webhook.{{ .Release.Namespace }}.svc
- rdmaplane-webhook.{{ .Release.Namespace }}.svc.cluster.local
{{- end -}}

{{/* A `resources` value (one name, or a list of names) as a JSON list. */}}
{{- define "rdmaplane.names" -}}
{{- if kindIs "slice" . }}{{ toJson . }}{{ else }}{{ toJson (list .) }}{{ end -}}
{{- end -}}

{{/* The null-safe CEL: does the pod ask for GPUs (any of resources.gpu, in any container's or
init container's limits)? */}}
{{- define "rdmaplane.asksForGpus" -}}
{{- $names := include "rdmaplane.names" .Values.resources.gpu | fromJsonArray -}}
{{- $in := list -}}
{{- range $names }}{{ $in = append $in (printf "'%s' in c.resources.limits" .) }}{{ end -}}
{{- $gpu := join " || " $in -}}
{{- if gt (len $names) 1 }}{{ $gpu = printf "(%s)" $gpu }}{{ end -}}
object.spec.containers.exists(c, has(c.resources) && has(c.resources.limits) &&
{{ $gpu }}) ||
(has(object.spec.initContainers) && object.spec.initContainers.exists(c,
has(c.resources) && has(c.resources.limits) && {{ $gpu }})) ||
(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)
{{- end -}}

{{/* The node agents' users (the agent, the DRA driver): who the own-node policies bind. */}}
{{- define "rdmaplane.nodeAgentUsers" -}}
request.userInfo.username in ['system:serviceaccount:{{ .Release.Namespace }}:rdmaplane-agent',
'system:serviceaccount:{{ .Release.Namespace }}:rdmaplane-dra-driver']
{{- end -}}

{{/* The fabric tier labels the agent writes, as a CEL list: fabric.tierLabels, else the agent's
default (rdmaplane.core.fabric.DEFAULT_TIER_LABELS). */}}
{{- define "rdmaplane.agentTierLabels" -}}
{{- $labels := .Values.fabric.tierLabels | default (list "fabric.topograph.run/tier-0" "fabric.topograph.run/tier-1" "fabric.topograph.run/tier-2") -}}
[{{ range $i, $l := $labels }}{{ if $i }}, {{ end }}'{{ $l }}'{{ end }}]
{{- end -}}

{{/* The release namespace's Pod Security labels (docs/security.md): the node agent needs the
privileged level; warn and audit at restricted. */}}
{{- define "rdmaplane.podSecurityLabels" -}}
pod-security.kubernetes.io/enforce: privileged
pod-security.kubernetes.io/warn: restricted
pod-security.kubernetes.io/audit: restricted
{{- end -}}
