#!/usr/bin/env bash
# Regenerate the Python stubs for every kubelet .proto under src/rdmaplane/adapters/kubelet/proto/.
#
# Each proto/<api>/<version>/api.proto becomes the package rdmaplane.adapters.kubelet.api.<api>.<version>
# (api_pb2.py, api_pb2.pyi, api_pb2_grpc.py). protoc writes imports relative to the proto root
# (`from deviceplugin.v1beta1 import api_pb2`); they are rewritten to absolute package imports.
# The protoc bundled with grpcio-tools stamps a runtime version guard into each api_pb2.py; the
# script refuses to finish when that version is newer than the installed protobuf runtime.
#
# The .proto files are our own text, wire-compatible with upstream's. `--compare-upstream`
# fetches k8s.io/kubelet at the version upstream/go.mod pins (Go module proxy) and compares
# every file with upstream's pkg/apis/<api>/<version>/api.proto on the wire: package, services,
# methods and streaming, messages, field names, numbers, types and labels (exit 1 on a
# conflict; upstream fields we leave out are listed, a reader skips them). It generates nothing.
# A folder name with `_` stands for upstream's `-` (dra_health ↔ dra-health: a Python package).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PROTO_ROOT=src/rdmaplane/adapters/kubelet/proto

if [ "${1:-}" = "--compare-upstream" ]; then
  version=$(sed -n 's|^[[:space:]]*k8s.io/kubelet => k8s.io/kubelet \(v[0-9.]*\)$|\1|p' upstream/go.mod)
  [ -n "$version" ] || { echo "no k8s.io/kubelet replace line in upstream/go.mod" >&2; exit 1; }
  upstream=$( (cd upstream && go mod download -json "k8s.io/kubelet@$version") |
    "$PY" -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  exec "$PY" - "$PROTO_ROOT" "$upstream/pkg/apis" "k8s.io/kubelet@$version" <<'PYEOF'
import pathlib
import sys
import tempfile

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ours_root, theirs_root = map(pathlib.Path, sys.argv[1:3])
label = sys.argv[3]


def parse(root: pathlib.Path, rel: str) -> descriptor_pb2.FileDescriptorProto:
    with tempfile.NamedTemporaryFile(suffix=".pb") as out:
        if protoc.main(["protoc", f"-I{root}", f"--descriptor_set_out={out.name}", rel]) != 0:
            sys.exit(f"protoc failed on {root / rel}")
        (f,) = descriptor_pb2.FileDescriptorSet.FromString(pathlib.Path(out.name).read_bytes()).file
    return f


def messages(f: descriptor_pb2.FileDescriptorProto) -> dict[str, descriptor_pb2.DescriptorProto]:
    found = {}
    todo = [(f".{f.package}", m) for m in f.message_type]
    while todo:
        scope, m = todo.pop()
        found[f"{scope}.{m.name}"] = m
        todo += [(f"{scope}.{m.name}", n) for n in m.nested_type]
    return found


def compare(ours: descriptor_pb2.FileDescriptorProto, theirs: descriptor_pb2.FileDescriptorProto):
    """(conflicts, omissions): what would break the wire, and upstream fields we leave out
    (a reader skips unknown fields, so those only mean we do not see them)."""
    conflicts, omitted = [], []
    if ours.package != theirs.package:
        conflicts.append(f"package {ours.package} != {theirs.package}")
    def methods(f):
        return {
            (s.name, m.name): (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
            for s in f.service for m in s.method
        }
    if methods(ours) != methods(theirs):
        conflicts.append("services or methods differ")
    mine, upstream = messages(ours), messages(theirs)
    for name, m in sorted(upstream.items()):
        if name not in mine:
            omitted.append(f"message {name}")
            continue
        have = {x.number: x for x in mine[name].field}
        for x in m.field:
            y = have.pop(x.number, None)
            if y is None:
                omitted.append(f"{name}.{x.name} = {x.number}")
            elif (y.name, y.type, y.label, y.type_name) != (x.name, x.type, x.label, x.type_name):
                conflicts.append(f"{name} field {x.number}: {y.name} vs {x.name}")
        conflicts += [f"{name}.{y.name} = {n} not upstream" for n, y in have.items()]
    conflicts += [f"message {n} not upstream" for n in sorted(set(mine) - set(upstream))]
    return conflicts, omitted


failed = False
for path in sorted(ours_root.rglob("api.proto")):
    rel = str(path.relative_to(ours_root))
    upstream_rel = rel.replace("_", "-")
    if not (theirs_root / upstream_rel).exists():
        print(f"{rel}: CONFLICT: no pkg/apis/{upstream_rel} in {label}")
        failed = True
        continue
    conflicts, omitted = compare(parse(ours_root, rel), parse(theirs_root, upstream_rel))
    print(f"{rel}: {'CONFLICT: ' + '; '.join(conflicts) if conflicts else 'wire-compatible'}"
          + (f" (left out: {', '.join(omitted)})" if omitted else "") + f" with {label}")
    failed = failed or bool(conflicts)
sys.exit(1 if failed else 0)
PYEOF
fi
OUT=${OUT:-src/rdmaplane/adapters/kubelet/api}  # overridable, e.g. to check the committed stubs

mapfile -t protos < <(cd "$PROTO_ROOT" && find . -name '*.proto' | sed 's|^\./||' | sort)
if [ ${#protos[@]} -eq 0 ]; then
  echo "no .proto files under $PROTO_ROOT" >&2
  exit 1
fi

rm -rf "$OUT"
mkdir -p "$OUT"
"$PY" -m grpc_tools.protoc -I "$PROTO_ROOT" \
  --python_out="$OUT" --pyi_out="$OUT" --grpc_python_out="$OUT" "${protos[@]}"

# Packages for every generated folder, and absolute imports between generated modules.
echo '"""Generated by scripts/gen-protos.sh from ../proto; do not edit."""' > "$OUT/__init__.py"
find "$OUT" -mindepth 1 -type d | while read -r dir; do
  touch "$dir/__init__.py"
done
for p in "${protos[@]}"; do
  module=$(dirname "$p" | tr / .)
  find "$OUT" -name '*.py' -o -name '*.pyi' | xargs sed -i -E \
    "s/^from ${module//./\\.} import /from rdmaplane.adapters.kubelet.api.${module} import /"
done

"$PY" - "$OUT" <<'PYEOF'
import pathlib
import re
import sys

from google.protobuf import __version__ as runtime

guard = re.compile(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+)")
needed = {
    tuple(int(x) for x in m.groups())
    for f in pathlib.Path(sys.argv[1]).rglob("*_pb2.py")
    if (m := guard.search(f.read_text()))
}
have = tuple(int(x) for x in runtime.split(".")[:3])
for version in sorted(needed):
    if version > have:
        sys.exit(f"stubs need protobuf >= {version}, runtime is {runtime}: align grpcio-tools")
print(f"stubs guard protobuf {sorted(needed)}; runtime {runtime}")
PYEOF
