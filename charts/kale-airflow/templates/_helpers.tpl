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

{{/* An image of images.*: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "kale.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{- define "kale.workerImage" -}}
{{- include "kale.image" (dict "image" .Values.images.worker "root" .) -}}
{{- end -}}

{{/* PodDisruptionBudget minAvailable of the worker pods: the value, or max_workers (no voluntary eviction). */}}
{{- define "kale.workerMinAvailable" -}}
{{- $v := .Values.workerPods.disruptionBudget.minAvailable -}}
{{- if kindIs "invalid" $v -}}{{- .Values.config.max_workers | default 8 -}}{{- else -}}{{- $v -}}{{- end -}}
{{- end -}}

{{/* The namespaces the worker pods run in, as JSON: training.namespace, then each job's own
kubernetes.namespace (config.jobs), once each. Each gets the Role and RoleBinding, the worker
service account, the checkpoint claim, the chart's database Secret and the disruption budget. */}}
{{- define "kale.trainingNamespaces" -}}
{{- $all := list .Values.training.namespace -}}
{{- range $job := (get .Values.config "jobs" | default list) -}}
{{- with (get (get $job "kubernetes" | default dict) "namespace") -}}
{{- $all = append $all . -}}
{{- end -}}
{{- end -}}
{{- toJson (uniq $all) -}}
{{- end -}}

