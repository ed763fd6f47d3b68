#!/usr/bin/env bash
# Runs on the GPU machine, from the repo root, with .gpu-stage carried (see scripts/gpu-stage.sh).
#   tests     every test binary with GPU tests included and required (a missing GPU fails them)
#   sanitize  the GPU tests under compute-sanitizer memcheck and racecheck
#   memcheck, racecheck   one of the two
#   racecheck-decode [FILTER]   racecheck of gpu_decode per schedule set (trio_split,quad; trio,pair), ~3 min
#   racecheck-topk   racecheck of gpu_topk one test a run, the local top-k split by K and schedule family
#   bench     `dcp-mla bench` (every row against its target) and the GPU demo
#   criterion the criterion benchmarks (benches/*.rs)
#   python    the Python package's pytest suite on the GPU (python/tests) and its launch overhead
#   multi     the multi-GPU decode-step test over all GPUs and the step benchmark
#   all       tests, then sanitize, then bench
# Logs go to $OUT (when set) so the device tool brings them back.
set -uo pipefail
mode=${1:-tests}
filter=${2:-}
out=${OUT:-/tmp/dcp-out}
logs=/tmp/dcp-logs
mkdir -p "$out" "$logs"
work=/tmp/dcp-stage
rm -rf "$work" && mkdir -p "$work"
tar -xJf .gpu-stage/bundle.tar.xz -C "$work" || { echo "no .gpu-stage/bundle.tar.xz: run scripts/gpu-stage.sh and carry .gpu-stage"; exit 2; }
# NVLink multicast stays off on shared machines.
export NCCL_NVLS_ENABLE=0
# tests/cli.rs runs the staged binary rather than the path it was built at.
export DCP_MLA_BIN="$work/bin/dcp-mla"
# The C ABI's staged pieces: the C demo (tests/ffi-c_demo runs it), the C ABI checks (tests/ffi-c_abi_checks) and the shared library.
export DCP_MLA_DEMO="$work/bin/dcp_mla_demo" DCP_MLA_LIB="$work/bin/libdcp_mla_ffi.so"
export DCP_MLA_ABI_CHECKS="$work/bin/dcp_mla_abi_checks"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
skips=()
[ "$gpus" -ge 2 ] || skips+=(--skip decode_step_across_gpus)
# Under a sanitizer: the 8.6 GB buffer test takes far too long, and the trap test's children trap
# on purpose, which the sanitizers report as errors.
sanitizer_skips=(--skip beyond_2_pow_31 --skip reuse_of_a_foreign_schedule_traps)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader || true
status=0
run_tests() {
  local pattern=$1; shift
  local wrap=("$@")
  for t in "$work"/tests/$pattern; do
    name=$(basename "$t")
    echo "=== ${wrap[*]:-} $name"
    log="$logs/$name${wrap:+-${wrap[2]:-x}}${LOGTAG:+-$LOGTAG}.log"
    "${wrap[@]}" "$t" --include-ignored --test-threads=1 "${skips[@]}" $filter >"$log" 2>&1
    rc=$?
    grep -E "^test .*(FAILED|ok)$|^test result|panicked|ERROR SUMMARY|^error" "$log" | tail -n 60
    [ $rc -eq 0 ] || { echo "FAILED: $name (exit $rc)"; status=1; }
  done
}
case "$mode" in
  tests) run_tests '*' ;;
  sanitize)
    skips+=("${sanitizer_skips[@]}")
    # Only the binaries that launch kernels.
    run_tests 'gpu_*' compute-sanitizer --tool memcheck --error-exitcode 99
    run_tests 'gpu_*' compute-sanitizer --tool racecheck --error-exitcode 99 ;;
  racecheck-decode)
    # Racecheck of the shipping decode schedules, one schedule set a run so that each fits a device
    # call (the whole gpu_decode binary under racecheck does not finish in 380 s): trio_split with
    # quad, then trio with pair (every kv format keeps a path in each set). FILTER picks the tests,
    # by default the dense and sparse reference comparisons and growing_scores (both lazy-max
    # paths): `matches_reference match_reference`. H200, per set: growing_scores 19-21 s, the two
    # reference tests 65-69 s. FILTER=`sinks strided` runs the sink and view tests instead.
    skips+=("${sanitizer_skips[@]}")
    [ -n "$filter" ] || filter="matches_reference match_reference"
    for set in trio_split,quad trio,pair; do
      export DCP_MLA_TEST_SCHEDULES=$set LOGTAG=${set/,/-}
      run_tests gpu_decode compute-sanitizer --tool racecheck --error-exitcode 99
    done
    unset DCP_MLA_TEST_SCHEDULES LOGTAG ;;
  racecheck-topk)
    # Racecheck of the shipping top-k kernels (the whole gpu_topk binary under racecheck did not
    # finish in 120 s: the cluster kernels): each test on its own, and the local top-k test once
    # per (K, schedule family), so that every run is small; each run's seconds are printed, and
    # the runs stop (failing) once 540 s have passed, so that the call's log comes back whole.
    # Not yet timed on a device: run it alone the first time.
    skips+=("${sanitizer_skips[@]}")
    start=$SECONDS
    for test in pack_matches_reference global_merge_matches_reference compact_matches_reference \
                graph_replay_reads_new_lengths_and_indices; do
      filter="--exact $test" LOGTAG=$test
      t0=$SECONDS
      run_tests gpu_topk compute-sanitizer --tool racecheck --error-exitcode 99
      echo "--- $test: $((SECONDS - t0)) s"
    done
    filter="--exact local_topk_matches_reference"
    for k in 256 512 1024 2048; do
      for family in cta cluster half; do
        if [ $((SECONDS - start)) -gt 540 ]; then echo "FAILED: out of time before K=$k $family"; status=1; break 2; fi
        export DCP_MLA_TEST_TOPK_K=$k DCP_MLA_TEST_TOPK_SCHEDULES=$family LOGTAG=local-$k-$family
        t0=$SECONDS
        run_tests gpu_topk compute-sanitizer --tool racecheck --error-exitcode 99
        echo "--- local top-k K=$k $family: $((SECONDS - t0)) s"
      done
    done
    unset DCP_MLA_TEST_TOPK_K DCP_MLA_TEST_TOPK_SCHEDULES LOGTAG ;;
  memcheck|racecheck)
    # One tool of `sanitize` (each fits a device call's 10 minutes on its own).
    skips+=("${sanitizer_skips[@]}")
    run_tests 'gpu_*' compute-sanitizer --tool "$mode" --error-exitcode 99 ;;
  bench)
    "$work/bin/dcp-mla" bench --json-out "$out/bench.json" 2>&1 | tee -a "$logs/bench.log" || status=1
    "$work/bin/dcp-mla" demo 2>&1 | tee -a "$logs/bench.log" || status=1 ;;
  python)
    # The Python package's wheel on the machine's torch: its whole pytest suite with the GPU
    # tests required, then the Python overhead per launch.
    rm -rf /tmp/dcp-py && PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --no-deps --no-index \
      --target /tmp/dcp-py "$work"/wheels/*.whl || status=1
    (cd /tmp && PYTHONPATH=/tmp/dcp-py DCP_MLA_REQUIRE_GPU=1 python3 -m pytest -q -rs "$OLDPWD/python/tests") 2>&1 \
      | tee -a "$logs/python.log" | tail -n 40
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    PYTHONPATH=/tmp/dcp-py python3 python/bench/launch_overhead.py "$out/python-overhead.json" 2>&1 \
      | tee -a "$logs/python.log" || status=1 ;;
  multi)
    # Every GPU of the machine as one DCP group, one process per GPU, then the step benchmark.
    "$work/tests/multi_gpu" --include-ignored --exact decode_step_across_gpus --nocapture 2>&1 | tee "$logs/multi_gpu.log" | grep -E "rank|test result|panicked|FAIL" | tail -n 60
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    DCP_MLA_BENCH_D=$gpus "$work/bin/bench-step" 2>&1 | tee "$logs/bench-step.log" | tail -n 40 ;;
  criterion)
    for b in "$work"/bin/bench-*; do "$b" --bench 2>&1 | tee -a "$logs/criterion.log"; done ;;
  all) "$0" tests "$filter" || status=1; "$0" sanitize "$filter" || status=1; "$0" bench || status=1 ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
# The device tool brings back at most 8 files: pack the logs into one.
tar -C "$logs" -czf "$out/logs.tar.gz" . 2>/dev/null || true
echo "gpu-run $mode: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
