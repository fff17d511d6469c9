#!/usr/bin/env bash
# The GPU figures of docs/gpu.md, in stages that each fit one short job on one GPU:
#
#   bench/gpu_suite.sh [--log_dir=DIR] STAGE [STAGE ...]       # STAGE: one below, or all
#
#   tests                tests/test_gpu.py (on a CPU too: they skip, saying why)
#   sample               batch-1 sampling at 124M: no cache, KV cache, compiled, with a profile
#   step, step_large     the compiled bf16 train step at 124M, batch 12,16 / 32,64 (NanoGPT's too
#                        when NANOGPT_DIR is set)
#   step_profile         the step at batch 12, then each model's time by GPU kernel
#   step_eager           the step without torch.compile, batch 12
#   shakespeare_a, _b    compare.py on config/train_shakespeare_char.py, two variants each
#   nanogpt_shakespeare  NanoGPT's own train.py on the same config: best val loss, wall time
#   llama, tinyllama     bench/bench_train.py on a 1B config, plain and FSDP (llama: the SDPA
#                        kernels of one head of 3072 too)
#   resume               torchrun runs (DDP over NCCL, then FSDP) resumed with more iterations
#
# Each stage writes its output to LOG_DIR/<stage>.log (default ./out-gpu-logs), after the machine
# and the commit. A stage stops at its first failing command; the others still run, and the suite
# exits 1 naming the failed ones. STAGE_TIMEOUT=SECONDS stops a stage that runs longer.
# SHAKESPEARE_TXT is the Tiny Shakespeare text; NANOGPT_DIR a NanoGPT checkout.
set -euo pipefail

STAGES=(tests sample step step_profile step_large step_eager shakespeare_a shakespeare_b
  nanogpt_shakespeare llama tinyllama resume)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHAKESPEARE_OUT=out-compare-shakespeare-gpu  # compare.py's folder for both halves
RESUME_WORK=out-gpu-suite/resume
RUN_TIMEOUT=${RUN_TIMEOUT:-240}  # seconds for each bench_train.py run before it is stopped
STAGE_TIMEOUT=${STAGE_TIMEOUT:-}  # seconds for each stage; none when empty
SCRIPT=$(realpath -- "${BASH_SOURCE[0]}")
export PYTHONUNBUFFERED=1

# an image with only python3 on PATH gets a `python` that runs it, for every command below; a
# wrapper, not a link: a venv's python must be run by its path
if ! command -v python >/dev/null && command -v python3 >/dev/null; then
  PYTHON_WRAPPER=$(mktemp -d)
  trap 'rm -rf "$PYTHON_WRAPPER"' EXIT  # subshells do not run it: only this script's end
  printf '#!/bin/sh\nexec %q "$@"\n' "$(command -v python3)" >"$PYTHON_WRAPPER/python"
  chmod +x "$PYTHON_WRAPPER/python"
  export PATH="$PYTHON_WRAPPER:$PATH"
fi

die() {
  echo "gpu_suite.sh: $*" >&2
  exit 1
}

# print the exact command, then run it
run() {
  printf '$'
  printf ' %q' "$@"
  printf '\n'
  "$@"
}

# -----------------------------------------------------------------------------
# what a stage needs, checked for every requested stage before any runs

CUDA_FOUND=""  # asked once: each ask imports torch
need_cuda() {
  if [[ -z $CUDA_FOUND ]]; then
    CUDA_FOUND=$(python -c 'import torch; print("yes" if torch.cuda.is_available() else "no")')
  fi
  [[ $CUDA_FOUND == yes ]] || die "$1: needs a CUDA GPU (torch.cuda.is_available() is False here)"
}

need_shakespeare() {
  [[ -n ${SHAKESPEARE_TXT:-} ]] || die "$1: set SHAKESPEARE_TXT to the Tiny Shakespeare text file"
  [[ -f $SHAKESPEARE_TXT ]] || die "$1: SHAKESPEARE_TXT=$SHAKESPEARE_TXT is not a file"
}

need_nanogpt() {
  [[ -n ${NANOGPT_DIR:-} ]] || die "$1: set NANOGPT_DIR to a checkout of NanoGPT"
  [[ -f $NANOGPT_DIR/train.py && -f $NANOGPT_DIR/data/shakespeare_char/prepare.py ]] \
    || die "$1: NANOGPT_DIR=$NANOGPT_DIR is not a checkout of NanoGPT"
}

