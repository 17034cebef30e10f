"""The master's client, public as ``kvstored.client.master.MasterClient`` (kvstorectl, which
imports only kvstored.client, and the cluster tests).

The implementation is :mod:`kvstored.transport.master_rpc`, below both the node and the
client; this module only names it for the client's users.
"""

from kvstored.transport.master_rpc import ClusterReplica, MasterClient

__all__ = ["ClusterReplica", "MasterClient"]
