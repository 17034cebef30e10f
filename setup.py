"""Optional C extension (kvstored._native); everything else is in pyproject.toml.

The extension is ``optional``: where it cannot be built (no compiler), ``pip install`` still
succeeds and kvstored.native falls back to its pure-Python copies (one log line says so).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvstored._native",
            sources=["native/copy.c"],
            # xxHash 0.8.1 (BSD-2-Clause), header-only: the one-sided readers' key hashing
            depends=["native/third_party/xxhash/xxhash.h"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-D_GNU_SOURCE"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
        Extension(
            "kvstored._native_master",
            # the master index's loops (kvstored/native.py master_index)
            sources=["native/master.c", "native/master_lookup.c"],
            depends=["native/master_buffers.h", "native/master_lookup.h", "native/master_hot.h"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        ),
    ],
)
