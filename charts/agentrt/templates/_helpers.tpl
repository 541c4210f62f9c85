{{/* The release's full name, at most 63 characters. */}}
{{- define "agentrt.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "agentrt.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "agentrt.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "agentrt.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agentrt.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The rules the controller needs: exactly the API calls it makes (tests/chart.rs checks them). */}}
{{- define "agentrt.controllerRules" -}}
- apiGroups: ["agentrt.dev"]
  resources: ["agentruns"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["agentrt.dev"]
  resources: ["agentruns/status"]
  verbs: ["update"]
- apiGroups: ["agentrt.dev"]
  resources: ["approvals"]
  verbs: ["get", "list", "watch", "create"]
- apiGroups: ["agentrt.dev"]
  resources: ["approvals/status"]
  verbs: ["patch"]
# Sealed history (docs/design.md section 4a): created once (get only when the create finds
# the name taken, to compare its content), never listed, updated or deleted by the controller
# (the garbage collector deletes them with their run; `agentrt show`/`verify` list them with
# the user's own rights).
- apiGroups: ["agentrt.dev"]
  resources: ["agentrunsegments"]
  verbs: ["create", "get"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  # delete: a Lease a deleted run of the same name left is replaced, never adopted; the Lease
  # of a run that ended is deleted by its holder; a replica gone 10 minutes loses its presence.
  verbs: ["get", "list", "watch", "create", "update", "delete"]
# Each Event is created once (no series updates).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
# The admins' policies (docs/design.md section 6), kept by a reflector; never written.
- apiGroups: ["agentrt.dev"]
  resources: ["agentpolicies"]
  verbs: ["list", "watch"]
# Job tools (docs/design.md section 6, "Job tools"): each call a Job the controller creates,
# reads, releases (patch: its finalizer removed and its TTL set once the outcome is recorded)
# and deletes (onCancel: Delete); its Pods read for the result (the termination message, or
# the log with result: Log). The webhook refuses a Job tool whose author may not create jobs.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "list", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
{{- end -}}

{{/* The cluster-scoped reads of the admin policies, in either mode: ClusterAgentPolicies and
the Namespaces' labels their namespaceSelector reads. Read only. */}}
{{- define "agentrt.adminPolicyRules" -}}
- apiGroups: ["agentrt.dev"]
  resources: ["clusteragentpolicies"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end -}}


{{/* The webhook's SubjectAccessReviews (cluster-scoped): may the user creating a run get each
Secret it names (docs/design.md section 6, "Secrets"). Only with the webhook on. */}}
{{- define "agentrt.accessReviewRules" -}}
{{- if .Values.webhook.enabled }}
- apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
{{- end }}
{{- end -}}


{{/* A run's header or API key from a Secret (docs/design.md section 6, "Secrets"): get only,
never list or watch; a Secret is used only when its owner labelled it
agentrt.dev/usable-by-runs=true. In the watched namespaces' Roles with watchNamespaces; else in
the ClusterRole, or in a Role per secretNamespaces entry when that is set. */}}
{{- define "agentrt.secretRules" -}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end -}}
