#!/usr/bin/env bash
# Install spec-tuner as a systemd service from this checkout (`sudo make install-service`).
#
#   deploy/install.sh [--root DIR] [--no-provision]
#
# The service user without a login shell (sysusers.d), the unit, /etc/spec-tuner with the
# environment file (secrets: 0640 root:spec-tuner) and the reloadable TOML file (both kept
# when already there), and both engines built as the service user into the cache dir the
# unit uses, so the first start does not build them again. --root DIR installs into DIR
# instead of / (no user, owner, build or systemctl: what the tests check).
set -euo pipefail
cd "$(dirname "$0")/.."

root=""
provision=1
while (($#)); do
    case "$1" in
        --root) root="$2"; shift 2 ;;
        --no-provision) provision=0; shift ;;
        *) echo "usage: $0 [--root DIR] [--no-provision]" >&2; exit 2 ;;
    esac
done
live=$([[ -z "$root" ]] && echo 1 || echo 0)
app=/opt/spec-tuner
cache=/var/cache/spec-tuner

if ((live)) && [[ "$(id -u)" != 0 ]]; then
    echo "run as root: sudo make install-service" >&2
    exit 2
fi
if ((live)) && [[ "$(pwd)" != "$app" ]]; then
    echo "the unit runs $app/.venv/bin/tuner: clone the checkout to $app first" >&2
    exit 2
fi

install -D -m 0644 deploy/spec-tuner.sysusers "$root/usr/lib/sysusers.d/spec-tuner.conf"
if ((live)); then
    if command -v systemd-sysusers >/dev/null; then
        systemd-sysusers /usr/lib/sysusers.d/spec-tuner.conf
    elif ! id spec-tuner >/dev/null 2>&1; then
        useradd --system --shell /usr/sbin/nologin --home-dir /var/lib/spec-tuner \
            --no-create-home spec-tuner
    fi
fi

install -D -m 0644 deploy/spec-tuner.service "$root/etc/systemd/system/spec-tuner.service"
install -d -m 0750 "$root/etc/spec-tuner"
for file in spec-tuner.env spec-tuner.toml; do
    target="$root/etc/spec-tuner/$file"
    [[ -e "$target" ]] || install -m 0640 "deploy/$file.example" "$target"
done
if ((live)); then
    chown root:spec-tuner /etc/spec-tuner /etc/spec-tuner/spec-tuner.env \
        /etc/spec-tuner/spec-tuner.toml
fi

if ((live && provision)); then
    install -d -o spec-tuner -g spec-tuner -m 0750 "$cache"
    for engine in llama.cpp ik_llama.cpp; do
        runuser -u spec-tuner -- env HOME="$cache" TUNER_CACHE_DIR="$cache" \
            "$app/.venv/bin/tuner" provision --engine "$engine"
    done
fi
if ((live)); then
    systemctl daemon-reload
    echo "installed: edit /etc/spec-tuner/spec-tuner.env, then systemctl enable --now spec-tuner"
fi
