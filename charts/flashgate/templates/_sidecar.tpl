{{/*
The sidecar shape: flashgate in the application's pod, next to Envoy.

  flashgate.sidecar.container  the container (a map: indent it under "- ")
  flashgate.sidecar.volumes    the volumes it mounts (a list; may be empty)

Both take the chart's root context. The gRPC listener (ext_authz, RLS) and
the HTTP front-end bind 127.0.0.1: only containers of the same pod can call
them, so Envoy's cluster points at 127.0.0.1:PORTS.GRPC (9191). The
metrics port binds every address for kubelet's probes and Prometheus.

With sidecar.enabled, NOTES.txt prints both as a pod spec fragment to paste
(the ConfigMaps they name are this release's, so the pods must run in its
namespace); a parent chart that depends on this one can include them
directly:

  containers:
    - {{ include "flashgate.sidecar.container" .Subcharts.flashgate | indent 6 | trim }}
  volumes:
    {{- include "flashgate.sidecar.volumes" .Subcharts.flashgate | trim | nindent 4 }}

Give the pod terminationGracePeriodSeconds ≥ preStopSleepSeconds +
drainTimeout + 5s, and Envoy a shorter preStop sleep than flashgate's, so
flashgate leaves last.
*/}}
{{- define "flashgate.sidecar.container" -}}
{{- include "flashgate.container" (dict "root" . "sidecar" true) -}}
{{- end -}}

{{- define "flashgate.sidecar.volumes" -}}
{{- include "flashgate.volumes" . -}}
{{- end -}}
