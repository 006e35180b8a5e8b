{{/* The chart's name, or nameOverride. */}}
{{- define "gpulens.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; objects add their component (-agent, -dashboard). */}}
{{- define "gpulens.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- if not (regexMatch "^[a-z][-a-z0-9]*$" .Release.Name) }}
{{- fail (printf "the release name %q begins the objects' names, and a Service's name is a DNS label: a letter, then letters, digits and '-'; choose a release name like that, or set fullnameOverride" .Release.Name) }}
{{- end }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The labels selectors use: stable across upgrades. */}}
{{- define "gpulens.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpulens.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels on every object. */}}
{{- define "gpulens.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "gpulens.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpulens
{{- with .Values.commonLabels }}
{{- include "gpulens.checkLabels" (dict "labels" . "at" "commonLabels") }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels from the values may not set a key the chart sets itself (helm.sh/chart and the app.kubernetes.io/
labels): written twice on an object, the last would win, and pods would no longer match their selectors. With
"common" (commonLabels, which the same object carries), neither may a key of those: a key written twice is
refused by the tools that read the YAML after Helm (kustomize, Flux, Argo CD's post-renderers).
Call with (dict "labels" MAP "at" "the.values.path" ["common" MAP]). */}}
{{- define "gpulens.checkLabels" -}}
{{- range $key, $_ := .labels -}}
{{- if or (hasPrefix "app.kubernetes.io/" $key) (eq $key "helm.sh/chart") -}}
{{- fail (printf "%s: %s is a label the chart sets itself; choose another key (set twice, pods no longer match their selectors)" $.at $key) -}}
{{- end -}}
{{- if hasKey ($.common | default dict) $key -}}
{{- fail (printf "%s: %s is in commonLabels too, and the object would carry the key twice; set it in one of them" $.at $key) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* image: REPOSITORY:TAG, the tag defaulting to the chart's appVersion. Call with (dict "image" ... "root" $). */}}
{{- define "gpulens.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) }}
{{- end }}

{{/* The agent's liveness and readiness check: GET /healthz over HTTP or HTTPS, or a TCP connect where the web
config requires a client certificate, which the kubelet cannot present. */}}
{{- define "gpulens.agentProbe" -}}
{{- $web := .Values.agent.webConfig -}}
{{- if and $web.existingSecret $web.requireClientCert -}}
tcpSocket:
  port: metrics
{{- else -}}
httpGet:
  path: /healthz
  port: metrics
  scheme: {{ if and $web.existingSecret $web.tls }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}
{{- end }}

{{/* The agents' URL scheme: https where their web config turns TLS on. */}}
{{- define "gpulens.agentScheme" -}}
{{- if and .Values.agent.webConfig.existingSecret .Values.agent.webConfig.tls }}https{{ else }}http{{ end }}
{{- end }}

{{/* A rule file's text as the chart ships it: with dashboard.externalURL set, the dashboard_url annotations
start with that address instead of the Prometheus external label gpulens_dashboard (a Go string literal in
the template; the schema keeps quotes, backslashes and braces out of it). Call with (dict "root" $ "path" PATH). */}}
{{- define "gpulens.ruleFile" -}}
{{- $text := .root.Files.Get .path -}}
{{- with .root.Values.dashboard.externalURL -}}
{{- $text = $text | replace "$externalLabels.gpulens_dashboard" (trimSuffix "/" . | quote) -}}
{{- end -}}
{{- $text -}}
{{- end }}

{{/* A duration in seconds, as a string: a Prometheus one (the schema's promDuration: one or more of a whole
number and ms, s, m, h, d, w or y) or a gpulens one (its duration: a number and ms, s, m, h, d or w, as
gpulens/units.py reads it). (include "gpulens.seconds" "1m30s") is "90", (include "gpulens.seconds" "1.5h")
"5400". */}}
{{- define "gpulens.seconds" -}}
{{- $units := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 "w" 604800.0 "y" 31536000.0 -}}
{{- $seconds := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h|d|w|y)" . -1 -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- $seconds = addf $seconds (mulf (float64 $number) (get $units (trimPrefix $number .))) -}}
{{- end -}}
{{- $seconds -}}
{{- end }}

{{/* A duration the agent bounds (agent/config.py), checked here so that a wrong one fails the install rather
than crash-loop every agent pod. The schema has already checked its form. Call with (dict "value" VALUE "at"
"the.values.path" "low" SECONDS "high" SECONDS "range" "100ms to 1h"). */}}
{{- define "gpulens.checkDuration" -}}
{{- $seconds := float64 (include "gpulens.seconds" .value) -}}
{{- if or (lt $seconds (float64 .low)) (gt $seconds (float64 .high)) -}}
{{- fail (printf "%s: %s is out of range; give %s" .at .value .range) -}}
{{- end -}}
{{- end }}

{{/* A Kubernetes quantity of bytes in bytes, as a string: a number (256Mi, 1.5Gi, 500M, 1073741824) with one
of the suffixes k, M, G, T, Ki, Mi, Gi, Ti or none; "" for any other form (1e9, 128974848000m), which is left to
Kubernetes to read. */}}
{{- define "gpulens.bytes" -}}
{{- if kindIs "string" . -}}
{{- $units := dict "" 1.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- if and $number (hasKey $units (trimPrefix $number .)) -}}
{{- mulf (float64 $number) (get $units (trimPrefix $number .)) -}}
{{- end -}}
{{- else if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- float64 . -}}
{{- end -}}
{{- end }}

{{/* The agent's nodeSelector, as YAML: agent.nodeSelector as given; without it, and without an
agent.affinity.nodeAffinity that requires nodes instead, the GPU nodes by the label the GPU Operator's feature
discovery sets on them (a preferred term alone chooses no node: the agent would run on every node). "" where the
affinity alone chooses. */}}
{{- define "gpulens.agentNodeSelector" -}}
{{- $agent := .Values.agent -}}
{{- if $agent.nodeSelector -}}
{{- toYaml $agent.nodeSelector -}}
{{- else if not ((($agent.affinity).nodeAffinity).requiredDuringSchedulingIgnoredDuringExecution) -}}
nvidia.com/gpu.present: "true"
{{- end -}}
{{- end }}

{{/* The ServiceMonitors' scrape settings as Prometheus and the agent's web config take them: a timeout longer
than the interval is refused by Prometheus (its whole configuration, where the operator passes it on), a
tlsConfig beside a plain-HTTP agent is ignored by Prometheus, an agent that requires a client certificate
refuses every scrape that presents none, and a basic-auth key without its Secret names no password. */}}
{{- define "gpulens.checkServiceMonitor" -}}
{{- $monitor := .Values.serviceMonitor -}}
{{- $timeout := float64 (include "gpulens.seconds" $monitor.scrapeTimeout) -}}
{{- if gt $timeout (float64 (include "gpulens.seconds" $monitor.interval)) -}}
{{- fail (printf "serviceMonitor.scrapeTimeout: %s is longer than serviceMonitor.interval %s, which Prometheus refuses; give at most the interval" $monitor.scrapeTimeout $monitor.interval) -}}
{{- end -}}
{{- $web := .Values.agent.webConfig -}}
{{- if and $monitor.tlsConfig (not $web.tls) -}}
{{- fail "serviceMonitor.tlsConfig: without agent.webConfig.tls the agents are scraped over http, and Prometheus ignores a tlsConfig there; set agent.webConfig.tls=true (a web config with tls_server_config), or leave serviceMonitor.tlsConfig empty" -}}
{{- end -}}
{{- $tls := $monitor.tlsConfig | default dict -}}
{{- $cert := or $tls.cert $tls.certFile -}}
{{- $key := or $tls.keySecret $tls.keyFile -}}
{{- if and (or $cert $key) (not (and $cert $key)) -}}
{{- fail (printf "serviceMonitor.tlsConfig: a client %s without its %s (cert or certFile, keySecret or keyFile), which the Prometheus Operator refuses (and scrapes no agent); give both, or neither" (ternary "certificate" "key" (not (not $cert))) (ternary "key" "certificate" (not (not $cert)))) -}}
{{- end -}}
{{- if and $web.requireClientCert $web.tls (not $cert) -}}
{{- fail "serviceMonitor.tlsConfig: agent.webConfig.requireClientCert refuses a scrape without a client certificate; give serviceMonitor.tlsConfig.cert and keySecret (the operator's SafeTLSConfig)" -}}
{{- end -}}
{{- range $part := list "username" "password" -}}
{{- include "gpulens.checkSecretKey" (dict "secret" (get ($monitor.basicAuth | default dict) $part) "at" (printf "serviceMonitor.basicAuth.%s" $part)) -}}
{{- end -}}
{{- end }}

{{/* A Secret's {name, key}: a key without the name names no Secret (the chart mounts none; the operator finds
none). Call with (dict "secret" REF "at" "the.values.path"). */}}
{{- define "gpulens.checkSecretKey" -}}
{{- $ref := .secret | default dict -}}
{{- if and $ref.key (not $ref.name) -}}
{{- fail (printf "%s: a key without the Secret's name; give name too (the key alone names no Secret)" .at) -}}
{{- end -}}
{{- end }}

{{/* A container's security context beside its pod's, as the API server and the kubelet take them: Helm merges the
user's values into the defaults, so an override can contradict a default it did not mention (runAsUser 0 beside
runAsNonRoot), and the pod is then refused or never started. Call with (dict "pod" POD "container" CONTAINER "at"
"dashboard"). */}}
{{- define "gpulens.checkSecurityContext" -}}
{{- $pod := .pod | default dict -}}
{{- $container := .container | default dict -}}
{{- $nonRoot := $pod.runAsNonRoot -}}
{{- if hasKey $container "runAsNonRoot" }}{{ $nonRoot = $container.runAsNonRoot }}{{ end -}}
{{- $user := $pod.runAsUser -}}
{{- if hasKey $container "runAsUser" }}{{ $user = $container.runAsUser }}{{ end -}}
{{- if and $nonRoot (not (kindIs "invalid" $user)) (eq (toString $user) "0") -}}
{{- fail (printf "%s: runAsUser 0 beside runAsNonRoot true (podSecurityContext and securityContext together) is a container the kubelet never starts; set runAsNonRoot: false too, or another user" .at) -}}
{{- end -}}
{{- if eq (toString $container.allowPrivilegeEscalation) "false" -}}
{{- if $container.privileged -}}
{{- fail (printf "%s.securityContext: privileged true beside allowPrivilegeEscalation false is refused by the API server; set allowPrivilegeEscalation: true too, or privileged: false" .at) -}}
{{- end -}}
{{- if has "CAP_SYS_ADMIN" (($container.capabilities).add | default list) -}}
{{- fail (printf "%s.securityContext: capabilities.add CAP_SYS_ADMIN beside allowPrivilegeEscalation false is refused by the API server; set allowPrivilegeEscalation: true too, or drop the capability" .at) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* extraArgs that name a flag the chart sets from a value: the later flag would win over the chart's, past its
checks and its mounts, ports and probes (a ledger path off its volume, a port the Service does not expose). Each
item is a flag (values.schema.json): one with its value after a space reaches the program as one word, which it
refuses. With "known" (the program's flags, their --no- forms among them), "switches" (those of them that take no
value) and "program", a flag not among them, a value given to a switch, or a flag that takes a value given none
fails the install, not every pod at start. Call with (dict "args" LIST "at" "the.values.path" "set" (dict
"--flag" "the value that sets it" ...) ["known" LIST "switches" LIST "program" NAME]). */}}
{{- define "gpulens.checkExtraArgs" -}}
{{- range .args -}}
{{- $flag := regexFind "^--[^= ]+" (toString .) -}}
{{- $name := trimPrefix "no-" (trimPrefix "--" $flag) -}}
{{- $sets := get $.set (printf "--%s" $name) -}}
{{- if $sets -}}
{{- fail (printf "%s: %s is set by the chart from %s; set that value instead" $.at $flag $sets) -}}
{{- end -}}
{{- if and $flag (regexMatch "^--[^=]* " .) -}}
{{- fail (printf "%s: %q is a flag and its value in one item, which reaches the program as one word; write %s=VALUE" $.at . $flag) -}}
{{- end -}}
{{- if and $.known $flag (not (has $flag $.known)) -}}
{{- fail (printf "%s: %s is no flag of %s; `%s --help` lists them" $.at $flag $.program $.program) -}}
{{- end -}}
{{- if and $flag (has $flag ($.switches | default list)) (contains "=" .) -}}
{{- fail (printf "%s: %s takes no value; write --%s to turn it on or --no-%s to turn it off" $.at . $name $name) -}}
{{- end -}}
{{- if and $flag $.known (has $flag $.known) (not (has $flag ($.switches | default list))) (not (contains "=" .)) -}}
{{- fail (printf "%s: %s takes a value, which the next item cannot be (each item is a flag); write %s=VALUE" $.at $flag $flag) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* extraEnv that names the variable of a setting the chart sets from a value (GPULENS_ and the flag's name in
capitals, '.' and '-' as '_': agent/config.py): the chart's flag would win over it, and the value would be
ignored without a word. Call with (dict "env" LIST "at" "the.values.path" "set" (dict "--flag" "value" ...)). */}}
{{- define "gpulens.checkExtraEnv" -}}
{{- range $flag, $sets := .set -}}
{{- $variable := printf "GPULENS_%s" (trimPrefix "--" $flag | upper | replace "." "_" | replace "-" "_") -}}
{{- range $.env -}}
{{- if eq (toString .name) $variable -}}
{{- fail (printf "%s: %s is %s, which the chart sets from %s; set that value instead" $.at $variable $flag $sets) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* A server's URL as gpulens/urls.py takes it (the dashboard and the reclaim service refuse any other at
start): http(s)://HOST[:PORT][/PATH], no user:password@ (a pod's spec is readable to whoever reads pods), no query
or fragment, a port from 1 to 65535. Checked here so that the install fails, not the pod. Call with
(dict "value" URL "at" "the.values.path"). */}}
{{- define "gpulens.checkUrl" -}}
{{- if .value -}}
{{- if regexMatch "^[a-zA-Z]+://[^/?#]*@" .value -}}
{{- fail (printf "%s holds user:password@, which whoever reads the pod's spec can read; give the URL without it and its credentials in a Secret the chart mounts (basicAuthSecret)" .at) -}}
{{- end -}}
{{- if regexMatch "[?#]" .value -}}
{{- fail (printf "%s: %s has a query or fragment, which the API paths cannot follow; give the server's base URL" .at .value) -}}
{{- end -}}
{{- $port := "(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?" -}}
{{- if not (regexMatch (printf "^https?://([A-Za-z0-9._~-]+|\\[[0-9A-Fa-f:.]+\\])%s(/[^\\s]*)?$" $port) .value) -}}
{{- fail (printf "%s: %s is not http(s)://HOST[:PORT][/PATH] with a port from 1 to 65535; write e.g. http://prometheus.monitoring.svc:9090" .at .value) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* A client's CA and client certificate as the Prometheus Operator's SafeTLSConfig names them (ca, cert,
keySecret; each ca and cert from a Secret or a ConfigMap): fail unless cert and keySecret come together, and
unless the server they are for has an https:// URL (over http they would be ignored). Call with (dict "tls" TLS
"at" "the.values.path" "url" URL "urlAt" "the URL's values path"). */}}
{{- define "gpulens.checkTlsFiles" -}}
{{- if ne (empty .tls.cert) (empty .tls.keySecret) -}}
{{- fail (printf "%s: cert and keySecret go together (the client certificate and its key); set both or neither" .at) -}}
{{- end -}}
{{- if or .tls.ca .tls.cert -}}
{{- if not .url -}}
{{- fail (printf "%s needs %s: the files are how gpulens reaches that server" .at .urlAt) -}}
{{- end -}}
{{- if not (hasPrefix "https://" .url) -}}
{{- fail (printf "%s goes with an https:// URL, and %s is not one: the CA and client certificate would be ignored; give https://, or leave %s empty" .at .urlAt .at) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The volume of those files, as ca.crt, tls.crt and tls.key in one folder, 0440 for the pod's group
(fsGroup): the key is a secret. Call with (dict "name" VOLUME "tls" TLS). */}}
{{- define "gpulens.tlsFilesVolume" -}}
- name: {{ .name }}
  projected:
    defaultMode: 0440
    sources:
      {{- $files := dict }}
      {{- with .tls.ca }}{{ $_ := set $files "ca.crt" . }}{{ end }}
      {{- with .tls.cert }}{{ $_ := set $files "tls.crt" . }}{{ end }}
      {{- with .tls.keySecret }}{{ $_ := set $files "tls.key" (dict "secret" .) }}{{ end }}
      {{- range $path, $ref := $files }}
      {{- $kind := ternary "secret" "configMap" (hasKey $ref "secret") }}
      - {{ $kind }}:
          name: {{ (get $ref $kind).name }}
          items:
            - key: {{ (get $ref $kind).key }}
              path: {{ $path }}
      {{- end }}
{{- end }}

{{/*
The reclaim service's notify.yaml: reclaim.notify.settings, its state in the service's folder and the map file
of reclaim.notify.owners where the settings name none; "" without settings (no messages).
*/}}
{{- define "gpulens.reclaimNotify" -}}
{{- $notify := .Values.reclaim.notify }}
{{- if $notify.settings }}
{{- $settings := deepCopy $notify.settings }}
{{- if not (hasKey $settings "state") }}
{{- $_ := set $settings "state" "/var/lib/gpulens/reclaim/notify" }}
{{- end }}
{{- if $notify.owners }}
{{- $addresses := deepCopy ($settings.addresses | default dict) }}
{{- if not (hasKey $addresses "map_file") }}
{{- $_ := set $addresses "map_file" "/etc/gpulens/reclaim/owners.yaml" }}
{{- end }}
{{- $_ := set $settings "addresses" $addresses }}
{{- end }}
{{- toYaml $settings }}
{{- end }}
{{- end }}

{{/*
How a gpulens client reaches a Prometheus guarded as dashboard.prometheus describes (url, bearerTokenSecret or
basicAuthSecret, tlsConfig): the dashboard and, where it reads the same Prometheus, the reclaim service, which
checks it whether or not the dashboard is installed. Each fails on a setting that cannot work. Call with
(dict "prometheus" PROMETHEUS "at" "the.values.path").
*/}}
{{- define "gpulens.prometheusClientCheck" -}}
{{- $url := printf "%s.url" .at -}}
{{- include "gpulens.checkUrl" (dict "value" .prometheus.url "at" $url) -}}
{{- range $secret := list "bearerTokenSecret" "basicAuthSecret" -}}
{{- include "gpulens.checkSecretKey" (dict "secret" (get $.prometheus $secret) "at" (printf "%s.%s" $.at $secret)) -}}
{{- end -}}
{{- if and .prometheus.bearerTokenSecret.name .prometheus.basicAuthSecret.name -}}
{{- fail (printf "%s: set bearerTokenSecret or basicAuthSecret, not both (one Authorization header)" .at) -}}
{{- end -}}
{{- include "gpulens.checkTlsFiles" (dict "tls" (.prometheus.tlsConfig | default dict) "at" (printf "%s.tlsConfig" .at) "url" .prometheus.url "urlAt" $url) -}}
{{- end }}

{{/* Its flags by the value each comes from, as YAML, for gpulens.checkExtraArgs. */}}
{{- define "gpulens.prometheusClientFlags" -}}
--bearer-token-file: dashboard.prometheus.bearerTokenSecret
--basic-auth-file: dashboard.prometheus.basicAuthSecret
--ca-file: dashboard.prometheus.tlsConfig
--cert-file: dashboard.prometheus.tlsConfig
--key-file: dashboard.prometheus.tlsConfig
{{- end }}

{{/* Its flags, as list items: --bearer-token-file or --basic-auth-file, --ca-file, --cert-file and --key-file. */}}
{{- define "gpulens.prometheusClientArgs" -}}
{{- $tls := .prometheus.tlsConfig | default dict -}}
{{- if .prometheus.bearerTokenSecret.name }}
- --bearer-token-file=/etc/gpulens/prometheus/{{ .prometheus.bearerTokenSecret.key | default "token" }}
{{- end }}
{{- if .prometheus.basicAuthSecret.name }}
- --basic-auth-file=/etc/gpulens/prometheus/{{ .prometheus.basicAuthSecret.key | default "basic-auth" }}
{{- end }}
{{- if $tls.ca }}
- --ca-file=/etc/gpulens/prometheus-tls/ca.crt
{{- end }}
{{- if $tls.cert }}
- --cert-file=/etc/gpulens/prometheus-tls/tls.crt
- --key-file=/etc/gpulens/prometheus-tls/tls.key
{{- end }}
{{- end }}

{{/* Its volume mounts: the credentials at /etc/gpulens/prometheus, the TLS files at /etc/gpulens/prometheus-tls. */}}
{{- define "gpulens.prometheusClientMounts" -}}
{{- $tls := .prometheus.tlsConfig | default dict -}}
{{- if or .prometheus.bearerTokenSecret.name .prometheus.basicAuthSecret.name }}
- name: prometheus-credentials
  mountPath: /etc/gpulens/prometheus
  readOnly: true
{{- end }}
{{- if or $tls.ca $tls.cert }}
- name: prometheus-tls
  mountPath: /etc/gpulens/prometheus-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* Its volumes, readable by the pod's fsGroup and root, not by every user in the container as a Secret's default
0644 would be. */}}
{{- define "gpulens.prometheusClientVolumes" -}}
{{- $tls := .prometheus.tlsConfig | default dict -}}
{{- with (coalesce .prometheus.bearerTokenSecret.name .prometheus.basicAuthSecret.name) }}
- name: prometheus-credentials
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- if or $tls.ca $tls.cert }}
{{- /* Prometheus' CA and the client certificate (dashboard.prometheus.tlsConfig). */}}
{{- include "gpulens.tlsFilesVolume" (dict "name" "prometheus-tls" "tls" $tls) | nindent 0 }}
{{- end }}
{{- end }}

{{/*
A rule file's groups as the chart ships them, under the key groups: with prometheusRule's options applied
(runbookBaseURL, disabledAlerts, additionalAlertLabels), for the PrometheusRule and the rules ConfigMap alike.
Fails on a disabledAlerts name that no rule file has. Call with (dict "root" $ "path" PATH).
*/}}
{{- define "gpulens.ruleGroups" -}}
{{- $rules := .root.Values.prometheusRule -}}
{{- include "gpulens.checkDisabledAlerts" .root -}}
{{- $public := "https://github.com/gpulens/gpulens/blob/main/docs/runbooks/" -}}
{{- $text := include "gpulens.ruleFile" (dict "root" .root "path" .path) -}}
{{- if ne $rules.runbookBaseURL $public -}}
{{- /* Runbooks kept elsewhere: every runbook_url is that page, not the dashboard's Runbooks page that the
rules choose where the dashboard's address is known. */ -}}
{{- $text = regexReplaceAll `\{\{ with [^{}]+ \}\}\{\{ \. \}\}/runbook\?alert=\w+\{\{ else \}\}([^{}]+)\{\{ end \}\}` $text "${1}" | replace $public $rules.runbookBaseURL -}}
{{- end -}}
{{- $groups := list -}}
{{- range $group := (fromYaml $text).groups -}}
{{- $kept := list -}}
{{- range $rule := $group.rules -}}
{{- if not (has ($rule.alert | default "") $rules.disabledAlerts) -}}
{{- if $rule.alert -}}
{{- $_ := set $rule "labels" (merge (deepCopy ($rule.labels | default dict)) $rules.additionalAlertLabels) -}}
{{- end -}}
{{- $kept = append $kept $rule -}}
{{- end -}}
{{- end -}}
{{- $_ := set $group "rules" $kept -}}
{{- $groups = append $groups $group -}}
{{- end -}}
{{- toYaml (dict "groups" $groups) -}}
{{- end }}

{{/* Whether prometheusRule's options change the rules: "true", or "" where the files ship as they are. */}}
{{- define "gpulens.ruleOptionsSet" -}}
{{- $rules := .Values.prometheusRule -}}
{{- if or $rules.disabledAlerts $rules.additionalAlertLabels (ne $rules.runbookBaseURL "https://github.com/gpulens/gpulens/blob/main/docs/runbooks/") }}true{{ end -}}
{{- end }}

{{/* Fail on a prometheusRule.disabledAlerts name that is no alert of the chart's rule files: it would leave out
nothing, silently. */}}
{{- define "gpulens.checkDisabledAlerts" -}}
{{- $known := list -}}
{{- range $path, $_ := .Files.Glob "rules/*.rules.yml" -}}
{{- range $group := (fromYaml ($.Files.Get $path)).groups -}}
{{- range $rule := $group.rules -}}
{{- with $rule.alert }}{{ $known = append $known . }}{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range .Values.prometheusRule.disabledAlerts -}}
{{- if not (has . $known) -}}
{{- fail (printf "prometheusRule.disabledAlerts: no alert is named %s (the alerts are listed in docs/alerts.md)" .) -}}
{{- end -}}
{{- end -}}
{{- end }}
