"""A registry's Protobuf schema (``.proto`` text) as descriptors, for the ingest and the relay.

A schema registry stores Protobuf schemas as ``.proto`` source, and neither protobuf-java nor
Python's protobuf parses that: ``protoc`` (from grpcio-tools, which ships it and the
well-known types such as ``google/protobuf/timestamp.proto``) compiles it once into a
``FileDescriptorSet``, its imports first and the schema's own file last, which both the JVM
decoder (``io.tidemark.spark.ProtobufFromBytes``) and Python's ``DescriptorPool`` build from.
Schema references (an import of another subject, Confluent's ``references``) are followed:
the files they name are compiled beside the schema under the names it imports them by. A
schema's text and its imports' never change what they compile to, so each is compiled once
per process.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from tidemark.errors import ConfigError

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor

#: The file name a schema is compiled under (what its descriptor calls it).
SCHEMA_FILE = "schema.proto"

_COMPILED: dict[str, bytes] = {}
_LOCK = threading.Lock()


def compile_schema(text: str, what: str, imports: Mapping[str, str] | None = None) -> bytes:
    """``text`` (a ``.proto`` file) as a serialized ``FileDescriptorSet``, its imports first and
    the schema last; ``imports``: the files its schema references name, by import name
    (``connectors.registry.Registry.imports``); ``what`` names the schema in an error
    (``schema id 7 of subject x``)."""
    imports = dict(imports or {})
    key = hashlib.sha256("\0".join([text, *(f"{n}\0{t}" for n, t in sorted(imports.items()))]).encode()).hexdigest()
    with _LOCK:
        kept = _COMPILED.get(key)
    if kept is not None:
        return kept
    import grpc_tools

    if text.lstrip().startswith("{"):
        raise ConfigError(f"{what} is not a Protobuf schema (it reads as JSON: an Avro schema?); use "
                          "`format: avro` for this subject, or point the pipeline at a Protobuf subject")
    includes = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="tidemark-proto-") as tmp:
        for name, imported in imports.items():
            path = Path(tmp, name).resolve()
            if not path.is_relative_to(Path(tmp).resolve()) or name == SCHEMA_FILE:
                raise ConfigError(f"{what} imports {name!r} by a schema reference, a name Tidemark cannot place "
                                  f"(outside the import root, or {SCHEMA_FILE!r}); rename the reference")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(imported, encoding="utf-8")
        Path(tmp, SCHEMA_FILE).write_text(text, encoding="utf-8")
        out = Path(tmp, "set.pb")
        proc = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"-I{includes}",
                               "--include_imports", f"--descriptor_set_out={out}", SCHEMA_FILE],
                              cwd=tmp, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            detail = " ".join(proc.stderr.split())[:400]
            raise ConfigError(f"{what} does not compile as a .proto file ({detail}); it may import the well-known "
                              "google/protobuf types and what its schema references name")
        compiled = out.read_bytes()
    with _LOCK:
        _COMPILED[key] = compiled
    return compiled


@cache
def _pool_of(compiled: bytes) -> tuple[object, str]:
    from google.protobuf import descriptor_pb2, descriptor_pool

    files = descriptor_pb2.FileDescriptorSet.FromString(compiled).file
    pool = descriptor_pool.DescriptorPool()
    for file in files:
        pool.Add(file)
    return pool, files[-1].name


def messages(compiled: bytes) -> list[Descriptor]:
    """The schema file's top-level messages, in the order its message indexes count them."""
    pool, name = _pool_of(compiled)
    return list(pool.FindFileByName(name).message_types_by_name.values())  # type: ignore[attr-defined]


def message(compiled: bytes, full_name: str | None, what: str) -> Descriptor:
    """The message ``full_name`` (nested ones too), or the file's first when None."""
    tops = messages(compiled)
    if full_name is None:
        if not tops:
            raise ConfigError(f"{what} declares no message")
        return tops[0]
    pool, _ = _pool_of(compiled)
    try:
        return pool.FindMessageTypeByName(full_name)  # type: ignore[attr-defined, no-any-return]
    except KeyError:
        names = ", ".join(m.full_name for m in tops) or "none"
        raise ConfigError(f"{what} has no message {full_name!r} (its messages: {names}); set `message` to one "
                          "of them") from None


def indexes(descriptor: Descriptor) -> list[int]:
    """Confluent's message indexes of ``descriptor``: its place in the file, then in each message it nests in."""
    path: list[int] = []
    current: Descriptor | None = descriptor
    while current is not None:
        parent = current.containing_type
        siblings = (list(parent.nested_types) if parent is not None
                    else list(current.file.message_types_by_name.values()))
        path.append([s.full_name for s in siblings].index(current.full_name))
        current = parent
    return path[::-1]


def frame(schema_id: int, message_indexes: list[int], body: bytes) -> bytes:
    """``body`` in Confluent's Protobuf framing: magic byte 0, the id, the message indexes (their
    count then each, zig-zag varints; [0] alone as the single byte 0), the body."""
    head = bytearray(b"\x00") + schema_id.to_bytes(4, "big")
    if message_indexes == [0]:
        head.append(0)
    else:
        for number in (len(message_indexes), *message_indexes):
            head += _varint((number << 1) ^ (number >> 63))
    return bytes(head) + body


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low = number & 0x7F
        number >>= 7
        if number:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)
