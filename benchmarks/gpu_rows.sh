#!/usr/bin/env bash
# The GPU rows of benchmarks/models.py, prepared to fit a few minutes on a GPU machine:
# three streams at once (16 cores, one GPU), each step under its own time limit, so that a
# slow step costs only itself. Runs from the source tree with the machine's own torch.
#
#   bash benchmarks/gpu_rows.sh OUT [SECONDS]
#
# Stream A times the corpus (export, compile, ours + Inductor, Inductor) and carries the
# run-time figures; streams B and C check what needs a GPU but no clean timing:
# checkpointed training and the second size (B), Inductor's pattern matcher off, the CUDA
# tests, autocast and the diffusers rows (C). Their times share the machine with A's.
# Each stream's log lands in OUT; the tables (each stamped with its command, date, machine
# and commit), with their index page (benchmarks/publish.py), at the end in OUT/tables.tgz.
set -u
out=${1:?usage: gpu_rows.sh OUT [SECONDS]}
budget=${2:-520}
device=${DEVICE:-cuda}
tables=$(mktemp -d)
start=$SECONDS
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
models="python3 benchmarks/models.py --device $device --threads 4"

# step LOG LIMIT NAME ARGS...: one invocation, cut at LIMIT seconds or at the budget's end
step() {
  local log=$1 limit=$2 name=$3
  shift 3
  local left=$((budget - (SECONDS - start)))
  ((left < limit)) && limit=$left
  ((limit < 20)) && { echo "== $name: skipped (budget spent)" >>"$log"; return; }
  echo "== $name (limit ${limit} s): $*" >>"$log"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  echo "== $name: exit $? after $((SECONDS - start)) s" >>"$log"
}

stream_a() {
  local log=$out/a.log
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$log" 2>&1
  python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >>"$log" 2>&1
  step "$log" 300 timed-first $models --repeat 20 --entries export,compile,inductor \
    --models gpt2,llama,bert,vit,mixtral,qwen2_moe,t5_encoder --out "$tables/a1.md"
  step "$log" 400 timed-rest $models --repeat 20 --entries export,compile,inductor \
    --models clip_vision,resnet,convnext,swin,clip_text,albert,deberta_v2,t5,mistral,qwen2,gemma,phi,roberta,distilbert,bart,whisper_encoder \
    --out "$tables/a2.md"
}

stream_b() {
  local log=$out/b.log
  step "$log" 240 checkpointed-train $models --repeat 5 --entries train,train-ind \
    --checkpointing --models gpt2,bert,llama --out "$tables/b1.md"
  step "$log" 150 second-size $models --repeat 5 --entries second,second-ind,export-second \
    --models gpt2,llama,bert --out "$tables/b2.md"
  step "$log" 150 train $models --repeat 5 --entries train,train-ind \
    --models qwen2_moe,mixtral --out "$tables/b3.md"
}

stream_c() {
  local log=$out/c.log
  step "$log" 150 cuda-tests python3 -m pytest -q -p no:cacheprovider -W ignore -x \
    tests/test_triton.py tests/test_optable.py tests/test_backend_defaults.py
  step "$log" 120 pattern-matcher $models --repeat 10 --entries inductor \
    --inductor-option pattern_matcher=False --models gpt2,llama,bert,vit --out "$tables/c1.md"
  step "$log" 120 autocast $models --repeat 10 --entries compile,inductor --autocast bfloat16 \
    --models gpt2,llama,bert --out "$tables/c2.md"
  step "$log" 150 diffusers $models --repeat 10 --entries export,compile,inductor \
    --models vae,unet2d_cond,unet2d,dit --out "$tables/c3.md"
}

stream_a & stream_b & stream_c &
wait
python3 benchmarks/publish.py "$tables" >>"$out/a.log" 2>&1
tar -czf "$out/tables.tgz" -C "$tables" . 2>/dev/null
echo "done after $((SECONDS - start)) s"
