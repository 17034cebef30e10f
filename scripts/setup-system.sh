#!/usr/bin/env bash
# System packages kvstored uses outside its virtualenv (Debian 12), installed with apt.
#
#   sudo scripts/setup-system.sh
#
# - python3-pyverbs (rdma-core 44): the verbs bindings kvstored/transport/rdma.py loads
#   (kvstored.transport.rdma.load_pyverbs puts /usr/lib/python3/dist-packages on sys.path
#   for that import only). The PyPI pyverbs sdist does not build against Debian 12, so it is
#   not a pip dependency. rdma-core pulls ibverbs-providers (mlx5, rxe, efa, ...) and
#   iproute2's `rdma` tool (soft-RoCE: `modprobe rdma_rxe; rdma link add rxe0 type rxe
#   netdev eth0`, where the kernel ships the module).
# Idempotent: apt-get skips what is installed.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends python3-pyverbs rdma-core ibverbs-providers iproute2
/usr/bin/python3 -c "import pyverbs.device" && echo "pyverbs: importable"
