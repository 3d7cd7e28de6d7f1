#!/usr/bin/env bash
# The GPU campaign: the paper's job on the hardware it was written for, in two commands of under 10
# minutes each on a GPU machine (one H100 here), every figure and log in one output folder.
#
#   bench/gpu_campaign.sh prepare                  # here, on the CPU, once: the carried folder .gpu/
#   bench/gpu_campaign.sh 1 --out DIR              # GPU: tests/gpu, training throughput (base, eager and
#                                                  #      compiled, against torch.nn.Transformer), big preset
#   bench/gpu_campaign.sh 2 --out DIR              # GPU: the default recipe, decoding speed, the GPU recipe
#   bench/gpu_campaign.sh all --out DIR            # GPU: both, in one command of under 10 minutes (a short
#                                                  #      loan): the light Multi30k steps at the same time
#   bench/gpu_campaign.sh profile --out DIR        # GPU: where a base step's time goes (bench/gpu/profile_step.py),
#                                                  #      the caching allocator's expandable segments, big too
#   bench/gpu_campaign.sh decide --out DIR         # GPU (#57): tests/gpu, the profile of a base step, the trainer's
#                                                  #      step against dc0e5c2's and each lever alone, the reference,
#                                                  #      compiled, big; about 9 minutes (rehearse-decide: here)
#   bench/gpu_campaign.sh rehearse --out DIR       # here: parts 1 and 2 on the CPU at tiny sizes
#   bench/gpu_campaign.sh rehearse-all --out DIR   # here: all on the CPU at tiny sizes (rehearse-profile: profile)
#
# With the device tool: run(command="bench/gpu_campaign.sh all --out $OUT", carry=[".gpu"], timeout_s=590)
# (a 15-minute loan: one call), or 1 then 2 where the loan is longer.
# Steps run in order of priority, each under a time cap (SIGINT, then SIGKILL); after each one the
# folder is packed again into DIR/campaign-part<N>.tar.gz and DIR/summary-part<N>.md is rewritten, so a
# command cut by its limit still returns every step that ended. No DVC and no MLflow there:
# the stages run with PIPELINE_TRACKING=off, and the few pure-Python packages they need that the GPU
# machine lacks travel as wheels in .gpu/wheels. A skipped GPU test fails there (GPU_TESTS_REQUIRED=1).
# docs/gpu.md says what each step measures and how the figures reach the README.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
CARRY=$REPO/.gpu

part=${1:-}
shift || true
OUT=
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    *) echo "error: unknown argument $1 (usage: bench/gpu_campaign.sh prepare|1|2|rehearse [--out DIR])" >&2; exit 2 ;;
  esac
done

if [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python; else PY=python3; fi

case $part in
  prepare) exec "$PY" -m bench.gpu.prepare ;;
  1|2) REHEARSE=0; PARTS=$part ;;
  all) REHEARSE=0; PARTS=all ;;
  profile) REHEARSE=0; PARTS=profile ;;
  rehearse-profile) REHEARSE=1; PARTS=profile ;;
  decide) REHEARSE=0; PARTS=decide ;;
  rehearse-decide) REHEARSE=1; PARTS=decide ;;
  rehearse) REHEARSE=1; PARTS="1 2" ;;
  rehearse-all) REHEARSE=1; PARTS=all ;;
  *) echo "error: usage: bench/gpu_campaign.sh prepare|1|2|all|profile|rehearse|rehearse-all|rehearse-profile|decide|rehearse-decide [--out DIR]" >&2; exit 2 ;;
esac
[ -n "$OUT" ] || { echo "error: --out DIR is required" >&2; exit 2; }
[ -d "$CARRY/multi30k" ] && [ -d "$CARRY/wmt14" ] && [ -d "$CARRY/baseline" ] || {
  echo "error: $CARRY is missing or incomplete: run bench/gpu_campaign.sh prepare here first, and carry .gpu" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

export PYTHONUNBUFFERED=1 MPLBACKEND=Agg PIPELINE_TRACKING=off
SITE=$(mktemp -d /tmp/gpu-campaign-site.XXXXXX)
if [ "$REHEARSE" = 0 ]; then
  # The GPU machine's own Python (torch with CUDA); the wheels it lacks, unpacked beside the repository.
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$CARRY"/wheels/*.whl \
    || { echo "error: the carried wheels did not install" >&2; exit 2; }
  export GPU_TESTS_REQUIRED=1
fi
export PYTHONPATH=$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}

WORK=
pack() {   # the part's folder, archived again (checkpoints left out: far over what a call returns); one at a time
  (
    flock 9
    "$PY" -m bench.gpu.summary "$WORK" > "$WORK/summary.md" 2> "$WORK/summary.err" || true
    cp "$WORK/summary.md" "$OUT/summary-part$PART.md"
    tar -czf "$OUT/.campaign-part$PART.tmp" --exclude='*/models' -C "$(dirname "$WORK")" "$(basename "$WORK")" \
      && mv "$OUT/.campaign-part$PART.tmp" "$OUT/campaign-part$PART.tar.gz"
  ) 9> "$WORK/.pack.lock"
}

