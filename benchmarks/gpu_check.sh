#!/usr/bin/env bash
# gpu_check.sh — the prepared GPU check of crate_transformer: one call on a lent GPU machine, at most 8 minutes.
#
#   bash benchmarks/gpu_check.sh                 # on the GPU machine, from the project root
#   bash benchmarks/gpu_check.sh --dry-run       # on a CPU box: the same stages at tiny sizes (checks the plumbing)
#   bash benchmarks/gpu_check.sh --fetch-wheels .gpu/wheels   # once, where PyPI is reachable: the deps a GPU image
#                                                            # may lack, to carry along (the GPU machine is offline)
#
# Stages, each under its own timeout inside a total budget (GPU_CHECK_BUDGET, default 480 s); each stage's share is
# kept for it (a stage that runs long eats into the slow tests' time, not into the stages after it: SHARES below); a
# stage that fails or times out is reported and the script goes on (bench_gpu.py saves each row as it is measured).  Everything is
# printed and, when $OUT is set, kept there:
#   [setup]  the python to use: GPU_CHECK_PY, else the machine's python3 when its torch sees a GPU (in a venv that
#            sees its packages, with this package installed editable and missing deps from .gpu/wheels), else the
#            project's own install
#   [info]   GPU, driver, python / torch / CUDA / cuDNN versions, nvidia-smi, and a measured bf16 GEMM peak
#   [fast]   CRATE_TEST_DEVICE=cuda python -m pytest -m "not slow" (the device tests; the CPU tests skip, saying so);
#            failures in $OUT/pytest_fast.txt and $OUT/pytest_fast.xml
#   [bench]  benchmarks/bench_gpu.py: CRATE-T/S/B/L training steps in bf16 against the official formulation and a
#            ViT, eager and compiled (B), MFU, crate train against the model alone (eager and compiled), and the
#            attention operators (TSSA / MSSA / softmax, 1k-64k tokens); $OUT/bench_gpu.json
#   [decode] benchmarks/bench_gpu.py's decoding rows: crate_gpt_base-sized CRATE-GPT vs GPT, batch 1 and 8, fp32 and
#            bf16, eager and compiled (static cache, a CUDA graph per token); $OUT/bench_decode.json
#   [profile] benchmarks/bench_gpu.py --profile B: one training step of CRATE-B and ViT-B, eager and compiled, under
#            torch.profiler: the step's GPU time split into GEMM / attention / norm / optimizer / the rest, kernels
#            per step and the heaviest kernels by name (where the time between the GEMMs goes), both eager rows
#            first (two compilations follow, about 25 s each on an H200); $OUT/bench_profile.json
#   [train]  `crate train --device cuda` (the documented value) on the digits, timed
#   [lm]     `crate train-lm --device cuda` on the built-in corpus, timed
#   [slow]   CRATE_TEST_DEVICE=cuda python -m pytest -m slow, in the time that is left; $OUT/pytest_slow.txt
# Environment: OUT, GPU_CHECK_BUDGET, GPU_CHECK_PY, GPU_CHECK_VENV (/tmp/crate-gpu-venv), GPU_CHECK_STAGES (default
# "info fast bench decode profile train lm slow"), BENCH_ARGS (extra bench_gpu.py arguments, e.g. "--sizes B --compile B"),
# DECODE_ARGS (extra arguments of the decode stage, e.g. "--decode-batches 1 --decode-new 64").

set -u
DEPS=(kornia kornia-rs lion-pytorch mlxtend webdataset braceexpand)

if [ "${1:-}" = "--fetch-wheels" ]; then
  dir=${2:?usage: gpu_check.sh --fetch-wheels DIR}
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir" "${DEPS[@]}"
  rc=$?; ls -la "$dir"; exit $rc
fi
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
LOGDIR=${OUT:-$WORK}
mkdir -p "$LOGDIR"
BUDGET=${GPU_CHECK_BUDGET:-480}
T0=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 MPLBACKEND=Agg TORCHINDUCTOR_CACHE_DIR=$WORK/inductor
SUMMARY=()
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
want() { [[ " ${GPU_CHECK_STAGES:-info fast bench decode profile train lm slow} " == *" $1 "* ]]; }

