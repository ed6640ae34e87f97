{{/*
The seven Quarry services: Kubernetes name (also the `quarry serve` argument), the key of
their settings under .Values.services, and their index in quarry.config.SERVICES (the
services derive their metrics port as QUARRY_METRICS_BASE_PORT + index). Five speak gRPC;
s3-gateway (S3) and console (the web console) speak HTTP, on a port named "http".
"quarry.allComponents" lists all seven; "quarry.components" those the release runs (s3-gateway
only with services.s3Gateway.enabled, console only with services.console.enabled). Every per-service template ranges over the latter:
  {{- range $c := include "quarry.components" . | fromYamlArray }}
*/}}
{{- define "quarry.allComponents" -}}
- name: kv-gateway
  key: kvGateway
  index: 0
- name: branch-manager
  key: branchManager
  index: 1
- name: committer
  key: committer
  index: 2
- name: compactor-sensor
  key: compactorSensor
  index: 3
- name: range-writer
  key: rangeWriter
  index: 4
- name: s3-gateway
  key: s3Gateway
  index: 5
- name: console
  key: console
  index: 6
{{- end }}

{{- define "quarry.components" -}}
{{- range $c := include "quarry.allComponents" . | fromYamlArray }}
{{- $optional := has $c.name (list "s3-gateway" "console") }}
{{- if or (not $optional) (index $.Values.services $c.key).enabled }}
- {{ toYaml $c | nindent 2 | trim }}
{{- end }}
{{- end }}
{{- end }}

{{/* The name of a service's serving port: "http" for s3-gateway (S3 over HTTP) and console, else "grpc". */}}
{{- define "quarry.portName" -}}
{{- ternary "http" "grpc" (has . (list "s3-gateway" "console")) }}
{{- end }}

