{{- define "kale.labels" -}}
app.kubernetes.io/name: kale-airflow
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret holding the control-plane database URL: an existing one, or the chart's own. */}}
{{- define "kale.databaseSecret" -}}
{{- .Values.database.existingSecret | default (printf "%s-database" .Release.Name) -}}
{{- end -}}

{{/* kale.yaml: the config values, with the database Secret the pods reference. */}}
{{- define "kale.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $k8s := deepCopy (get $cfg "kubernetes" | default dict) -}}
{{- $_ := set $k8s "database_secret" (include "kale.databaseSecret" .) -}}
{{- $_ := set $k8s "database_secret_key" .Values.database.secretKey -}}
{{- $_ := set $cfg "kubernetes" $k8s -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The MLflow Service's in-cluster names (with and without port) plus localhost, for --allowed-hosts. */}}
{{- define "kale.mlflowAllowedHosts" -}}
{{- $svc := printf "%s-mlflow" .Release.Name -}}
{{- $ns := .Values.airflow.namespace -}}
{{- $hosts := list -}}
{{- range $name := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns $.Values.clusterDomain) -}}
{{- $hosts = append $hosts $name -}}
{{- $hosts = append $hosts (printf "%s:5000" $name) -}}
{{- end -}}
{{- $hosts = concat $hosts (list "localhost" "localhost:*" "127.0.0.1" "127.0.0.1:*") .Values.mlflow.allowedHosts -}}
{{- join "," $hosts -}}
{{- end -}}
