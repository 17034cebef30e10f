#!/usr/bin/env bash
# Install the system (apt) packages the tests need, only when they are missing:
#   etcd-server  (/usr/bin/etcd: the etcd the master-HA tests start on loopback ports)
#   systemd      (systemd-analyze verify and systemd-sysusers on the units in systemd/,
#                 tests/e2e/test_systemd_*.py)
#   nftables     (nft: tests/e2e/test_e2e_master_ha.py cuts one master's etcd port to show a
#                 leader cut off from etcd stops leading)
#   python3-pyverbs, rdma-core, ibverbs-providers (rdma-core 44: the verbs bindings
#                 kvstored/transport/rdma.py loads from /usr/lib/python3/dist-packages; the PyPI
#                 pyverbs sdist does not build against Debian 12, so it is not a pip dependency;
#                 tests/unit/transport/test_rdma.py builds work requests with the real classes)
# Without root, nothing is installed: it says what is missing and goes on (the tests that need
# the package then skip, or fail under CI=true).
set -euo pipefail
missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || missing+=(nftables)
/usr/bin/python3 -c "import pyverbs.device" >/dev/null 2>&1 || missing+=(python3-pyverbs rdma-core ibverbs-providers)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "setup-system: not root, so not installing ${missing[*]} (apt-get install -y ${missing[*]} as root)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
echo "setup-system: installed ${missing[*]}"