{{/* kale.yaml: the config values, with the worker image, the pods' scheduling and the database
and Kafka Secrets the pods reference. */}}
{{- define "kale.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $k8s := deepCopy (get $cfg "kubernetes" | default dict) -}}
{{- range $field, $from := dict "namespace" (list "training.namespace" .Values.training.namespace) "checkpoint_claim" (list "checkpoints.claimName" .Values.checkpoints.claimName) "service_account" (list "workerServiceAccount.name" .Values.workerServiceAccount.name) -}}
{{- $given := get $k8s $field -}}
{{- if and $given (ne $given (index $from 1)) -}}
{{- fail (printf "config.kubernetes.%s is %q but %s is %q: the pods, the Role, the claim and the service account would not meet; leave config.kubernetes.%s unset (it comes from %s)" $field $given (index $from 0) (index $from 1) $field (index $from 0)) -}}
{{- end -}}
{{- $_ := set $k8s $field (index $from 1) -}}
{{- range $i, $job := (get $cfg "jobs" | default list) -}}
{{- $own := get (get $job "kubernetes" | default dict) $field -}}
{{- if and $own (ne $own (index $from 1)) (ne $field "namespace") -}}
{{- fail (printf "config.jobs[%d] (%s) sets kubernetes.%s %q but %s is %q: with this chart every job's pods run with the release's claim and service account (rendered in each job's namespace); leave it unset" $i (get $job "name") $field $own (index $from 0) (index $from 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $_ := set $k8s "image" (include "kale.workerImage" .) -}}
{{- $_ := set $k8s "image_pull_policy" .Values.images.worker.pullPolicy -}}
{{- $_ := set $k8s "image_pull_secrets" .Values.images.worker.pullSecrets -}}
{{- if .Values.workerPods.priorityClassName -}}
{{- $_ := set $k8s "priority_class_name" .Values.workerPods.priorityClassName -}}
{{- end -}}
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

{{/* KALE_MLFLOW_URI of the Airflow components: this chart's server, mlflow.trackingUri, or "" (unset). */}}
{{- define "kale.mlflowUri" -}}
{{- if .Values.mlflow.enabled -}}
{{- printf "http://%s-mlflow.%s:5000" .Release.Name .Values.airflow.namespace -}}
{{- else -}}
{{- .Values.mlflow.trackingUri -}}
{{- end -}}
{{- end -}}

{{/* The values the official apache-airflow chart (1.18) needs, printed by NOTES and shipped in
ConfigMap <release>-airflow-values; tests/charts/test_official_chart.py renders that chart with
them. The pool is set by an init container of the scheduler: the chart's own
wait-for-airflow-migrations init container runs before it, so the metadata database is
migrated, and every scheduler start (each upgrade) sets it again to max_workers slots. The
{{ template ... }} strings are left for the official chart, which renders extraInitContainers
with tpl. */}}
{{- define "kale.airflowValues" -}}
{{- $pool := dig "kubernetes" "pool" "kale_gpu" .Values.config -}}
{{- $mlflow := include "kale.mlflowUri" . -}}
# For the official apache-airflow chart 1.18.0 next to kale-airflow {{ .Chart.Version }} (release {{ .Release.Name }}).
airflowVersion: {{ .Values.airflow.version | quote }}
# Every Airflow component and KubernetesExecutor task pod runs this image (docker/airflow.Dockerfile),
# named by the defaults and again by images.airflow and images.pod_template, which every copy of the
# chart honours (repackaged copies default image tags to their appVersion, not defaultAirflowTag).
{{- $repository := .Values.images.airflow.repository }}
{{- $tag := .Values.images.airflow.tag | default .Chart.AppVersion | quote }}
defaultAirflowRepository: {{ $repository }}
defaultAirflowTag: {{ $tag }}
images:
  airflow: {repository: {{ $repository }}, tag: {{ $tag }}}
  pod_template: {repository: {{ $repository }}, tag: {{ $tag }}}
{{- with .Values.airflow.metadataSecret }}
# Airflow's metadata database: your PostgreSQL (Secret {{ . }}, key connection), not the bundled one.
postgresql:
  enabled: false
data:
  metadataSecretName: {{ . }}
{{- end }}
dagProcessor:
  enabled: true
triggerer:
  enabled: true
secret:
  - envName: KALE_DATABASE_URL
    secretName: {{ include "kale.databaseSecret" . }}
    secretKey: {{ .Values.database.secretKey }}
{{- range $env, $key := include "kale.kafkaSecretKeys" . | fromJson }}
  - envName: {{ $env }}
    secretName: {{ $.Values.kafka.existingSecret }}
    secretKey: {{ $key }}
{{- end }}
env:
  - name: KALE_CONFIG
    value: /opt/kale/kale.yaml
{{- if $mlflow }}
  - name: KALE_MLFLOW_URI
    value: {{ $mlflow | quote }}
{{- end }}
volumes:
  - name: kale-config
    configMap: {name: {{ .Release.Name }}-config}
{{- if .Values.dags.configMap }}
  - name: kale-dags
    configMap: {name: {{ .Release.Name }}-dags}
{{- end }}
volumeMounts:
  - {name: kale-config, mountPath: /opt/kale, readOnly: true}
{{- if .Values.dags.configMap }}
{{- range $path, $_ := .Files.Glob "files/dags/*.py" }}
  - {name: kale-dags, mountPath: /opt/airflow/dags/{{ base $path }}, subPath: {{ base $path }}, readOnly: true}
{{- end }}
{{- end }}
scheduler:
  extraInitContainers:
    # The Airflow pool of the GPU worker pod tasks, one slot per worker; --include-deferred so
    # deferred pods hold their slot and the pool bounds the running pods.
    # args, not command: the image's entrypoint waits for the database first.
    - name: kale-pool
      image: '{{`{{ template "airflow_image" . }}`}}'
      imagePullPolicy: '{{`{{ .Values.images.airflow.pullPolicy }}`}}'
      args: [airflow, pools, set, {{ $pool | quote }}, {{ .Values.config.max_workers | default 8 | quote }}, "Kale GPU worker pods", --include-deferred]
      env:
        - name: AIRFLOW__DATABASE__SQL_ALCHEMY_CONN
          valueFrom:
            secretKeyRef:
              name: '{{`{{ template "airflow_metadata_secret" . }}`}}'
              key: connection
      volumeMounts:
        - {name: config, mountPath: '{{`{{ .Values.airflowHome }}`}}/airflow.cfg', subPath: airflow.cfg, readOnly: true}
      resources:
        requests: {cpu: 50m, memory: 256Mi}
        limits: {memory: 512Mi}
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
{{- end -}}
