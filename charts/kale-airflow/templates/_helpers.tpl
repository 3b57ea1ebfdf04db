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

{{/* The Kafka credentials' environment variables -> their keys in kafka.existingSecret (JSON;
only the keys named, {} without a Secret). */}}
{{- define "kale.kafkaSecretKeys" -}}
{{- $keys := dict -}}
{{- if .Values.kafka.existingSecret -}}
{{- range $env, $key := dict "KALE_KAFKA_CONFIG" .Values.kafka.configKey "KALE_KAFKA_SASL_USERNAME" .Values.kafka.usernameKey "KALE_KAFKA_SASL_PASSWORD" .Values.kafka.passwordKey -}}
{{- if $key -}}{{- $_ := set $keys $env $key -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $keys -}}
{{- end -}}

{{/* kale.yaml: the config values, with the database and Kafka Secrets the pods reference. */}}
{{- define "kale.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $k8s := deepCopy (get $cfg "kubernetes" | default dict) -}}
{{- $_ := set $k8s "database_secret" (include "kale.databaseSecret" .) -}}
{{- $_ := set $k8s "database_secret_key" .Values.database.secretKey -}}
{{- if .Values.kafka.existingSecret -}}
{{- $_ := set $k8s "kafka_secret" .Values.kafka.existingSecret -}}
{{- $_ := set $k8s "kafka_secret_keys" (include "kale.kafkaSecretKeys" . | fromJson) -}}
{{- end -}}
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
