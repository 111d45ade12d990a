"""Regenerate walkit's protobuf modules from their .proto files with grpcio-tools' protoc
(a test extra, not a runtime dependency; the runtime needs only ``protobuf``)::

    python -m walkit.protocol.gen_proto          # rewrite every generated module
    python -m walkit.protocol.gen_proto --check  # exit 1 if a checked-in module differs

The targets (:data:`TARGETS`): ``walkit/protocol/bookkeeper.proto`` -> ``_bk_v3_pb2.py``
(the bookie wire protocol) and ``walkit/metadata/bookkeeper.proto`` -> ``_bk_meta_pb2.py``
(the ZooKeeper metadata records). Each .proto is compiled under its module's name in a
temporary directory, so the generated modules stay private to their packages.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "bookkeeper.proto"
OUTPUT = HERE / "_bk_v3_pb2.py"
META_PROTO = HERE.parent / "metadata" / "bookkeeper.proto"
META_OUTPUT = HERE.parent / "metadata" / "_bk_meta_pb2.py"
#: (source .proto, generated module) pairs.
TARGETS: tuple[tuple[Path, Path], ...] = ((PROTO, OUTPUT), (META_PROTO, META_OUTPUT))


def generate(proto: Path = PROTO, output: Path = OUTPUT) -> str:
    """The text protoc generates today for ``proto`` compiled as ``output``'s module."""
    from grpc_tools import protoc

    name = output.name.removesuffix("_pb2.py")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{name}.proto"
        shutil.copyfile(proto, src)
        rc = protoc.main(["protoc", f"-I{tmp}", f"--python_out={tmp}", str(src)])
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}")
        return (Path(tmp) / output.name).read_text(encoding="utf-8")


def main(argv: list[str]) -> int:
    stale = 0
    for proto, output in TARGETS:
        text = generate(proto, output)
        if "--check" in argv:
            stale += output.read_text(encoding="utf-8") != text
        else:
            output.write_text(text, encoding="utf-8")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