step() {   # step NAME CAP_SECONDS COMMAND...: run it under its cap, log it, pack the results
  local name=$1 cap=$2; shift 2
  mkdir -p "$WORK/$name"
  echo "== part $PART, $name (cap ${cap} s): $*"
  echo "$*" > "$WORK/$name/command.txt"
  local start=$SECONDS
  timeout --signal=INT --kill-after=20 "$cap" "$@" > "$WORK/$name/log.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - start)) cap=$cap" | tee -a "$WORK/steps.txt"
  tail -n 15 "$WORK/$name/log.txt"
  pack
}

environment() {
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    # The carried folder names the commit it was made for; a .git copied to the GPU machine may be stale
    # (seen: the first campaign's said 579e75e for a tree at cfc5db8).
    echo "commit: $(cat "$CARRY/commit.txt") (.gpu made for it; git HEAD there: $(git rev-parse --short HEAD 2>/dev/null || echo none))"
    echo "host cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null \
      | sed 's/^/gpu: /' || echo "gpu: none"
    "$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda, '| device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
  }
}

M30K=$CARRY/multi30k/data
WMT=$CARRY/wmt14/train
if [ "$REHEARSE" = 1 ]; then
  DEVICE=cpu
  # The base and big presets' own layer counts and widths, cut down to seconds on a CPU.
  SMALL_SHAPE=(--d-model 64 --heads 2 --d-ff 128 --layers 1 --max-tokens 1500 --rounds 1 --steps 2 --warmup 1)
  THROUGHPUT=("${SMALL_SHAPE[@]}"); BIG=("${SMALL_SHAPE[@]}")
  RECIPES=(--rehearse); DECODE=(--max-sentences 40 --batch-sentences 20 --rounds 1)
  PROFILE=(--device cpu --d-model 64 --heads 2 --d-ff 128 --layers 1 --max-tokens 1500 --steps 3)
  STEPS=(--rounds 1 --windows 1 --log-every 2 --max-tokens 1500)
  CAP_TESTS=300; CAP_EAGER=120; CAP_COMPILED=300; CAP_BIG=120; CAP_DEFAULT=300; CAP_DECODE=120; CAP_RECIPES=300
  CAP_PROFILE=120; CAP_LEVERS=400
  BUDGET=0; DEADLINE=900
  [ "$PARTS" = all ] && CAP_RECIPES=180   # three candidates at once on two cores
else
  DEVICE=cuda
  THROUGHPUT=(--rounds 3 --steps 20 --warmup 5); BIG=(--rounds 2 --steps 10 --warmup 3)
  RECIPES=(); DECODE=(); PROFILE=(--device cuda --steps 8)
  STEPS=(--rounds 1 --windows 3 --log-every 10)
  CAP_TESTS=170; CAP_EAGER=130; CAP_COMPILED=190; CAP_BIG=80; CAP_DEFAULT=170; CAP_DECODE=50; CAP_RECIPES=360
  CAP_PROFILE=80; CAP_LEVERS=170
  BUDGET=$((CAP_RECIPES - 15))
  if [ "$PARTS" = all ]; then   # about 9 minutes in all, the Multi30k steps and the tests side by side
    CAP_EAGER=75; CAP_BIG=60; CAP_TESTS=150; CAP_DEFAULT=230; CAP_RECIPES=240; CAP_DECODE=45; CAP_COMPILED=190
    BUDGET=$((CAP_RECIPES - 15)); DEADLINE=565   # seconds from the start: compile gets what is left of them
  fi
  if [ "$PARTS" = decide ]; then   # about 9 minutes in all (#57)
    CAP_TESTS=100; CAP_EAGER=60; CAP_COMPILED=80; CAP_BIG=50
  fi
fi

