"""Regenerate kvstored/v1/*_pb2*.py from protos/ (run after editing a .proto).

Usage: python scripts/gen_protos.py [--out DIR]
The generated files are committed; tests/unit/test_protos_current.py checks they are current.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = pathlib.Path(__file__).resolve().parent.parent


def generate(out: pathlib.Path) -> None:
    protos = sorted((ROOT / "protos").rglob("*.proto"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT / 'protos'}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(p.relative_to(ROOT / "protos")) for p in protos],
    ]
    rc = protoc.main(args)
    if rc != 0:
        sys.exit(f"protoc failed with exit code {rc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT)
    generate(parser.parse_args().out)


if __name__ == "__main__":
    main()