# Each stage's share of the budget in seconds (the first run measured set-up 22, info 5, fast 84, bench 173 before
# the compiled crate-train row and the attention rows, train 18, lm 12 + start-up; a compilation of CRATE-B or
# ViT-B about 25 s, so profile gets 60); slow gets what is left.
SHARES=(info:10 fast:90 bench:180 decode:90 profile:60 train:25 lm:20)
# kept_after NAME: the shares of the wanted stages after NAME, which NAME must leave untouched
kept_after() {
  local kv seen=0 sum=0
  for kv in "${SHARES[@]}"; do
    [ "$seen" = 1 ] && want "${kv%%:*}" && sum=$(( sum + ${kv##*:} ))
    [ "${kv%%:*}" = "$1" ] && seen=1
  done
  echo "$sum"
}

# stage NAME CAP CMD...: run CMD under min(CAP, what is left of the budget less the later stages' shares), record
# ok / FAILED / TIMEOUT and the time
stage() {
  local name=$1 cap=$2; shift 2
  local t s rc st
  t=$(( $(left) - 5 - $(kept_after "$name") )); [ "$cap" -lt "$t" ] && t=$cap
  if [ "$t" -lt 15 ]; then
    echo; echo "===== [$name] skipped: the ${BUDGET}s budget is spent"; SUMMARY+=("$name: skipped (no time left)")
    return
  fi
  echo; echo "===== [$name] (timeout ${t}s, $(( $(date +%s) - T0 ))s elapsed)"
  s=$(date +%s)
  timeout -k 10 "$t" bash -c '"$@"' _ "$@"; rc=$?  # bash -c: the exported functions below run as commands too
  case $rc in 0) st=ok ;; 124|137) st=TIMEOUT ;; *) st="FAILED rc=$rc" ;; esac
  SUMMARY+=("$(printf '%-6s %-14s %4ss' "$name" "$st" $(( $(date +%s) - s )))")
}

setup_python() {
  if [ -n "${GPU_CHECK_PY:-}" ]; then PY=$GPU_CHECK_PY; echo "python: GPU_CHECK_PY=$PY"; return 0; fi
  local sys_py venv ver wheels
  sys_py=$(command -v python3); venv=${GPU_CHECK_VENV:-/tmp/crate-gpu-venv}
  if "$sys_py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null; then
    # the image's python (itself a venv on the lent machines) has the CUDA torch: a venv that sees its packages
    # through a .pth file, this package installed into it without dependencies, the missing ones from wheels
    ver=$("$sys_py" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
    rm -rf "$venv" && "$sys_py" -m venv --without-pip "$venv" || return 1
    "$sys_py" -c 'import site, sysconfig; p = sysconfig.get_paths()
print("\n".join(dict.fromkeys([p["purelib"], p["platlib"], *site.getsitepackages()])))' \
      > "$venv/lib/$ver/site-packages/_gpu_image.pth"
    PY=$venv/bin/python
    wheels=$ROOT/.gpu/wheels
    if [ -d "$wheels" ]; then
      timeout 120 "$PY" -m pip install -q --no-index --no-deps --find-links "$wheels" "${DEPS[@]}" \
        || echo "WARNING: some wheels did not install"
    fi
    timeout 120 "$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT" \
      || { echo "WARNING: editable install failed; PYTHONPATH=$ROOT/src"; export PYTHONPATH=$ROOT/src; }
  elif [ -x "$ROOT/.venv/bin/python" ]; then
    PY=$ROOT/.venv/bin/python
  else
    PY=$(command -v python)
  fi
  "$PY" -c 'import torch, crate_transformer as ct; print("python ok: torch", torch.__version__, "crate_transformer",
ct.__version__, "from", ct.__file__)'
}

info() {
  "$PY" - <<'PYEOF'
import platform, subprocess, time
import torch
print(f"python {platform.python_version()}; torch {torch.__version__}; CUDA build {torch.version.cuda}; cuDNN "
      f"{torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU 0: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB, "
          f"bf16 {torch.cuda.is_bf16_supported()}, {torch.cuda.device_count()} visible")
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit", "--format=csv"],
                         capture_output=True, text=True).stdout.strip())
