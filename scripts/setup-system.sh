#!/usr/bin/env bash
# System packages the tests use (Debian 12), run once as root: systemd (systemd-analyze verify
# and systemd-sysusers on the units in systemd/, tests/e2e/test_systemd_*.py).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends systemd