preflight() {
  local stage=$1
  case $stage in
    tests) ;;
    shakespeare_a | shakespeare_b) need_cuda "$stage" && need_shakespeare "$stage" ;;
    nanogpt_shakespeare)
      need_cuda "$stage" && need_shakespeare "$stage" && need_nanogpt "$stage"
      python -c 'import requests' 2>/dev/null \
        || die "$stage: NanoGPT's prepare.py imports requests: pip install requests" ;;
    step | step_large | step_profile)
      need_cuda "$stage"
      [[ -z ${NANOGPT_DIR:-} || -f $NANOGPT_DIR/model.py ]] \
        || die "$stage: NANOGPT_DIR=$NANOGPT_DIR holds no model.py (a checkout of NanoGPT)" ;;
    *) need_cuda "$stage" ;;
  esac
}

describe_machine() {
  local commit
  commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')
  echo "# stage $1, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $commit"
  if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "(no nvidia-smi on PATH)"; fi
  python -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"cuDNN {torch.backends.cudnn.version()}, "
             f"GPU: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}")'
}

# -----------------------------------------------------------------------------
# the stages

stage_tests() {
  # most of the time is compilation, on the CPU: pytest-xdist's workers share it, where installed
  local workers=()
  if python -c 'import xdist' 2>/dev/null; then workers=(-n 6); fi
  run python -m pytest -q -rs "${workers[@]}" tests/test_gpu.py
}

stage_sample() {
  run python bench/bench_sample.py --device=cuda --compile --sizes 124M --repeats 3 --profile
}

train_step_bench() {
  local batch_sizes=$1 nanogpt=()
  shift
  if [[ -n ${NANOGPT_DIR:-} ]]; then
    nanogpt=(--nanogpt_dir="$NANOGPT_DIR")
  else
    echo "NANOGPT_DIR is not set: no NanoGPT row"
  fi
  run python bench/bench_model.py --device=cuda --compile --optimizer --shapes=gpt2 \
    --vocab_size=50304 --batch_sizes="$batch_sizes" "${nanogpt[@]}" "$@"
}

stage_step() { train_step_bench 12,16 --repeats=30; }
stage_step_profile() { train_step_bench 12 --repeats=10 --profile; }
stage_step_large() { train_step_bench 32,64 --repeats=20; }

stage_step_eager() {
  run python bench/bench_model.py --device=cuda --optimizer --shapes=gpt2 --vocab_size=50304 \
    --batch_sizes=12 --repeats=30
}

compare_shakespeare() {
  run python prepare_char.py --input="$SHAKESPEARE_TXT"
  run python compare.py config/train_shakespeare_char.py --out_dir="$SHAKESPEARE_OUT" \
    --variants="$1"
}

stage_shakespeare_a() { compare_shakespeare standard,optimized; }

stage_shakespeare_b() {
  compare_shakespeare efficient,super
  if [[ -f $SHAKESPEARE_OUT/standard-seed0/summary.json
        && -f $SHAKESPEARE_OUT/optimized-seed0/summary.json ]]; then
    # every run is finished: compare.py skips them all and writes the one table of the four
    run python compare.py config/train_shakespeare_char.py --out_dir="$SHAKESPEARE_OUT"
  else
    echo "shakespeare_a has not finished: run it, then this stage again for the table of all four"
  fi
}

# NanoGPT's commit, only where NANOGPT_DIR is a checkout's top (not an archive unpacked inside
# another repository, whose commit git would name)
nanogpt_commit() {
  local top
  if top=$(git -C "$NANOGPT_DIR" rev-parse --show-toplevel 2>/dev/null) \
    && [[ $top -ef $NANOGPT_DIR ]]; then
    git -C "$NANOGPT_DIR" rev-parse --short HEAD
  else
    echo '(not a git checkout)'
  fi
}

stage_nanogpt_shakespeare() {
  echo "NanoGPT at $(nanogpt_commit)"
  # NanoGPT's prepare.py downloads input.txt unless it is there
  run cp "$SHAKESPEARE_TXT" "$NANOGPT_DIR/data/shakespeare_char/input.txt"
  local output
  output=$(mktemp)
  (
    cd "$NANOGPT_DIR"
    run python data/shakespeare_char/prepare.py
    SECONDS=0
    run python train.py config/train_shakespeare_char.py | tee "$output"
    echo "NanoGPT wall time: ${SECONDS} s (train.py, compilation included)"
  )
  local best
  best=$(grep -o 'val loss [0-9.]*' "$output" | awk '{print $3}' | sort -g | head -n 1)
  echo "NanoGPT best val loss: $best"
  rm -f "$output"
}

