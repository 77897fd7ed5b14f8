"""The protocol file is the original's plus optional fields under new numbers, and the committed
generated module is what protoc makes of it today."""

from __future__ import annotations

import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from lens_pipeline.ingest import exporter_pb2
from lens_pipeline.ingest.protogen import PROTO, REPO_ROOT, compile_descriptor_set, well_known_protos
from lens_pipeline.sim.node_agent import CONTRACT, DESCRIPTORS


def _compile(proto: Path, include: Path) -> descriptor_pb2.FileDescriptorProto:
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "set.pb"
        command = ["protoc", f"-I{include}", f"-I{well_known_protos()}", f"--descriptor_set_out={out}"]
        assert protoc.main([*command, str(proto.relative_to(include))]) == 0
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]


def test_ours_is_the_original_plus_optional_fields_with_new_numbers():
    original, ours = _compile(CONTRACT, CONTRACT.parent), _compile(PROTO, REPO_ROOT)
    assert ours.package == original.package == "exporter"
    old = {f.number: f for f in original.message_type[0].field}
    new = {f.number: f for f in ours.message_type[0].field}
    for number, field in old.items():
        assert (new[number].name, new[number].type, new[number].type_name, new[number].label) == (
            field.name,
            field.type,
            field.type_name,
            field.label,
        )
    added = [new[n] for n in new.keys() - old.keys()]
    assert added and all(f.proto3_optional for f in added)
    assert min(f.number for f in added) > max(old)
    methods, originals = (
        [
            (m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming)
            for m in proto.service[0].method
        ]
        for proto in (ours, original)
    )
    assert methods[: len(originals)] == originals  # new methods only after the original ones


def test_the_generated_module_matches_the_proto():
    compiled = _compile(PROTO, REPO_ROOT)
    shipped = descriptor_pb2.FileDescriptorProto.FromString(exporter_pb2.DESCRIPTOR.serialized_pb)
    for proto in (compiled, shipped):
        for message in proto.message_type:
            for field in message.field:
                field.ClearField("json_name")  # protoc's Python plugin leaves the defaults out
    assert shipped == compiled


def test_the_agents_descriptor_set_is_what_protoc_makes_of_the_original(tmp_path):
    """The simulated agents speak through the committed descriptor set: it is the original .proto
    compiled today (regenerate with `python -m lens_pipeline.ingest.protogen`)."""
    fresh = tmp_path / "set.pb"
    assert compile_descriptor_set(CONTRACT, fresh) == 0
    compiled = descriptor_pb2.FileDescriptorSet.FromString(fresh.read_bytes())
    shipped = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes())
    assert shipped == compiled
    assert [f.name for f in shipped.file] == ["google/protobuf/struct.proto", "exporter.proto"]
