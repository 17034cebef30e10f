"""Inference-engine integrations of kvstored.

* :mod:`kvstored.integrations.vllm`: ``KvstoredConnector``, a vLLM v1 KV connector (the only
  module of kvstored that imports vllm).
* :mod:`kvstored.integrations.blockio`: the engine-agnostic parts it is built on (extra-config
  model, block keys, the worker's load/save engine, counters); no vllm import, so it is tested
  in the main environment.
"""
