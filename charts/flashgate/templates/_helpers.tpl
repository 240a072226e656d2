{{/* Names and labels. */}}
{{- define "flashgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flashgate.fullname" -}}
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

{{- define "flashgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "flashgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flashgate
{{- end -}}

{{- define "flashgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flashgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: ratelimit
{{- end -}}

{{- define "flashgate.redis.fullname" -}}
{{- printf "%s-redis" (include "flashgate.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flashgate.redis.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flashgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end -}}

{{- define "flashgate.descriptorsConfigMap" -}}
{{- default (printf "%s-descriptors" (include "flashgate.fullname" .)) .Values.descriptors.existingConfigMap -}}
{{- end -}}

{{- define "flashgate.rlsConfigMap" -}}
{{- default (printf "%s-rls" (include "flashgate.fullname" .)) .Values.rls.existingConfigMap -}}
{{- end -}}

{{/* The Redis address flashgate uses, empty for the memory backend. */}}
{{- define "flashgate.redisAddress" -}}
{{- if and .Values.redis.enabled .Values.redis.address -}}
{{- fail "set redis.enabled (the chart's Redis) or redis.address (yours), not both" -}}
{{- end -}}
{{- if .Values.redis.enabled -}}
{{- printf "%s.%s.svc:6379" (include "flashgate.redis.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.redis.address -}}
{{- end -}}
{{- end -}}

{{/*
The value checks every rendering makes; configmap.yaml (rendered in both
shapes) and NOTES.txt include it, so a bad value set fails to render.
*/}}
{{- define "flashgate.validate" -}}
{{- $redis := include "flashgate.redisAddress" . -}}
{{- if and (not $redis) (not .Values.sidecar.enabled) (or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1)) -}}
{{- fail "the memory backend counts per pod: more than one replica needs redis.enabled or redis.address" -}}
{{- end -}}
{{- if and .Values.rls.enabled (not .Values.rls.existingConfigMap) (not .Values.rls.files) -}}
{{- fail "rls.enabled needs rls.files (file name → envoyproxy/ratelimit config) or rls.existingConfigMap" -}}
{{- end -}}
{{- $chartFlags := list "grpc-addr" "http-addr" "http-authz-addr" "http-authz-path-prefix" "grpc-tls-cert" "grpc-tls-key" "grpc-tls-client-ca" "backend" "redis-addr" "redis-mode" "redis-master-name" "redis-tls" "redis-username" "redis-password" "check-deadline" "config" "rls-config" "rls-response-headers" "failure-mode" "log-level" "log-format" "drain-timeout" -}}
{{- $serveFlags := list -}}
{{- range splitList "\n" (.Files.Get "files/serve-flags.txt") -}}
{{- if and . (not (hasPrefix "#" .)) -}}
{{- $serveFlags = append $serveFlags (trim .) -}}
{{- end -}}
{{- end -}}
{{- range $k, $_ := .Values.extraArgs -}}
{{- if hasPrefix "-" $k -}}
{{- fail (printf "extraArgs: %q: name the flag without dashes" $k) -}}
{{- end -}}
{{- if not (has $k $serveFlags) -}}
{{- fail (printf "extraArgs: flashgate serve has no flag --%s (the pod would not start; flashgate serve --help lists them)" $k) -}}
{{- end -}}
{{- if has $k $chartFlags -}}
{{- fail (printf "extraArgs: --%s is set by the chart from its own value (see docs/helm.md)" $k) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.grpcTLS.clientCA (not .Values.grpcTLS.secretName) -}}
{{- fail "grpcTLS.clientCA needs grpcTLS.secretName: mTLS is TLS with client certificates" -}}
{{- end -}}
{{- if and .Values.sidecar.enabled .Values.redis.enabled .Values.networkPolicy.enabled (not .Values.sidecar.podSelector) -}}
{{- fail "sidecar.podSelector is empty: it names the pods whose sidecars may reach the chart's Redis" -}}
{{- end -}}
{{- end -}}

{{/*
flashgate.container renders the flashgate container. Argument: a dict with
"root" (the chart's context) and "sidecar" (bool): as a sidecar the gRPC and
HTTP front-end listeners bind 127.0.0.1, as a central service every address
of the pod. The metrics port always binds every address: kubelet probes and
Prometheus connect to the pod IP.
*/}}
{{- define "flashgate.container" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $host := ternary "127.0.0.1" "" .sidecar -}}
{{- $redis := include "flashgate.redisAddress" $root -}}
name: flashgate
image: {{ printf "%s:%s" $v.image.repository $v.image.tag | quote }}
imagePullPolicy: {{ $v.image.pullPolicy }}
args:
  - --grpc-addr={{ $host }}:{{ $v.ports.grpc }}
  - --http-addr=:{{ $v.ports.metrics }}
  {{- with $v.grpcTLS.secretName }}
  - --grpc-tls-cert=/etc/flashgate/tls/tls.crt
  - --grpc-tls-key=/etc/flashgate/tls/tls.key
  {{- if $v.grpcTLS.clientCA }}
  - --grpc-tls-client-ca=/etc/flashgate/tls/ca.crt
  {{- end }}
  {{- end }}
  {{- if $v.httpAuthz.enabled }}
  - --http-authz-addr={{ $host }}:{{ $v.ports.httpAuthz }}
  {{- with $v.httpAuthz.pathPrefix }}
  - --http-authz-path-prefix={{ . }}
  {{- end }}
  {{- end }}
  {{- if $redis }}
  - --backend=redis
  - --redis-addr={{ $redis }}
  {{- with $v.redis.mode }}
  - --redis-mode={{ . }}
  {{- end }}
  {{- with $v.redis.masterName }}
  - --redis-master-name={{ . }}
  {{- end }}
  {{- if $v.redis.tls }}
  - --redis-tls=true
  {{- end }}
  {{- with $v.redis.username }}
  - --redis-username={{ . }}
  {{- end }}
  - --check-deadline={{ $v.checkDeadline }}
  {{- else }}
  - --backend=memory
  {{- end }}
  {{- if $v.descriptors.enabled }}
  - --config=/etc/flashgate/descriptors/{{ $v.descriptors.fileName }}
  {{- end }}
  {{- if $v.rls.enabled }}
  - --rls-config=/etc/flashgate/rls
  {{- if $v.rls.responseHeaders }}
  - --rls-response-headers=true
  {{- end }}
  {{- end }}
  - --failure-mode={{ $v.failureMode }}
  - --log-level={{ $v.logLevel }}
  - --log-format={{ $v.logFormat }}
  - --drain-timeout={{ $v.drainTimeout }}
  {{- range $k, $val := $v.extraArgs }}
  - {{ printf "--%s=%v" $k $val | quote }}
  {{- end }}
env:
  {{- with include "flashgate.gomemlimit" $root }}
  - name: GOMEMLIMIT
    value: {{ . | quote }}
  {{- end }}
  {{- if $v.redis.existingSecret }}
  - name: FLASHGATE_REDIS_PASSWORD
    valueFrom:
      secretKeyRef: {name: {{ $v.redis.existingSecret | quote }}, key: {{ $v.redis.existingSecretKey | quote }}}
  {{- end }}
  {{- with $v.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  {{- if not .sidecar }}
  - {name: grpc, containerPort: {{ $v.ports.grpc }}, protocol: TCP}
  {{- if $v.httpAuthz.enabled }}
  - {name: http-authz, containerPort: {{ $v.ports.httpAuthz }}, protocol: TCP}
  {{- end }}
  {{- end }}
  - {name: http-metrics, containerPort: {{ $v.ports.metrics }}, protocol: TCP}
# Ready = rules loaded and Redis answered (the gRPC health); NOT_SERVING while
# draining. Alive = the process answers, whatever Redis does.
startupProbe:
  httpGet: {path: /healthz, port: http-metrics}
  periodSeconds: 1
  failureThreshold: 30
readinessProbe:
  httpGet: {path: /readyz, port: http-metrics}
  periodSeconds: 2
  failureThreshold: 2
livenessProbe:
  httpGet: {path: /healthz, port: http-metrics}
  periodSeconds: 10
  failureThreshold: 3
securityContext:
  {{- toYaml $v.securityContext | nindent 2 }}
resources:
  {{- toYaml $v.resources | nindent 2 }}
lifecycle:
  preStop:
    sleep: {seconds: {{ $v.preStopSleepSeconds }}}
{{- if or $v.descriptors.enabled $v.rls.enabled $v.grpcTLS.secretName }}
volumeMounts:
  {{- if $v.descriptors.enabled }}
  # A directory, never subPath: kubelet swaps the ConfigMap's ..data symlink
  # on update and flashgate reloads.
  - {name: flashgate-descriptors, mountPath: /etc/flashgate/descriptors, readOnly: true}
  {{- end }}
  {{- if $v.rls.enabled }}
  - {name: flashgate-rls, mountPath: /etc/flashgate/rls, readOnly: true}
  {{- end }}
  {{- if $v.grpcTLS.secretName }}
  # The whole Secret, so its files change together; flashgate reloads them.
  - {name: flashgate-grpc-tls, mountPath: /etc/flashgate/tls, readOnly: true}
  {{- end }}
{{- end }}
{{- end -}}

{{/* flashgate.volumes renders the volumes flashgate.container mounts (a list, possibly empty). */}}
{{- define "flashgate.volumes" -}}
{{- $v := .Values -}}
{{- if $v.descriptors.enabled }}
- name: flashgate-descriptors
  configMap: {name: {{ include "flashgate.descriptorsConfigMap" . | quote }}}
{{- end }}
{{- if $v.rls.enabled }}
- name: flashgate-rls
  configMap: {name: {{ include "flashgate.rlsConfigMap" . | quote }}}
{{- end }}
{{- with $v.grpcTLS.secretName }}
- name: flashgate-grpc-tls
  secret: {secretName: {{ . | quote }}}
{{- end }}
{{- end -}}

{{- define "flashgate.redis.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "flashgate.redis.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flashgate
{{- end -}}

{{/* The labels of the Envoy pods that may call flashgate. */}}
{{- define "flashgate.envoySelector" -}}
{{- toYaml (default (dict "flashgate/client" "true") .Values.networkPolicy.envoySelector) -}}
{{- end -}}

{{/*
flashgate.gomemlimit: GOMEMLIMIT in bytes, 90% of resources.limits.memory
(empty without a limit). GOMEMLIMIT bounds only the Go runtime's memory,
and only softly: the container's limit also pays for what the runtime does
not count (thread stacks, socket buffers and page cache the cgroup charges)
and for the heap's overshoot while a collection runs. At 100% the kernel
kills the pod before the collector works harder; the 10% is that margin.
The Downward API gives the limit only whole, hence the arithmetic here.
*/}}
{{- define "flashgate.gomemlimit" -}}
{{- $q := dig "limits" "memory" "" .Values.resources -}}
{{- if not (kindIs "string" $q) -}}
{{- $q = printf "%d" (int64 $q) -}}
{{- end -}}
{{- if $q -}}
{{- $digits := regexFind "^[0-9]+" $q -}}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- $suffix := trimPrefix $digits $q -}}
{{- if or (not $digits) (not (hasKey $units $suffix)) -}}
{{- fail (printf "resources.limits.memory %q: write it as a whole number with one of the suffixes Ki, Mi, Gi, Ti, k, M, G, T or none (the chart sets GOMEMLIMIT to 90%% of it)" $q) -}}
{{- end -}}
{{- printf "%d" (div (mul (int64 $digits) (get $units $suffix) 9) 10) -}}
{{- end -}}
{{- end -}}
