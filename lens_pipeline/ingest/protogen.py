"""Regenerate what protoc makes of the protocol files: `python -m lens_pipeline.ingest.protogen`
(needs grpcio-tools, the `protogen` extra).

- `exporter_pb2.py` from our `exporter.proto` (the original plus optional fields);
- the simulated node agents' descriptor set (`lens_pipeline/sim/exporter_contract.pb`) from the
  original `contract/exporter.proto` alone, so that they speak the original protocol without our
  generated code and without protoc at run time.

Both are committed (no build step for users, no protoc in the demo); tests check that each matches
what protoc makes of its .proto today. Lint is off for the module: it is protoc's code, not ours.
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parents[1]
PROTO = PACKAGE_DIR / "exporter.proto"
GENERATED = PACKAGE_DIR / "exporter_pb2.py"
CONTRACT = PACKAGE_DIR / "contract" / "exporter.proto"
AGENT_DESCRIPTORS = PACKAGE_DIR.parent / "sim" / "exporter_contract.pb"


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
    code = compile_descriptor_set(CONTRACT, AGENT_DESCRIPTORS)
    if code == 0:
        print(f"wrote {AGENT_DESCRIPTORS.relative_to(REPO_ROOT)}")
    return code


def compile_descriptor_set(proto: Path, out: Path) -> int:
    """protoc's FileDescriptorSet of `proto` and what it imports (struct.proto) into `out`."""
    from grpc_tools import protoc

    return protoc.main(
        [
            "protoc",
            f"-I{proto.parent}",
            f"-I{well_known_protos()}",
            f"--descriptor_set_out={out}",
            "--include_imports",
            proto.name,
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
