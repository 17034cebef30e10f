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
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-D_GNU_SOURCE"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ],
)