train_throughput() {
  run python bench/bench_train.py "$1" --parallelisms=plain,fsdp --timeout="$RUN_TIMEOUT"
}

stage_llama() {
  run python bench/bench_attention_kernels.py --device=cuda
  train_throughput config/train_llama1b_efficient_c4.py
}

stage_tinyllama() { train_throughput config/train_tinyllama_standard_c4.py; }

# one torchrun process trains to max_iters; the same command with init_from=resume and more
# iterations must continue from the saved iteration and finish
resume_once() {
  local parallelism=$1 out=$RESUME_WORK/$1
  local train=(python -m torch.distributed.run --standalone --nproc_per_node=1 train.py
    config/quickstart.py --data_dir="$RESUME_WORK/data" --out_dir="$out"
    --parallelism="$parallelism" --device=cuda --compile=True)
  rm -rf "$out"
  run "${train[@]}" --max_iters=200
  run "${train[@]}" --max_iters=400 --init_from=resume | tee "$out.resume.out"
  grep -q "resuming from .* at iteration 200 " "$out.resume.out" \
    || die "resume ($parallelism): the resumed run did not say it continued from iteration 200"
  python -c 'import json, sys; s = json.load(open(sys.argv[1]))
sys.exit(s["iterations"] != 400 or s["iterations_this_run"] != 200)' "$out/summary.json" \
    || die "resume ($parallelism): summary.json does not show 200 more iterations, to 400"
  echo "resume ($parallelism): continued from iteration 200 and finished at 400"
}

stage_resume() {
  # that a resume equals an uninterrupted run is tests/test_gpu.py's; this is the command line
  run python prepare_char.py --corpus=stdlib --out_dir="$RESUME_WORK/data"
  resume_once ddp
  resume_once fsdp
}

# -----------------------------------------------------------------------------

# one stage, its output also in LOG_DIR/<stage>.log; it stops at its first failing command
run_stage() {
  local stage=$1
  echo "== $stage: $LOG_DIR/$stage.log"
  {
    describe_machine "$stage"
    "stage_$stage"
  } 2>&1 | tee "$LOG_DIR/$stage.log"
}

# every stage, also after one fails: each in a subshell with errexit on (in an `if` or `||` it
# would be off), or with STAGE_TIMEOUT this script again under `timeout`; 1 if any failed
run_stages() {
  local stage code failed=()
  for stage in "$@"; do
    set +e
    if [[ -n $STAGE_TIMEOUT ]]; then
      STAGE_TIMEOUT="" timeout --kill-after=30 "$STAGE_TIMEOUT" \
        bash "$SCRIPT" --log_dir="$LOG_DIR" "$stage"
    else
      (
        set -e
        run_stage "$stage"
      )
    fi
    code=$?
    set -e
    ((code != 124)) || echo "== $stage: stopped after STAGE_TIMEOUT=$STAGE_TIMEOUT s" \
      | tee -a "$LOG_DIR/$stage.log"
    ((code == 0)) || failed+=("$stage")
  done
  ((${#failed[@]} == 0)) || die "failed: ${failed[*]} (their logs are in $LOG_DIR)"
}

main() {
  local log_dir=${LOG_DIR:-out-gpu-logs} stages=() arg stage
  for arg in "$@"; do
    case $arg in
      --log_dir=*) log_dir=${arg#--log_dir=} ;;
      all) stages+=("${STAGES[@]}") ;;
      *) [[ " ${STAGES[*]} " == *" $arg "* ]] \
           || die "unknown stage '$arg'; choose among: ${STAGES[*]} all"
         stages+=("$arg") ;;
    esac
  done
  ((${#stages[@]})) || die "name a stage: ${STAGES[*]} all"
  mkdir -p "$log_dir"
  LOG_DIR=$(cd "$log_dir" && pwd)
  # paths given relative to where the suite was started, before it moves to the repository
  [[ -z ${SHAKESPEARE_TXT:-} ]] || SHAKESPEARE_TXT=$(realpath -m -- "$SHAKESPEARE_TXT")
  [[ -z ${NANOGPT_DIR:-} ]] || NANOGPT_DIR=$(realpath -m -- "$NANOGPT_DIR")
  cd "$REPO"
  for stage in "${stages[@]}"; do
    preflight "$stage"
  done
  run_stages "${stages[@]}"
}

main "$@"