dev = "cuda" if torch.cuda.is_available() else "cpu"
n, reps = (8192, 20) if dev == "cuda" else (256, 2)
a, b = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
best = float("inf")
for _ in range(4):
    torch.cuda.synchronize() if dev == "cuda" else None
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize() if dev == "cuda" else None
    best = min(best, time.perf_counter() - t)
print(f"measured bf16 GEMM {n}^3: {2 * n**3 * reps / best / 1e12:.1f} TFLOP/s")
PYEOF
}

# run_pytest NAME MARKER [ARGS...]: the suite on the device under test (the CPU tests skip, saying so); the full
# report in $OUT/pytest_NAME.txt (and .xml), its failures and summary printed
run_pytest() {
  local name=$1 marker=$2; shift 2
  CRATE_TEST_DEVICE=$TEST_DEVICE "$PY" -m pytest -m "$marker" -p no:cacheprovider -rfE --durations=10 \
    --junitxml="$LOGDIR/pytest_$name.xml" "$@" > "$LOGDIR/pytest_$name.txt" 2>&1; local rc=$?
  grep -E "^(FAILED|ERROR) " "$LOGDIR/pytest_$name.txt" | head -40
  tail -n 12 "$LOGDIR/pytest_$name.txt"
  return $rc
}

timed() {  # timed LABEL CMD...: a command's wall time and its last lines
  local s; s=$(date +%s%N)
  "${@:2}" > "$WORK/timed.log" 2>&1; local rc=$?
  tail -n 4 "$WORK/timed.log"
  echo "$1: rc=$rc, wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
  return $rc
}
export -f info run_pytest timed

main() {
  echo "gpu_check.sh $(date -u +%FT%TZ) $(git -C "$ROOT" log -1 --oneline 2>/dev/null); budget ${BUDGET}s; out $LOGDIR"
  echo; echo "===== [setup]"
  setup_python || { echo "setup failed: nothing else can run"; return 1; }
  export PY WORK LOGDIR TEST_DEVICE=cuda
  local dev=cuda tests=() bench=(--e2e-compile) train=(--epochs 3) lm=(--epochs 1 --max-steps 300) size=B
  if [ "$DRY" = 1 ]; then  # the same stages at CPU sizes: a handful of device tests, tiny shapes, a few steps
    TEST_DEVICE=cpu; dev=cpu; tests=(tests/test_on_device.py -k "float64 or bf16"); bench=(--tiny --threads 1)
    train=(--epochs 1 --max-steps 5 --threads 1); lm=(--epochs 1 --max-steps 5 --threads 1 --sample-tokens 8)
    size=T
  fi
  want info && stage info 10 info
  want fast && stage fast 90 run_pytest fast "not slow" ${tests[@]+"${tests[@]}"}
  # shellcheck disable=SC2086
  want bench && stage bench 180 "$PY" benchmarks/bench_gpu.py ${bench[@]+"${bench[@]}"} --decode \
    --json "$LOGDIR/bench_gpu.json" ${BENCH_ARGS:-}
  # shellcheck disable=SC2086
  want decode && stage decode 90 "$PY" benchmarks/bench_gpu.py ${bench[@]+"${bench[@]}"} --sizes --compile \
    --e2e none --attention-tokens --decode base --json "$LOGDIR/bench_decode.json" ${DECODE_ARGS:-}
  want profile && stage profile 60 "$PY" benchmarks/bench_gpu.py ${bench[@]+"${bench[@]}"} --profile "$size" \
    --json "$LOGDIR/bench_profile.json"
  want train && stage train 25 timed "crate train --device $dev" "$PY" -m crate_transformer.cli train \
    --data digits --device "$dev" --no-progress --out "$WORK/train" "${train[@]}"
  want lm && stage lm 20 timed "crate train-lm --device $dev" "$PY" -m crate_transformer.cli train-lm \
    --device "$dev" --no-progress --out "$WORK/lm" "${lm[@]}"
  want slow && [ "$DRY" = 0 ] && stage slow 400 run_pytest slow slow
  echo; echo "===== summary ($(( $(date +%s) - T0 ))s of ${BUDGET}s; load average $(cut -d' ' -f1-3 /proc/loadavg))"
  printf '%s\n' "${SUMMARY[@]}"
}

main 2>&1 | tee "$LOGDIR/gpu_check.log"
