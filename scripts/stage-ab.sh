#!/usr/bin/env bash
# Builds the `dcp-mla` binaries of an A/B here, for scripts/ab-bench.py on the GPU machine:
#   ./scripts/stage-ab.sh [--stage NAME] NAME=PATCH ...     (PATCH "-": the tree as it is)
# For each NAME=PATCH: applies the patch (git apply), builds `dcp-mla` (release), copies it
# stripped to .ab/dcp-mla-NAME, and reverts exactly the patch (git apply -R). With --stage NAME,
# that build's test/bench bundle is also staged (scripts/gpu-stage.sh -> .gpu-stage/), so the
# device call can run its tests. Refuses to start on a tree with uncommitted changes to the
# files a patch touches. Then carry [".ab", ".gpu-stage"] (and ".anchors") and run, e.g.:
#   python3 scripts/ab-bench.py --rounds 3 main=.ab/dcp-mla-main lazy=.ab/dcp-mla-lazy
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
stage=""
if [ "${1:-}" = "--stage" ]; then
  stage=${2:?--stage takes a build name}
  shift 2
fi
[ $# -ge 1 ] || { echo "usage: $0 [--stage NAME] NAME=PATCH ..." >&2; exit 2; }
grep -qx '/.ab/' .git/info/exclude 2>/dev/null || echo '/.ab/' >> .git/info/exclude
mkdir -p .ab
./scripts/setup-cuda.sh >/dev/null
target="${CARGO_TARGET_DIR:-target}"
staged=no
for spec in "$@"; do
  name=${spec%%=*}
  patch=${spec#*=}
  [ -n "$name" ] && [ "$name" != "$spec" ] || { echo "not NAME=PATCH: $spec" >&2; exit 2; }
  what="the tree as it is"
  if [ "$patch" != "-" ]; then
    what="with $patch"
    [ -f "$patch" ] || { echo "no patch file: $patch" >&2; exit 2; }
    files=$(git apply --numstat "$patch" | cut -f3)
    if ! git diff --quiet HEAD -- $files; then
      echo "uncommitted changes in files $patch touches: commit or stash them first" >&2
      exit 2
    fi
    git apply "$patch"
    trap 'git apply -R "$patch"' EXIT
  fi
  echo "== $name: building dcp-mla ($what)" >&2
  cargo build --release -q -p dcp-mla-cli --bin dcp-mla
  cp "$target/release/dcp-mla" ".ab/dcp-mla-$name"
  strip ".ab/dcp-mla-$name" 2>/dev/null || true
  if [ "$name" = "$stage" ]; then
    ./scripts/gpu-stage.sh >/dev/null
    staged=yes
  fi
  if [ "$patch" != "-" ]; then
    git apply -R "$patch"
    trap - EXIT
  fi
done
[ -z "$stage" ] || [ "$staged" = yes ] || { echo "--stage $stage names no build" >&2; exit 2; }
ls -la .ab