STEP_FILES=
for PART in $PARTS; do
  WORK=$(mktemp -d /tmp/gpu-campaign.XXXXXX)/part$PART
  mkdir -p "$WORK"
  STEP_FILES="$STEP_FILES $WORK/steps.txt"
  TESTS=("$PY" -m pytest -q -p no:cacheprovider -rA tests/gpu)
  EAGER=("$PY" bench/train_throughput.py --device "$DEVICE" --preset base --token-store "$WMT" --precision bf16
         "${THROUGHPUT[@]}")
  COMPILED=("${EAGER[@]}" --compile)
  BIGRUN=("$PY" bench/train_throughput.py --device "$DEVICE" --preset big --token-store "$WMT" --precision bf16
          --no-reference "${BIG[@]}")
  DEFAULT=("$PY" -m bench.gpu.recipes --data "$M30K" --work "$WORK/multi30k_default/runs" --set default "${RECIPES[@]}")
  DECODING=("$PY" -m bench.gpu.decode --workspace "$WORK/multi30k_default/runs/default" --device "$DEVICE"
            "${DECODE[@]}")
  CANDIDATES=("$PY" -m bench.gpu.recipes --data "$M30K" --work "$WORK/multi30k_gpu/runs" --set candidates
              --budget-seconds "$BUDGET" "${RECIPES[@]}")
  environment | tee "$WORK/environment.txt"
  echo "rehearsal: $REHEARSE (1: CPU, tiny sizes; the figures mean nothing)" >> "$WORK/environment.txt"
  if [ "$PART" = 1 ]; then
    step gpu_tests "$CAP_TESTS" "${TESTS[@]}"
    step throughput_base_eager "$CAP_EAGER" "${EAGER[@]}"
    step throughput_base_compiled "$CAP_COMPILED" "${COMPILED[@]}"
    step big "$CAP_BIG" "${BIGRUN[@]}"
  elif [ "$PART" = profile ]; then
    # The first campaign's base and big trained at the same ~60k target tokens/s (docs/gpu.md): each step
    # timed, split and profiled, with the default allocator and with expandable segments; then big.
    PROFILING=("$PY" -m bench.gpu.profile_step --token-store "$WMT" "${PROFILE[@]}")
    step profile_base 120 "${PROFILING[@]}"
    step profile_base_expandable 120 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "${PROFILING[@]}"
    step profile_big 120 "${PROFILING[@]}" --preset big
    step throughput_base_eager 150 "${EAGER[@]}"
  elif [ "$PART" = decide ]; then
    # #57, in its order of priority: the trainer's own step (bench/train_step.py) on the WMT-shaped store, ours
    # against dc0e5c2's (carried as .gpu/baseline) and each lever alone in the same run; the same-precision
    # reference (train_throughput's ratio=); compiled; big with the default levers.
    STEPBENCH=("$PY" bench/train_step.py --device "$DEVICE" --precision bf16 --token-store "$WMT" "${STEPS[@]}")
    step gpu_tests "$CAP_TESTS" "${TESTS[@]}"
    step profile_base "$CAP_PROFILE" "$PY" -m bench.gpu.profile_step --token-store "$WMT" "${PROFILE[@]}"
    step levers_base "$CAP_LEVERS" "${STEPBENCH[@]}" --preset base --against "$CARRY/baseline" \
      --levers prefetch0,expandable,pad64
    step throughput_base_eager "$CAP_EAGER" "${EAGER[@]}"
    step compiled_base "$CAP_COMPILED" "${STEPBENCH[@]}" --preset base --levers compiled
    step big_step "$CAP_BIG" "${STEPBENCH[@]}" --preset big
  elif [ "$PART" = 2 ]; then
    step multi30k_default "$CAP_DEFAULT" "${DEFAULT[@]}"
    step decode "$CAP_DECODE" "${DECODING[@]}"
    step multi30k_gpu "$CAP_RECIPES" "${CANDIDATES[@]}"
  else
    # In order of priority. The throughput steps and decode have the GPU to themselves; the tests and
    # the Multi30k recipes (small models, bound by kernel launches) share it, so their wall times are
    # upper bounds of each alone (environment.txt says so). compile last: the first a short loan cuts.
    echo "side by side on the GPU: gpu_tests, multi30k_default, multi30k_gpu (its candidates at once too)" \
      >> "$WORK/environment.txt"
    step throughput_base_eager "$CAP_EAGER" "${EAGER[@]}"
    step big "$CAP_BIG" "${BIGRUN[@]}"
    (   # five processes side by side: CPU threads shared out, or OpenMP's spinning threads thrash the cores
      export OMP_NUM_THREADS=$(( $(nproc) / 5 > 0 ? $(nproc) / 5 : 1 ))
      step gpu_tests "$CAP_TESTS" "${TESTS[@]}" &
      step multi30k_default "$CAP_DEFAULT" "${DEFAULT[@]}" &
      step multi30k_gpu "$CAP_RECIPES" "${CANDIDATES[@]}" --parallel &
      wait
    )
    step decode "$CAP_DECODE" "${DECODING[@]}"
    left=$((DEADLINE - SECONDS))
    step throughput_base_compiled "$(( left < CAP_COMPILED ? (left > 30 ? left : 30) : CAP_COMPILED ))" "${COMPILED[@]}"
  fi
  echo "== part $PART done: $OUT/campaign-part$PART.tar.gz, $OUT/summary-part$PART.md"
  cat "$OUT/summary-part$PART.md"
done
rm -rf "$SITE"
FAILED=$(cat $STEP_FILES 2>/dev/null | grep -v ' rc=0 ' | cut -d' ' -f1 | tr '\n' ' ')
if [ -n "$FAILED" ]; then
  echo "steps that failed or were cut: $FAILED (the summaries say which and why)" >&2
  exit 1
fi
