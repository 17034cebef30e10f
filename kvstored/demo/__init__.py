"""``kvstored demo``: a real decoder skipping most of its prefill with prefix KV from kvstored.

Modules: ``cli`` (the click command, no torch at import), ``runner`` (the experiment),
``engine`` (prefix-caching prefill on transformers), ``models`` (SmolLM2 from its GGUF and
randomly initialised real architectures), ``corpus`` (pydoc documents and questions),
``store`` (the in-process dict store used as the reference), ``daemon`` (a private
``kvstored serve`` process). Importing this package does not import torch.
"""