{{/* Chart name (label app.kubernetes.io/name). */}}
{{- define "quarry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of every resource name: fullnameOverride, else the release name. Truncated to 46
characters so that "<prefix>-compactor-sensor" still fits a 63-character DNS label.
*/}}
{{- define "quarry.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 46 | trimSuffix "-" }}
{{- end }}

{{/* Name of one service's objects. Call with (dict "root" $ "name" "kv-gateway"). */}}
{{- define "quarry.componentName" -}}
{{- printf "%s-%s" (include "quarry.fullname" .root) .name }}
{{- end }}

{{- define "quarry.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels shared by every object of the release. Call with the root context. */}}
{{- define "quarry.commonLabels" -}}
helm.sh/chart: {{ include "quarry.chart" . }}
app.kubernetes.io/name: {{ include "quarry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: quarry
{{- end }}

{{/* Labels of one service's objects. Call with (dict "root" $ "name" "kv-gateway"). */}}
{{- define "quarry.labels" -}}
{{ include "quarry.commonLabels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{/* Selector labels of one service. Call with (dict "root" $ "name" "kv-gateway"). */}}
{{- define "quarry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "quarry.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{/* The Secret holding the auth signing key: the named one, or the chart's own. */}}
{{- define "quarry.authSecretName" -}}
{{- default (printf "%s-auth" (include "quarry.fullname" .)) .Values.auth.signingKeySecret }}
{{- end }}

{{/* The Secret holding the console's session key: the named one, or the chart's own. */}}
{{- define "quarry.consoleSessionSecretName" -}}
{{- default (printf "%s-console-session" (include "quarry.fullname" .)) .Values.auth.consoleSessionKeySecret }}
{{- end }}

{{/* Auth settings every service gets: on/off and the signing key from its Secret. */}}
{{- define "quarry.authEnv" -}}
- name: QUARRY_AUTH_ENABLED
  value: {{ .Values.auth.enabled | quote }}
{{- if .Values.auth.enabled }}
- name: QUARRY_AUTH_SIGNING_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "quarry.authSecretName" . }}
      key: QUARRY_AUTH_SIGNING_KEY
{{- end }}
{{- end }}

{{- define "quarry.configMapName" -}}
{{- printf "%s-config" (include "quarry.fullname" .) }}
{{- end }}

{{/* gRPC address of one service as the other services dial it: "<fullname>-<name>:<port>"
(or "<dialHost>:<port>" when dialHost is set). */}}
{{- define "quarry.address" -}}
{{- $svc := index .root.Values.services .key -}}
{{- printf "%s:%d" (default (include "quarry.componentName" .) .root.Values.dialHost) (int $svc.port) }}
{{- end }}

{{/*
ServiceAccount settings of one service as YAML (parse with fromYaml): kv-gateway's come from
kv.dynamodb.serviceAccount (the DynamoDB identity), the gc CronJob's from gc.serviceAccount,
the others' from services.<key>.serviceAccount.
Adds "resolvedName": the ServiceAccount the pods run as.
*/}}
{{- define "quarry.serviceAccount" -}}
{{- $sa := dict -}}
{{- if eq .name "kv-gateway" -}}
{{- $sa = .root.Values.kv.dynamodb.serviceAccount -}}
{{- else if eq .name "gc" -}}
{{- $sa = .root.Values.gc.serviceAccount -}}
{{- else -}}
{{- $sa = (index .root.Values.services .key).serviceAccount -}}
{{- end -}}
{{- $resolved := "default" -}}
{{- if $sa.name -}}
{{- $resolved = $sa.name -}}
{{- else if $sa.create -}}
{{- $resolved = include "quarry.componentName" . -}}
{{- end -}}
create: {{ $sa.create }}
resolvedName: {{ $resolved | quote }}
annotations: {{- toYaml (default (dict) $sa.annotations) | nindent 2 }}
{{- end }}

{{/* Pod securityContext (YAML): podSecurityContext with runAsNonRoot: true enforced. */}}
{{- define "quarry.podSecurityContext" -}}
{{- toYaml (merge (dict "runAsNonRoot" true) (deepCopy .Values.podSecurityContext)) }}
{{- end }}

{{/*
Container securityContext (YAML): securityContext with runAsNonRoot, readOnlyRootFilesystem,
allowPrivilegeEscalation: false and capabilities.drop [ALL] enforced.
*/}}
{{- define "quarry.containerSecurityContext" -}}
{{- toYaml (merge (dict "runAsNonRoot" true "readOnlyRootFilesystem" true "allowPrivilegeEscalation" false "capabilities" (dict "drop" (list "ALL"))) (deepCopy .Values.securityContext)) }}
{{- end }}

{{/*
OTEL_RESOURCE_ATTRIBUTES value: service.version, the pod's namespace and name (from the
POD_NAMESPACE / POD_NAME env entries) and telemetry.resourceAttributes. Call with the root context.
*/}}
{{- define "quarry.resourceAttributes" -}}
{{- $attrs := list (printf "service.version=%s" (default .Chart.AppVersion .Values.image.tag)) "k8s.namespace.name=$(POD_NAMESPACE)" "k8s.pod.name=$(POD_NAME)" -}}
{{- range $k, $v := .Values.telemetry.resourceAttributes -}}
{{- $attrs = append $attrs (printf "%s=%v" $k $v) -}}
{{- end -}}
{{- join "," $attrs }}
{{- end }}

{{/*
Object-store env entries (a YAML list) of the containers that read or write the storage
namespaces: range-writer, s3-gateway, branch-manager, committer and the gc CronJob. Call with the root context.
S3 credentials come from the pods' ServiceAccounts (IRSA), never from env vars.
*/}}
{{- define "quarry.objectStoreEnv" -}}
{{- with .Values.objectStore.s3.endpointUrl -}}
- name: QUARRY_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{ end -}}
- name: QUARRY_S3_REGION
  value: {{ .Values.objectStore.s3.region | quote }}
{{- end }}

{{/* The Secret holding the TLS material (tls.crt, tls.key, ca.crt): the named one, or the chart's own. */}}
{{- define "quarry.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "quarry.fullname" .)) .Values.tls.existingSecret }}
{{- end }}

{{/* The Secret holding the admin's credentials: the named one, or the chart's own. */}}
{{- define "quarry.adminSecretName" -}}
{{- default (printf "%s-admin" (include "quarry.fullname" .)) .Values.bootstrap.adminSecret }}
{{- end }}

{{- define "quarry.tlsDir" -}}
/etc/quarry/tls
{{- end }}

{{/*
TLS settings of the services and the CLI (in the shared ConfigMap: file paths, nothing
secret), as a dict in YAML: the files come from the TLS Secret mounted at quarry.tlsDir.
Without TLS, QUARRY_ALLOW_INSECURE_LISTEN=true: tls.enabled=false is the operator's explicit
choice of plaintext on the pod network.
*/}}
{{- define "quarry.tlsEnv" -}}
{{- if .Values.tls.enabled -}}
{{- $dir := include "quarry.tlsDir" . -}}
QUARRY_TLS_CERT_FILE: {{ printf "%s/tls.crt" $dir | quote }}
QUARRY_TLS_KEY_FILE: {{ printf "%s/tls.key" $dir | quote }}
QUARRY_TLS_CA_FILE: {{ printf "%s/ca.crt" $dir | quote }}
QUARRY_TLS_CLIENT_AUTH: {{ .Values.tls.clientAuth | toString | quote }}
{{- with .Values.tls.serverName }}
QUARRY_TLS_SERVER_NAME: {{ . | quote }}
{{- end }}
{{- else -}}
QUARRY_ALLOW_INSECURE_LISTEN: "true"
{{- end }}
{{- end }}

{{/* Volume (YAML list entry) of the TLS Secret, when TLS is on. Call with the root context. */}}
{{- define "quarry.tlsVolume" -}}
{{- if .Values.tls.enabled -}}
- name: tls
  secret:
    secretName: {{ include "quarry.tlsSecretName" . }}
    # Group-readable: the pod's fsGroup owns the files, the key stays private to the pod.
    defaultMode: 0440
    # Kubernetes' default, said explicitly: podman 4.3's kube play crashes when it is unset.
    optional: false
{{- end }}
{{- end }}

{{- define "quarry.tlsVolumeMount" -}}
{{- if .Values.tls.enabled -}}
- name: tls
  mountPath: {{ include "quarry.tlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Volume (YAML list entry) of localData. Call with the root context. */}}
{{- define "quarry.localDataVolume" -}}
{{- $d := .Values.localData -}}
- name: data
{{- if $d.hostPath }}
  hostPath:
    path: {{ $d.hostPath }}
    type: Directory
{{- else if $d.persistentVolumeClaim }}
  persistentVolumeClaim:
    claimName: {{ $d.persistentVolumeClaim }}
{{- else }}
{{- fail "localData.enabled needs localData.hostPath or localData.persistentVolumeClaim (the pods share it)" }}
{{- end }}
{{- end }}

{{- define "quarry.localDataVolumeMount" -}}
- name: data
  mountPath: {{ .Values.localData.mountPath }}
{{- end }}

{{/*
Probe handler (YAML) of one service: a native gRPC probe, or an exec probe running the
image's quarry.runtime.health_probe against 127.0.0.1 (TLS needs it: Kubernetes' gRPC probes
speak plaintext only). Call with (dict "root" $ "port" 7401 "service" "quarry.v1.ServerInfo").
*/}}
{{- define "quarry.probeHandler" -}}
{{- $type := .root.Values.probes.type -}}
{{- if eq $type "auto" -}}
{{- $type = ternary "exec" "grpc" .root.Values.tls.enabled -}}
{{- end -}}
{{- if and (eq $type "grpc") .root.Values.tls.enabled -}}
{{- fail "probes.type grpc cannot check a TLS port (Kubernetes' gRPC probes speak plaintext): use exec or auto" -}}
{{- end -}}
{{- if eq $type "grpc" -}}
grpc:
  port: {{ .port }}
  {{- with .service }}
  service: {{ . }}
  {{- end }}
{{- else -}}
exec:
  command:
    - python
    - -m
    - quarry.runtime.health_probe
    - {{ printf "127.0.0.1:%d" (int .port) | quote }}
    {{- with .service }}
    - --service
    - {{ . }}
    {{- end }}
{{- end }}
{{- end }}

{{/*
Probe handler (YAML) of the S3 gateway: GET /_health on its port. An httpGet probe (scheme
HTTPS when tls.enabled; a kubelet does not verify the certificate) for probes.type grpc and
auto; with probes.type exec, and under tls.clientAuth (the gateway then requires a client
certificate, which a kubelet's probe cannot present), the image's health_probe with --http,
which speaks HTTPS and mTLS with the pod's own settings. Call with (dict "root" $ "port" 7406).
*/}}
{{- define "quarry.httpProbeHandler" -}}
{{- $V := .root.Values -}}
{{- if or (eq $V.probes.type "exec") (and $V.tls.enabled $V.tls.clientAuth) -}}
exec:
  command:
    - python
    - -m
    - quarry.runtime.health_probe
    - {{ printf "127.0.0.1:%d" (int .port) | quote }}
    - --http
    - /_health
{{- else -}}
httpGet:
  path: /_health
  port: http
  scheme: {{ ternary "HTTPS" "HTTP" $V.tls.enabled }}
{{- end }}
{{- end }}

{{/* The TCP port of an http(s):// URL: its explicit port, else 443 (https) or 80 (http). */}}
{{- define "quarry.urlPort" -}}
{{- $u := urlParse . -}}
{{- if regexMatch ":[0-9]+$" $u.host -}}
{{- regexFind "[0-9]+$" $u.host -}}
{{- else -}}
{{- ternary "443" "80" (eq $u.scheme "https") -}}
{{- end -}}
{{- end }}

{{/* Image reference: repository:tag, tag defaulting to the chart appVersion. */}}
{{- define "quarry.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* QUARRY_KV_URL for kv-gateway: dynamodb://<table>?region=<region>[&endpoint_url=<url>]. */}}
{{- define "quarry.kvUrl" -}}
{{- if eq .Values.kv.backend "sqlite" -}}
{{- if not .Values.localData.enabled -}}
{{- fail "kv.backend sqlite keeps the KV file in localData: set localData.enabled (and localData.hostPath or localData.persistentVolumeClaim)" -}}
{{- end -}}
{{- if gt (int .Values.services.kvGateway.replicas) 1 -}}
{{- fail "kv.backend sqlite: services.kvGateway.replicas must be 1 (one process owns the SQLite file)" -}}
{{- end -}}
{{- printf "sqlite://%s/kv.db" (trimSuffix "/" .Values.localData.mountPath) }}
{{- else -}}
{{- $d := .Values.kv.dynamodb -}}
{{- $table := required "kv.dynamodb.table is required: the DynamoDB table kv-gateway stores Quarry's metadata in" $d.table -}}
{{- $region := required "kv.dynamodb.region is required: the AWS region of the DynamoDB table" $d.region -}}
{{- $url := printf "dynamodb://%s?region=%s" $table (urlquery $region) -}}
{{- if $d.endpointUrl -}}
{{- $url = printf "%s&endpoint_url=%s" $url (urlquery $d.endpointUrl) -}}
{{- end -}}
{{- $url }}
{{- end -}}
{{- end }}

{{/*
One service's Deployment. Call with (dict "root" $ "name" "kv-gateway" "key" "kvGateway" "index" 0).
Only kv-gateway gets QUARRY_KV_URL and AWS credentials; only range-writer, s3-gateway,
console (object downloads and previews), branch-manager and committer (it reads action files
from ranges) get the object-store settings. s3-gateway and console serve HTTP(S) on a port
named "http" and are probed with GET /_health (quarry.httpProbeHandler).
*/}}
{{- define "quarry.deployment" -}}
{{- $root := .root -}}
{{- $name := .name -}}
{{- $svc := index $root.Values.services .key -}}
{{- $V := $root.Values -}}
{{- $isKvGateway := eq $name "kv-gateway" -}}
{{- $isHttp := has $name (list "s3-gateway" "console") -}}
{{- /* committer: it reads the action files of a commit or merge from their ranges. */}}
{{- $usesObjectStore := has $name (list "range-writer" "branch-manager" "committer" "s3-gateway" "console") -}}
{{- /* localData: the SQLite file (kv-gateway, with kv.backend sqlite) and local namespaces. */ -}}
{{- $usesLocalData := and $V.localData.enabled (or $usesObjectStore (and $isKvGateway (eq $V.kv.backend "sqlite"))) -}}
{{- $sa := include "quarry.serviceAccount" . | fromYaml -}}
{{- if eq (int $svc.port) (int $svc.metricsPort) -}}
{{- fail (printf "services.%s: port and metricsPort must differ (both are %d)" .key (int $svc.port)) -}}
{{- end -}}
{{- if has (trimSuffix "/" $V.cache.dir) (list "" "/tmp") -}}
{{- fail (printf "cache.dir must not be %q: /tmp already has its own emptyDir" $V.cache.dir) -}}
{{- end -}}
{{- $grace := int $V.terminationGracePeriodSeconds -}}
{{- if not (kindIs "invalid" $svc.terminationGracePeriodSeconds) -}}
{{- $grace = int $svc.terminationGracePeriodSeconds -}}
{{- end -}}
{{- /* In-process drain time: leave the process 5 s (or half of a short grace) to exit before SIGKILL. */ -}}
{{- $drain := ternary (sub $grace 5) (div $grace 2) (ge $grace 10) -}}
{{- /* The services listen for metrics on QUARRY_METRICS_BASE_PORT + their index. */ -}}
{{- $metricsBase := sub (int $svc.metricsPort) (int .index) -}}
{{- if le $metricsBase 0 -}}
{{- fail (printf "services.%s.metricsPort must be greater than %d" .key (int .index)) -}}
{{- end -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "quarry.componentName" . }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "quarry.labels" . | nindent 4 }}
spec:
  {{- if not (and $svc.autoscaling $svc.autoscaling.enabled) }}
  replicas: {{ $svc.replicas }}
  {{- end }}
  revisionHistoryLimit: {{ $V.revisionHistoryLimit }}
  strategy:
    {{- toYaml $V.updateStrategy | nindent 4 }}
  selector:
    matchLabels:
      {{- include "quarry.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "quarry.labels" . | nindent 8 }}
        {{- with $V.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        # Roll the pods when the shared configuration changes.
        checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
        {{- with $V.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- with $svc.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ $sa.resolvedName }}
      # The services never call the Kubernetes API.
      automountServiceAccountToken: false
      # No <SERVICE>_PORT/_HOST variables: with a release named "quarry" they would land in
      # the QUARRY_ namespace (e.g. QUARRY_KV_GATEWAY_PORT=tcp://...).
      enableServiceLinks: false
      terminationGracePeriodSeconds: {{ $grace }}
      {{- if $V.hostNetwork }}
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      {{- end }}
      {{- with $V.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $V.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- include "quarry.podSecurityContext" $root | nindent 8 }}
      containers:
        - name: {{ $name }}
          image: {{ include "quarry.image" $root | quote }}
          imagePullPolicy: {{ $V.image.pullPolicy }}
          command: ["quarry", "serve", {{ $name | quote }}]
          ports:
            - name: {{ include "quarry.portName" $name }}
              containerPort: {{ $svc.port }}
              protocol: TCP
            - name: metrics
              containerPort: {{ $svc.metricsPort }}
              protocol: TCP
          envFrom:
            - configMapRef:
                name: {{ include "quarry.configMapName" $root }}
          env:
            - name: OTEL_SERVICE_NAME
              value: {{ printf "quarry-%s" $name | quote }}
            # metrics port = QUARRY_METRICS_BASE_PORT + service index = {{ $svc.metricsPort }}
            - name: QUARRY_METRICS_BASE_PORT
              value: {{ $metricsBase | quote }}
            - name: QUARRY_SHUTDOWN_GRACE_SECONDS
              value: {{ $drain | quote }}
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            - name: OTEL_RESOURCE_ATTRIBUTES
              value: {{ include "quarry.resourceAttributes" $root | quote }}
            {{- include "quarry.authEnv" $root | nindent 12 }}
            {{- if eq $name "console" }}
            {{- /* Seals the session cookies: one key for every replica (sessions survive a
            restart and move between pods). */}}
            - name: QUARRY_CONSOLE_SESSION_KEY
              valueFrom:
                secretKeyRef:
                  name: {{ include "quarry.consoleSessionSecretName" $root }}
                  key: QUARRY_CONSOLE_SESSION_KEY
            {{- end }}
            {{- if $isKvGateway }}
            - name: QUARRY_KV_URL
              value: {{ include "quarry.kvUrl" $root | quote }}
            {{- with $V.kv.dynamodb.credentialsSecret }}
            - name: AWS_ACCESS_KEY_ID
              valueFrom:
                secretKeyRef:
                  name: {{ . }}
                  key: AWS_ACCESS_KEY_ID
            - name: AWS_SECRET_ACCESS_KEY
              valueFrom:
                secretKeyRef:
                  name: {{ . }}
                  key: AWS_SECRET_ACCESS_KEY
            {{- end }}
            {{- end }}
            {{- if $usesObjectStore }}
            {{- include "quarry.objectStoreEnv" $root | nindent 12 }}
            {{- end }}
            {{- if eq $name "branch-manager" }}
            - name: QUARRY_BRANCH_MANAGER_WORKERS
              value: {{ int (default 0 $svc.workers) | quote }}
            {{- end }}
            {{- if has $name (list "committer" "s3-gateway") }}
            {{- /* Not `default 1`: it would turn 0 (one per core) into 1. */}}
            - name: {{ printf "QUARRY_%s_WORKERS" ($name | upper | replace "-" "_") }}
              value: {{ int (ternary 1 $svc.workers (kindIs "invalid" $svc.workers)) | quote }}
            {{- end }}
            {{- if eq $name "range-writer" }}
            - name: QUARRY_RANGE_WRITER_PROCESSES
              value: {{ int (default 0 $svc.processes) | quote }}
            {{- end }}
          {{- if $isHttp }}
          {{- /* /_health answers while the gateway (or console) serves; neither has a
          readiness gate (they answer 503 / an UNAVAILABLE page while branch-manager or
          committer are away). */}}
          {{- $handler := include "quarry.httpProbeHandler" (dict "root" $root "port" $svc.port) }}
          startupProbe:
            {{- $handler | nindent 12 }}
            {{- toYaml $V.probes.startup | nindent 12 }}
          livenessProbe:
            {{- $handler | nindent 12 }}
            {{- toYaml $V.probes.liveness | nindent 12 }}
          readinessProbe:
            {{- $handler | nindent 12 }}
            {{- toYaml $V.probes.readiness | nindent 12 }}
          {{- else }}
          {{- /* Startup and liveness ask whether the process serves at all (ServerInfo is
          SERVING from bind to shutdown); readiness asks the overall status, NOT_SERVING while
          a dependency is away: such a pod leaves the endpoints but is not restarted. */}}
          startupProbe:
            {{- include "quarry.probeHandler" (dict "root" $root "port" $svc.port "service" "quarry.v1.ServerInfo") | nindent 12 }}
            {{- toYaml $V.probes.startup | nindent 12 }}
          livenessProbe:
            {{- include "quarry.probeHandler" (dict "root" $root "port" $svc.port "service" "quarry.v1.ServerInfo") | nindent 12 }}
            {{- toYaml $V.probes.liveness | nindent 12 }}
          readinessProbe:
            {{- include "quarry.probeHandler" (dict "root" $root "port" $svc.port "service" "") | nindent 12 }}
            {{- toYaml $V.probes.readiness | nindent 12 }}
          {{- end }}
          {{- with $svc.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            {{- include "quarry.containerSecurityContext" $root | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            - name: cache
              mountPath: {{ $V.cache.dir }}
            {{- include "quarry.tlsVolumeMount" $root | nindent 12 }}
            {{- if $usesLocalData }}
            {{- include "quarry.localDataVolumeMount" $root | nindent 12 }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: {{ $V.tmpSizeLimit }}
        - name: cache
          emptyDir:
            sizeLimit: {{ $V.cache.sizeLimit }}
        {{- include "quarry.tlsVolume" $root | nindent 8 }}
        {{- if $usesLocalData }}
        {{- include "quarry.localDataVolume" $root | nindent 8 }}
        {{- end }}
      {{- if $V.topologySpread.enabled }}
      topologySpreadConstraints:
        - maxSkew: {{ $V.topologySpread.maxSkew }}
          topologyKey: {{ $V.topologySpread.topologyKey }}
          whenUnsatisfiable: {{ $V.topologySpread.whenUnsatisfiable }}
          labelSelector:
            matchLabels:
              {{- include "quarry.selectorLabels" . | nindent 14 }}
      {{- end }}
      {{- with $V.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $V.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $V.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}

{{/* One service's Service. Call with (dict "root" $ "name" "kv-gateway" "key" "kvGateway"). */}}
{{- define "quarry.service" -}}
{{- $root := .root -}}
{{- $svc := index $root.Values.services .key -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "quarry.componentName" . }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "quarry.labels" . | nindent 4 }}
  {{- with $root.Values.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ default $root.Values.service.type $svc.serviceType }}
  selector:
    {{- include "quarry.selectorLabels" . | nindent 4 }}
  ports:
    {{- if has .name (list "s3-gateway" "console") }}
    - name: http
      port: {{ $svc.port }}
      targetPort: http
      protocol: TCP
      appProtocol: {{ ternary "https" "http" $root.Values.tls.enabled }}
    {{- else }}
    - name: grpc
      port: {{ $svc.port }}
      targetPort: grpc
      protocol: TCP
      appProtocol: kubernetes.io/h2c
    {{- end }}
    - name: metrics
      port: {{ $svc.metricsPort }}
      targetPort: metrics
      protocol: TCP
      appProtocol: http
{{- end }}
