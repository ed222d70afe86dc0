#!/usr/bin/env bash
# The training numerics on a GPU, in one command (docs/local-backend.md, "Checking a GPU").
#
# On a CUDA machine that has torch, transformers and peft but no package registry: first,
# here, `make gpu-wheels` (the other dependencies as wheels in .whl/), then there, from the
# repository's root with .whl/ beside it:
#
#     bash bench/gpu_check.sh            # about 2 minutes on the tiny model
#
# It runs, on CUDA: the bf16 loop check (ratio 1 and nothing clipped at step 0 for every loss;
# after two steps the served logprobs are the trainer's), the tests of each training defect
# fixed (fp32) and of the trainer's review (each loss's gradient against one computed by hand),
# the trust region, the prefix cache, tool-call parsing, the local backend's training tests
# (the full gather -> train -> hot-swap -> gather learning loop among them) and the tool-call
# loop; on a machine with two GPUs or more, sharded training (FSDP over NCCL, each rank's share
# on its own GPU) against one process; where vLLM is installed, a step's adapter loaded into the
# running vLLM with no sleep, sampled with the trainer's logprobs (each skipped, saying why,
# where the machine lacks it). Figures (logprob mismatch, adapter effect, reward curve) are printed at the end and
# kept in $OUT (default .artifacts/gpu_check): machine.txt, tests.log, junit.xml, figures.txt.
set -uo pipefail
OUT=${OUT:-.artifacts/gpu_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"

if [ -d .whl ] && $PY -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing the wheels in .whl/ failed"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 ARTSDK_TEST_DEVICE=${ARTSDK_TEST_DEVICE:-cuda} ARTSDK_CACHE=${ARTSDK_CACHE:-/tmp/artsdk-cache}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    $PY -c "import torch, transformers, peft; print('torch', torch.__version__, '| cuda', torch.cuda.is_available(),
'| transformers', transformers.__version__, '| peft', peft.__version__, '| device', '$ARTSDK_TEST_DEVICE')"
} | tee "$OUT/machine.txt"

# the package's pytest plugin (art_store) is registered by pip on install; from a bare checkout, name it
plugin=()
$PY -c "import importlib.metadata as m, sys; sys.exit(all(e.value != 'artsdk.testing.pytest_plugin' for e in m.entry_points(group='pytest11')))" \
    || plugin=(-p artsdk.testing.pytest_plugin)
$PY -m pytest -q -rA "${plugin[@]}" -o junit_family=xunit1 --junitxml="$OUT/junit.xml" -k "not vllm or served_only" \
    tests/test_training_numerics.py \
    tests/test_trainer_review.py \
    tests/test_trust_region.py \
    tests/test_prefix_cache.py \
    tests/test_model_output.py \
    tests/test_local_training.py \
    tests/test_tool_calls.py \
    "tests/test_distributed.py::test_two_sharded_ranks_make_the_step_one_process_makes" \
    "tests/test_vllm_engine.py::test_served_only_no_weights_here_and_a_step_trained_elsewhere_is_served_as_trained" \
    2>&1 | tee "$OUT/tests.log"
status=${PIPESTATUS[0]}

# the figures the tests recorded (record_property), one line per test
$PY - "$OUT/junit.xml" <<'EOF' | tee "$OUT/figures.txt"
import sys
import xml.etree.ElementTree as ET

for case in ET.parse(sys.argv[1]).iter("testcase"):
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    if props:
        print(case.get("name"), props)
EOF
exit "$status"
