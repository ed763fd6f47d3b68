#!/usr/bin/env bash
# Builds the test, bench and CLI binaries here (release, stripped, no debug info) and packs them
# (and the Python wheel) into .gpu-stage/bundle.tar.xz, a git-ignored folder that the device run carries:
#   ./scripts/gpu-stage.sh            then, on the GPU machine (device tool, carry [".gpu-stage"]):
#   bash scripts/gpu-run.sh [tests|sanitize|bench|all]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
./scripts/setup-cuda.sh >/dev/null
stage="$root/.gpu-stage"
rm -rf "$stage" && mkdir -p "$stage/pack/tests" "$stage/pack/bin"
list=$(mktemp)
cargo test --release -p dcp-mla -p dcp-mla-cli -p dcp-mla-ffi --no-run --message-format=json-render-diagnostics >"$list"
cargo bench -p dcp-mla-cli --no-run --message-format=json-render-diagnostics >>"$list"
cargo build --release -p dcp-mla-cli --bin dcp-mla
python3 - "$list" "$stage/pack" <<'PY'
import json, shutil, sys, os
out = sys.argv[2]
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kinds = m["target"]["kind"]
    name = m["target"]["name"]
    if "bench" in kinds:
        dest = os.path.join(out, "bin", "bench-" + name)
    elif m["profile"]["test"]:
        pkg = m["package_id"]
        prefix = "ffi-" if "dcp-mla-ffi" in pkg or "/ffi#" in pkg else ("cli-" if "dcp-mla-cli" in pkg or "/cli#" in pkg else "")
        dest = os.path.join(out, "tests", prefix + ("lib" if "lib" in kinds else name))
    else:
        continue
    shutil.copy2(m["executable"], dest)
PY
target="${CARGO_TARGET_DIR:-target}"
cp "$target/release/dcp-mla" "$stage/pack/bin/dcp-mla"
# The C ABI: the shared library (for the Python client) and the C demo, which the ffi test
# compiles and links against the staticlib here (the GPU machine has no cargo).
cargo build --release -p dcp-mla-ffi
cargo test --release -p dcp-mla-ffi --test c_demo >/dev/null
cargo test --release -p dcp-mla-ffi --test c_abi_checks >/dev/null
cp "$target/release/libdcp_mla_ffi.so" "$target/release/dcp_mla_demo" "$target/release/dcp_mla_abi_checks" "$stage/pack/bin/"
# The Python package's wheel (its GPU tests run on the GPU machine's torch: gpu-run.sh python).
PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check "maturin>=1.5,<2"
maturin build --quiet --release -o "$stage/pack/wheels" >/dev/null
strip "$stage"/pack/tests/* "$stage"/pack/bin/* 2>/dev/null || true
# xz's large window stores the fatbins that every binary embeds about once.
tar -C "$stage/pack" -cf - . | xz -T2 -6e >"$stage/bundle.tar.xz"
rm -rf "$stage/pack" "$list"
ls -la "$stage"
