"""docs/api.md lists the gRPC contract's names: every service and RPC of protos/quarry/v1
appears under its service's heading, and every RPC the page names exists."""

import re
from pathlib import Path

from google.protobuf import descriptor

from quarry.v1 import (
    auth_pb2,
    branch_manager_pb2,
    committer_pb2,
    compactor_sensor_pb2,
    kv_pb2,
    range_writer_pb2,
    server_info_pb2,
)

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
MODULES = (
    kv_pb2,
    branch_manager_pb2,
    committer_pb2,
    compactor_sensor_pb2,
    range_writer_pb2,
    auth_pb2,
    server_info_pb2,
)


def _services() -> dict[str, descriptor.ServiceDescriptor]:
    return {
        service.name: service
        for module in MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
    }


def _sections() -> dict[str, str]:
    """`## Name (...)` heading → the text up to the next `## `."""
    text = API_DOC.read_text()
    parts = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    return {part.split()[0]: part for part in parts}


def test_every_service_and_rpc_of_the_protos_is_listed():
    sections = _sections()
    missing = []
    for name, service in _services().items():
        section = sections.get(name)
        if section is None:
            missing.append(name)
            continue
        missing.extend(
            f"{name}/{m.name}" for m in service.methods if not re.search(rf"\b{m.name}\(", section)
        )
    assert not missing, f"docs/api.md does not list: {missing}"


def test_every_rpc_the_page_names_exists():
    rpcs = {m.name for s in _services().values() for m in s.methods}
    messages = {name for module in MODULES for name in module.DESCRIPTOR.message_types_by_name}
    blocks = re.findall(r"```(.*?)```", API_DOC.read_text(), flags=re.DOTALL)
    named = {
        word
        for block in blocks
        for word in re.findall(r"(?:^|[\s/])([A-Z][a-z][A-Za-z]*)\(", block, flags=re.MULTILINE)
    }
    unknown = sorted(named - rpcs - messages - {"Entry", "Commit"})
    assert not unknown, f"docs/api.md names RPCs the protos do not have: {unknown}"
