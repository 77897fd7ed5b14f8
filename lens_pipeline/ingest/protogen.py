"""Regenerate `exporter_pb2.py` from `exporter.proto`: `python -m lens_pipeline.ingest.protogen`.

The generated module is committed (no build step for users); a test checks that it matches the
.proto. Lint is off for it: it is protoc's code, not ours.
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parents[1]
PROTO = PACKAGE_DIR / "exporter.proto"
GENERATED = PACKAGE_DIR / "exporter_pb2.py"


def well_known_protos() -> str:
    """Where grpcio-tools keeps google/protobuf/*.proto (`struct.proto` for the event data)."""
    from importlib.resources import files

    return str(files("grpc_tools") / "_proto")


def main() -> int:
    from grpc_tools import protoc

    relative = PROTO.relative_to(REPO_ROOT)
    command = [
        "protoc",
        f"-I{REPO_ROOT}",
        f"-I{well_known_protos()}",
        f"--python_out={REPO_ROOT}",
        str(relative),
    ]
    code = protoc.main(command)
    if code != 0:
        return code
    GENERATED.write_text("# ruff: noqa\n" + GENERATED.read_text())
    print(f"wrote {GENERATED.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
