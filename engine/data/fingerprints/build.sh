#!/usr/bin/env bash
# Build the real fingerprint set: debootstrap root filesystems (suites x variants), real
# machine roles on top of them (apt inside the chroot), then measure each one with
# `engine fingerprint --rootfs DIR` inside our sandbox, its service started first, and store
# `{name, provenance, fingerprint}` as engine/data/fingerprints/<name>.json.
#
# Idempotent: a root filesystem is made once (a `.fp-ok` stamp marks it complete; a
# half-made one is removed and made again), a fingerprint is measured when its JSON is
# missing (FP_REMEASURE=1 measures all again). Root only. Root filesystems live under
# $FP_ROOTS (default /work/fp-roots), never in the repository.
#
#   engine/data/fingerprints/build.sh [bases|roles|measure|all]   (default: all)
#
# Environment: FP_ROOTS, FP_MIRROR (default http://deb.debian.org/debian), FP_JOBS
# (parallel debootstraps / apt runs, default 4), ENGINE (the engine binary, default
# target/release/engine under $CARGO_TARGET_DIR or ./target).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
ROOTS=${FP_ROOTS:-/work/fp-roots}
MIRROR=${FP_MIRROR:-http://deb.debian.org/debian}
JOBS=${FP_JOBS:-4}
ENGINE=${ENGINE:-${CARGO_TARGET_DIR:-$REPO/target}/release/engine}
LOG=$ROOTS/logs
mkdir -p "$ROOTS/base" "$ROOTS/role" "$ROOTS/cache" "$LOG"

SUITES=(bullseye bookworm trixie sid)
VARIANTS=(minbase buildd default)

[ "$(id -u)" = 0 ] || { echo "build.sh: run as root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "build.sh: apt-get install -y debootstrap" >&2; exit 1; }
DEBOOTSTRAP_VERSION=$(debootstrap --version | awk '{print $2}')

# One base: debootstrap SUITE with VARIANT into $ROOTS/base/SUITE-VARIANT.
make_base() {
  local suite=$1 variant=$2 dir=$ROOTS/base/$1-$2
  [ -e "$dir/.fp-ok" ] && return 0
  rm -rf "$dir"
  local v=(); [ "$variant" = default ] || v=(--variant="$variant")
  mkdir -p "$ROOTS/cache/$suite"
  local cmd=(debootstrap "${v[@]}" --cache-dir="$ROOTS/cache/$suite" "$suite" "$dir" "$MIRROR")
  echo "base $suite-$variant: ${cmd[*]}"
  if "${cmd[@]}" >"$LOG/base-$suite-$variant.log" 2>&1; then
    printf '%s\n' "${cmd[*]}" >"$dir/.fp-command"
    date -u +%Y-%m-%dT%H:%M:%SZ >"$dir/.fp-date"
    touch "$dir/.fp-ok"
  else
    echo "base $suite-$variant FAILED (see $LOG/base-$suite-$variant.log)" >&2
    return 1
  fi
}

bases() {
  # The suites in parallel (each its own package cache), a suite's variants one after the
  # other so the later ones reuse the cached packages.
  local pids=()
  for s in "${SUITES[@]}"; do
    ( for v in "${VARIANTS[@]}"; do make_base "$s" "$v" || true; done ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
}

# Machine roles: name | packages (apt-get install, recommends included as apt does by
# default) | the command that starts its service in the sandbox ('' when none) | the TCP port
# it listens on (the measurement waits for it; '' when none). mariadb-server starts on the
# bookworm default base only (on the minbase ones InnoDB fails: "Unknown/unsupported storage
# engine: InnoDB"); those three measurements fail and are left out. haproxy's
# `chroot` line is dropped (the sandbox keeps no CAP_SYS_CHROOT).
ROLES=(
  "web-nginx|nginx|nginx|80"
  "web-apache|apache2|apache2ctl start|80"
  "db-postgresql|postgresql|pg_ctlcluster \$(ls /etc/postgresql) main start|5432"
  "db-mariadb|mariadb-server|setsid /usr/sbin/mariadbd --user=mysql --innodb-buffer-pool-size=16M </dev/null >/dev/null 2>&1 &|3306"
  "cache-redis|redis-server|redis-server /etc/redis/redis.conf --daemonize yes|6379"
  "cache-memcached|memcached|memcached -d -u memcache -m 16|11211"
  "build-box|build-essential git|"
  "python-app|python3 python3-pip python3-venv|mkdir -p /srv/app && cd /srv/app && setsid python3 -m http.server 8000 </dev/null >/dev/null 2>&1 &|8000"
  "mail-postfix|postfix bsd-mailx|postfix start|25"
  "ssh-server|openssh-server|mkdir -p /run/sshd && /usr/sbin/sshd|22"
  "dns-bind|bind9 dnsutils|mkdir -p /run/named && chown bind /run/named && named -u bind|53"
  "cron-host|cron logrotate rsyslog|cron && rsyslogd|"
  "admin-tools|curl wget procps less vim-tiny iproute2 ca-certificates sudo rsync htop|"
  "proxy-haproxy|haproxy|sed -i '/^[[:space:]]*chroot/d' /etc/haproxy/haproxy.cfg && mkdir -p /run/haproxy && printf 'frontend web\\n  bind :8080\\n  default_backend app\\nbackend app\\n  server a 127.0.0.1:8000\\n' >>/etc/haproxy/haproxy.cfg && haproxy -D -f /etc/haproxy/haproxy.cfg -p /run/haproxy.pid|8080"
  "node-app|nodejs|setsid node -e \"require('http').createServer((q,r)=>r.end('ok')).listen(3000)\" </dev/null >/dev/null 2>&1 &|3000"
)
# (suite, base variant) pairs the roles are installed on.
ROLE_BASES=(bullseye:minbase bookworm:minbase trixie:minbase bookworm:default)

role_field() { local IFS='|'; read -r -a f <<<"$1"; printf '%s' "${f[$2]:-}"; }

# One role: a copy of the base with the role's packages installed by apt in a chroot
# (services kept from starting there by policy-rc.d, which is removed again).
make_role() {
  local suite=$1 variant=$2 spec=$3
  local role pkgs; role=$(role_field "$spec" 0); pkgs=$(role_field "$spec" 1)
  local base=$ROOTS/base/$suite-$variant dir=$ROOTS/role/$suite-$variant-$role
  [ -e "$dir/.fp-ok" ] && return 0
  [ -e "$base/.fp-ok" ] || { echo "role $suite-$variant-$role: no base" >&2; return 1; }
  rm -rf "$dir"
  cp -a --reflink=auto "$base" "$dir"
  rm -f "$dir/.fp-ok"
  printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"; chmod +x "$dir/usr/sbin/policy-rc.d"
  mount -t proc proc "$dir/proc"
  local cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $pkgs && apt-get clean"
  local ok=0
  echo "postfix postfix/main_mailer_type select Internet Site" >"$dir/tmp/debconf"
  echo "postfix postfix/mailname string mail.example.org" >>"$dir/tmp/debconf"
  if chroot "$dir" /bin/sh -c "debconf-set-selections /tmp/debconf; $cmd" >"$LOG/role-$suite-$variant-$role.log" 2>&1; then ok=1; fi
  umount "$dir/proc"
  rm -f "$dir/usr/sbin/policy-rc.d" "$dir/tmp/debconf"
  if [ $ok = 1 ]; then
    printf '%s\n' "$(cat "$base/.fp-command")" "chroot DIR sh -c '$cmd'" >"$dir/.fp-command"
    date -u +%Y-%m-%dT%H:%M:%SZ >"$dir/.fp-date"
    touch "$dir/.fp-ok"
    echo "role $suite-$variant-$role: ok"
  else
    echo "role $suite-$variant-$role FAILED (see $LOG/role-$suite-$variant-$role.log)" >&2
    return 1
  fi
}

roles() {
  local n=0
  for rb in "${ROLE_BASES[@]}"; do
    for spec in "${ROLES[@]}"; do
      make_role "${rb%%:*}" "${rb##*:}" "$spec" || true &
      n=$((n + 1))
      if [ $((n % JOBS)) = 0 ]; then wait; fi
    done
  done
  wait
}

# The start command of a role as run in the sandbox: the role's command, then a wait (at most
# 10 s) until its port is in LISTEN state in /proc/net/tcp{,6}.
start_script() {
  local start=$1 port=$2
  [ -n "$start" ] || return 0
  local s="$start"
  if [ -n "$port" ]; then
    local hex; hex=$(printf '%04X' "$port")
    s="$s"$'\n'"i=0; until grep -qE ':$hex [0-9A-F]+:[0-9A-F]+ 0A' /proc/net/tcp /proc/net/tcp6 2>/dev/null; do i=\$((i+1)); [ \$i -gt 100 ] && { echo 'port $port is not listening' >&2; exit 1; }; sleep 0.1; done"
  else
    s="{ $s; } && sleep 1"
  fi
  printf '%s' "$s"
}

# Measure DIR as NAME with the start command START (may be empty) and provenance PROV (a
# JSON object), into $HERE/NAME.json.
measure_one() {
  local name=$1 rootfs=$2 start=$3 prov=$4 out=$HERE/$1.json
  [ -e "$out" ] && [ "${FP_REMEASURE:-0}" != 1 ] && return 0
  local args=(fingerprint --rootfs "$rootfs" --name "$name" --provenance "$prov")
  [ -n "$start" ] && args+=(--start "$start")
  if "$ENGINE" "${args[@]}" >"$out.tmp" 2>"$LOG/measure-$name.log"; then
    mv "$out.tmp" "$out"; echo "measured $name"
  else
    rm -f "$out.tmp"; echo "measure $name FAILED: $(tail -c 300 "$LOG/measure-$name.log")" >&2
  fi
}

# Provenance fields of a built root filesystem.
prov_of() {
  local dir=$1 suite=$2 variant=$3 role=$4 pkgs=$5 start=$6
  jq -n --arg suite "$suite" --arg variant "$variant" --arg role "$role" --arg pkgs "$pkgs" \
    --arg start "$start" --arg mirror "$MIRROR" --arg deb "$DEBOOTSTRAP_VERSION" \
    --arg built "$(cat "$dir/.fp-date")" --rawfile cmd "$dir/.fp-command" \
    '{source: "debootstrap", suite: $suite, variant: $variant, role: $role,
      packages: (if $pkgs == "" then "the variant'"'"'s own set" else $pkgs end),
      service: (if $start == "" then null else $start end), mirror: $mirror,
      debootstrap: $deb, built: $built, command: ($cmd | rtrimstr("\n") | split("\n")),
      script: "engine/data/fingerprints/build.sh"}'
}

measure() {
  [ -x "$ENGINE" ] || { echo "build.sh: no engine binary at $ENGINE (cargo build --release -p engine)" >&2; exit 1; }
  local d
  for d in "$ROOTS"/base/*/; do
    d=${d%/}; [ -e "$d/.fp-ok" ] || continue
    local b; b=$(basename "$d"); local suite=${b%-*} variant=${b##*-}
    measure_one "debootstrap-$b" "$d" "" "$(prov_of "$d" "$suite" "$variant" base "" "")"
  done
  for d in "$ROOTS"/role/*/; do
    d=${d%/}; [ -e "$d/.fp-ok" ] || continue
    local b; b=$(basename "$d")
    local suite=${b%%-*} rest=${b#*-}; local variant=${rest%%-*} role=${rest#*-}
    local spec="" r
    for r in "${ROLES[@]}"; do [ "$(role_field "$r" 0)" = "$role" ] && spec=$r; done
    [ -n "$spec" ] || continue
    local start; start=$(start_script "$(role_field "$spec" 2)" "$(role_field "$spec" 3)")
    measure_one "$b" "$d" "$start" \
      "$(prov_of "$d" "$suite" "$variant" "$role" "$(role_field "$spec" 1)" "$(role_field "$spec" 2)")"
  done
  # The build machine itself.
  measure_one host-debian12 host "" \
    "$(jq -n '{source: "host", system: "the build machine'"'"'s own root filesystem (the sandbox'"'"'s `host` rootfs)"}')"
}

# engine/data/fingerprints/index.rs: every data file, compiled into the engine.
index() {
  local f
  {
    echo "// Generated by engine/data/fingerprints/build.sh (its \`index\` step): every data file."
    echo "&["
    for f in "$HERE"/*.json; do
      local n; n=$(basename "$f" .json)
      echo "    (\"$n\", include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/engine/data/fingerprints/$n.json\"))),"
    done
    echo "]"
  } >"$HERE/index.rs.tmp"
  mv "$HERE/index.rs.tmp" "$HERE/index.rs"
}

case "${1:-all}" in
  bases) bases ;;
  roles) roles ;;
  measure) measure; index ;;
  index) index ;;
  all) bases; roles; measure; index ;;
  *) echo "usage: build.sh [bases|roles|measure|index|all]" >&2; exit 2 ;;
esac
