{{/*
The proxy container's environment: secrets as RAGPROXY_* variables (they take precedence over the config
file), then extraEnv. Shared by the Deployment and documented for the sidecar snippet.
*/}}
{{- define "ragproxy.env" -}}
- name: RAGPROXY_CONFIG
  value: /etc/ragproxy/config.yaml
{{- if include "ragproxy.hasSecret" . }}
{{- $secret := include "ragproxy.secretName" . }}
- name: RAGPROXY_ADMIN__TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: admin-token
      optional: true
- name: RAGPROXY_UPSTREAMS__QDRANT__API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: qdrant-api-key
      optional: true
- name: RAGPROXY_CACHE__L2__UPSTREAM_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: embedder-api-key
      optional: true
- name: RAGPROXY_ROUTING__SALT_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: routing-salt-secret
      optional: true
- name: RAGPROXY_REDIS__URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: redis-url
      optional: true
- name: RAGPROXY_UPSTREAMS__LLM
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: llm-upstreams
      optional: true
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
