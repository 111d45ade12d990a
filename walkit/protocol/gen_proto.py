"""Regenerate ``_bk_v3_pb2.py`` from ``bookkeeper.proto`` with grpcio-tools' protoc
(a test extra, not a runtime dependency; the runtime needs only ``protobuf``)::

    python -m walkit.protocol.gen_proto          # rewrite _bk_v3_pb2.py
    python -m walkit.protocol.gen_proto --check  # exit 1 if the checked-in file differs

The generated module is named ``_bk_v3_pb2`` (the .proto is compiled under that name in
a temporary directory) so it stays private to the package.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "bookkeeper.proto"
OUTPUT = HERE / "_bk_v3_pb2.py"


def generate() -> str:
    """The text protoc generates for bookkeeper.proto today."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "_bk_v3.proto"
        shutil.copyfile(PROTO, src)
        rc = protoc.main(["protoc", f"-I{tmp}", f"--python_out={tmp}", str(src)])
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}")
        return (Path(tmp) / "_bk_v3_pb2.py").read_text(encoding="utf-8")


def main(argv: list[str]) -> int:
    text = generate()
    if "--check" in argv:
        return 0 if OUTPUT.read_text(encoding="utf-8") == text else 1
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
