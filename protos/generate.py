"""Generate the Python gRPC code of the wire contract into client/v1 (packfeed.client.v1).

    python protos/generate.py            # rewrite client/v1/packfeed_pb2{,_grpc}.py{,i}
    python protos/generate.py --check    # exit 1 when the committed files are stale

protoc maps protos/packfeed/v1/packfeed.proto (compiled with ``-I protos``) to the Python
module ``packfeed.v1.packfeed_pb2``, so the generated ``_grpc`` file says
``from packfeed.v1 import packfeed_pb2``. Our code lives in ``packfeed.client.v1`` (the client
package must import nothing outside ``packfeed.client``), so after protoc runs in a temporary
directory the one import line is rewritten to ``from packfeed.client.v1 import packfeed_pb2``.
The descriptor keeps the proto package ``packfeed.v1`` and the file name
``packfeed/v1/packfeed.proto``: the wire names (``/packfeed.v1.PackFeed/StreamBatches``) do not
depend on where the Python code lives.

Needs grpcio-tools; the output depends on its version (it pins the minimum protobuf and grpcio
runtime in the generated files), so regenerate with the version in the dev environment.
Pure: runs protoc in-process, no network.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

PROTO_ROOT = pathlib.Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PROTO_FILES = ("packfeed/v1/packfeed.proto",)
OUT_DIR = REPO_ROOT / "client" / "v1"
GENERATED = ("packfeed_pb2.py", "packfeed_pb2.pyi", "packfeed_pb2_grpc.py")
_IMPORT_FROM = "from packfeed.v1 import packfeed_pb2"
_IMPORT_TO = "from packfeed.client.v1 import packfeed_pb2"


def generate() -> dict[str, str]:
    """Run protoc on PROTO_FILES; return {file name: text} for the files in GENERATED."""
    import importlib.resources

    from grpc_tools import protoc

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *PROTO_FILES,
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        out = {}
        for name in GENERATED:
            text = (pathlib.Path(tmp) / "packfeed" / "v1" / name).read_text()
            if name.endswith("_grpc.py"):
                if _IMPORT_FROM not in text:
                    raise RuntimeError(f"protoc output changed: no {_IMPORT_FROM!r} in {name}")
                text = text.replace(_IMPORT_FROM, _IMPORT_TO)
            out[name] = text
    return out


def stale_files(out_dir: pathlib.Path = OUT_DIR) -> list[str]:
    """Names of generated files that are missing from ``out_dir`` or differ from protoc's."""
    fresh = generate()
    return [n for n, text in fresh.items() if not (out_dir / n).exists() or (out_dir / n).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: {OUT_DIR / name}", file=sys.stderr)
        return 1 if stale else 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in generate().items():
        (OUT_DIR / name).write_text(text)
        print(f"wrote {OUT_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
