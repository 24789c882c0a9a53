#!/usr/bin/env bash
# A login node's install, checked end to end (.ci/run; 4m14s wall, 99 s of CPU, on 2 shared
# cores: bench/measured/test-suites.md):
# `pip install .` (no extras, not editable) into a fresh venv pulls no torch, and from a folder
# outside the checkout that install runs the grid half: a sweep file and cluster profile of
# the user's own, `gridrun plan` refusing an unfetched sweep and `gridrun fetch` filling it,
# and `status` and `collect` of a finished toy sweep (trained first by the checkout's .venv,
# which has the training stack; GRIDRUN_TRAIN_PYTHON names another python). A command that
# needs the trainer names the `train` extra.
# The installed package is the checkout: the full matrix's dry run from the wheel and from the
# checkout print the same table (cells, GPU memory, disk, s/step, node-days), and the matrix
# planned by each writes the same cells, fingerprints and config.yaml files (vLLM's included;
# scripts/plan_digest.py says what it leaves out: timestamps, git and package versions, the
# install's own folder). Last, the wheel with the training stack (taken from the checkout's
# venv, not downloaded again) runs `gridrun canary cluster=local` from that folder with no
# data prepared and no hub: GO with its per-rank lines.
#
#   scripts/check_wheel_install.sh        from the repository root, after `make install`
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
train_py=${GRIDRUN_TRAIN_PYTHON:-$repo/.venv/bin/python}
work=$(mktemp -d "${TMPDIR:-/tmp}/gridrun-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The toy sweep's trainer runs this checkout's code (as `make install`'s editable venv does);
# the wheel's commands run with no PYTHONPATH, so they import only the installed package.
train_pythonpath=$repo${PYTHONPATH:+:$PYTHONPATH}
unset GRIDRUN_RESULTS GRIDRUN_CONFIG_DIR PYTHONPATH
export PIP_DISABLE_PIP_VERSION_CHECK=1

fail() { echo "check_wheel_install: FAILED: $*" >&2; exit 1; }
say() { printf -- '--- %s (%ss)\n' "$1" "$SECONDS"; }

say "a copy of the checkout's files (tracked and new, never ignored ones: no stale build/ in the wheel)"
mkdir "$work/src"
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$repo" && git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -T - -cf -) |
        tar -C "$work/src" -xf -
else
    cp -r "$repo/." "$work/src" && rm -rf "$work/src/.venv" "$work/src/build" "$work/src/results"
fi

say "the wheel, then pip install of it into a fresh venv (no extras, not editable)"
"$train_py" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
wheel=$(echo "$work"/dist/gridrun-*.whl)
python3 -m venv "$work/venv"
gridrun=$work/venv/bin/gridrun
"$work/venv/bin/pip" install -q "$wheel"
"$work/venv/bin/python" - <<'EOF' || fail "pip install . pulled the training stack"
import importlib.util, sys
found = [m for m in ("torch", "transformers", "peft", "wandb", "datasets") if importlib.util.find_spec(m)]
print("training stack installed: " + (", ".join(found) or "none (as it should be)"))
sys.exit(1 if found else 0)
EOF
"$work/venv/bin/python" -c "import torch" 2>/dev/null && fail "torch is importable"

user=$work/user
mkdir -p "$user/sweeps" "$user/conf/cluster"
cd "$user"

say "a sweep file and a cluster profile of the user's own (./sweeps, ./conf/cluster)"
shipped=$("$work/venv/bin/python" -c "import gridrun, pathlib; print(pathlib.Path(gridrun.__file__).parent)")
[[ $shipped == "$work/venv/"* ]] || fail "gridrun was imported from $shipped, not the installed wheel"
sed -e 's/^name: paper$/name: mycluster/' -e 's/^  h100: h100$/  h100: gpu-h100/' \
    "$shipped/conf/cluster/paper.yaml" >conf/cluster/mycluster.yaml
cat >sweeps/mine.yaml <<'EOF'
# The paper's voting cells at 1.7B, on the user's own cluster profile.
axes:
  workflow: [voting]
  task: [math]
  scale: [1.7b]
  policy: [isolated, shared]
  seed: [0]
  kind: [train]
overrides: [cluster=mycluster, launcher=slurm]
EOF
say "plan refuses what is not fetched; gridrun fetch (torch-free) fills it: data from a local copy, the model a local folder"
export GRIDRUN_DATA=$work/data
set +e
"$gridrun" plan conf=mine 2>"$work/plan.err"
code=$?
set -e
[[ $code == 2 ]] && grep -q "Run \`gridrun fetch conf=mine\` first" "$work/plan.err" ||
    fail "plan of an unfetched sweep did not refuse naming gridrun fetch (exit $code): $(cat "$work/plan.err")"
# The shipped toy world stands in for Qwen3-1.7B's checkpoint folder (the cells keep the hub id).
sed -i "s|^model_dirs: {}$|model_dirs: {Qwen/Qwen3-1.7B: $shipped/toy/world}|" conf/cluster/mycluster.yaml
"$gridrun" fetch conf=mine --data-from "math=$repo/tests/fixtures/dapo_math_sample.parquet"
"$gridrun" fetch conf=mine | grep -q "nothing to fetch" || fail "a second fetch fetched again"
"$gridrun" plan conf=mine
unset GRIDRUN_DATA
"$work/venv/bin/python" - <<'EOF' || fail "the user's sweep was not planned on the user's cluster profile"
import json
sweep = json.load(open("results/mine/sweep.json"))
assert sweep["cluster"]["name"] == "mycluster" and sweep["cluster"]["partitions"]["h100"] == "gpu-h100", sweep["cluster"]
assert len(sweep["cells"]) == 2, [c["id"] for c in sweep["cells"]]
print("results/mine/sweep.json: 2 cells on cluster mycluster (partition gpu-h100)")
EOF

say "the wheel plans what the checkout plans: the full matrix's dry run, then its cells"
# The checkout's gridrun, run from the same folder with the same environment.
checkout() { PYTHONPATH=$train_pythonpath "$train_py" -m gridrun.cli "$@"; }
# One width for both tables (rich wraps at the terminal's); the same data root for both (a
# relative one is the checkout's root in a checkout, the working directory in a wheel).
export COLUMNS=400 GRIDRUN_DATA=$work/data
"$gridrun" plan conf=full_matrix --dry-run --results-dir "$work/dry" >"$work/dry-wheel.txt" ||
    fail "the full matrix's dry run from the wheel"
checkout plan conf=full_matrix --dry-run --results-dir "$work/dry" >"$work/dry-checkout.txt" ||
    fail "the full matrix's dry run from the checkout"
diff -u "$work/dry-checkout.txt" "$work/dry-wheel.txt" || fail "the wheel's dry run of full_matrix is not the checkout's"
grep -q "^72 cells (36 train, 6 sa_rl, 24 base, 6 transfer), ~.* node-days" "$work/dry-wheel.txt" ||
    fail "the full matrix's dry run printed no node-days for its 72 cells"
grep -q "\[m\] 1.7b/h100, 4b/h100: measured: " "$work/dry-wheel.txt" || fail "the dry run took no measured rate"
grep "node-days" "$work/dry-wheel.txt" | head -n 1
# Planned for real: every model of the matrix (the toy world stands in) and both tasks' data.
sed -i "s|^model_dirs: {.*}$|model_dirs: {Qwen/Qwen3-0.6B: $shipped/toy/world, Qwen/Qwen3-1.7B: $shipped/toy/world, Qwen/Qwen3-4B: $shipped/toy/world}|" \
    conf/cluster/mycluster.yaml
"$gridrun" data prepare code --from "$repo/tests/fixtures/deepcoder_sample.jsonl" --out "$work/data/code" --val-size 2 \
    >/dev/null 2>&1 || fail "gridrun data prepare code from the fixture"
"$gridrun" plan conf=full_matrix cluster=mycluster --results-dir "$work/plan-wheel" >/dev/null
checkout plan conf=full_matrix cluster=mycluster --results-dir "$work/plan-checkout" >/dev/null
"$work/venv/bin/python" "$repo/scripts/plan_digest.py" "$work/plan-wheel" full_matrix >"$work/plan-wheel.json"
PYTHONPATH=$train_pythonpath "$train_py" "$repo/scripts/plan_digest.py" "$work/plan-checkout" full_matrix >"$work/plan-checkout.json"
diff -u "$work/plan-checkout.json" "$work/plan-wheel.json" ||
    fail "the wheel's cells of full_matrix (fingerprints, config.yaml) are not the checkout's"
vllm_cell=$work/plan-wheel/full_matrix/cells/voting-ip-1.7b-math-s0/config.yaml
grep -q "^  name: vllm$" "$vllm_cell" && grep -Eq "^  gpu_memory_utilization: 0\.[0-9]+$" "$vllm_cell" ||
    fail "the vLLM cell's config.yaml holds no engine memory share: $(grep -A3 '^engine:' "$vllm_cell")"
echo "72 cells, their fingerprints and config.yaml files: the same from the wheel and the checkout"
unset COLUMNS GRIDRUN_DATA

say "a finished toy sweep (one Voting/SP cell, 2 steps), trained by the checkout's venv ($train_py)"
cat >sweeps/tiny.yaml <<'EOF'
# One Voting/SP cell of two steps on the shipped toy world.
axes:
  workflow: [voting]
  task: [arith]
  scale: [toy]
  policy: [shared]
  seed: [0]
  kind: [train]
overrides: [train.total_steps=2]
EOF
PYTHONPATH=$train_pythonpath "$train_py" -m gridrun.cli sweep conf=tiny >"$work/tiny.txt" 2>&1 ||
    { cat "$work/tiny.txt"; fail "the toy sweep did not finish"; }

say "status and collect of it with the torch-free install"
"$gridrun" status conf=tiny
"$gridrun" status conf=tiny --json | "$work/venv/bin/python" -c '
import json, sys
rows = json.load(sys.stdin)
assert [(r["cell"], r["state"]) for r in rows] == [("voting-sp-toy-arith-s0", "done")], rows
' || fail "status --json: the toy sweep's cell is not done"
"$gridrun" collect conf=tiny | tail -n 2
for f in results/tiny/table1.md results/tiny/cells.parquet results/tiny/report.html; do
    [[ -s $f ]] || fail "collect wrote no $f"
done

say "a command that needs the trainer names the extra"
# A cell not yet run (the toy cell is done, which is final for `gridrun run`).
set +e
"$gridrun" run results/mine/cells/voting-sp-1.7b-math-s0 2>"$work/run.err"
code=$?
set -e
cat "$work/run.err"
[[ $code == 2 ]] && grep -q "pip install -e '.\[train\]'" "$work/run.err" && [[ $(wc -l <"$work/run.err") == 1 ]] ||
    fail "gridrun run without torch did not fail in one line naming pip install -e '.[train]' (exit $code)"

say "the wheel with the training stack: gridrun canary cluster=local, no data prepared, no hub"
# The checkout's venv lends its packages by path (its own gridrun is an editable finder, which
# a path entry does not load): the wheel's gridrun is the one imported.
python3 -m venv "$work/train-venv"
"$work/train-venv/bin/pip" install -q --no-deps "$wheel"
"$train_py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
    >"$("$work/train-venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/training-stack.pth"
mkdir "$work/newcomer" && cd "$work/newcomer"
set +e
HF_HOME=$work/empty-hf HF_HUB_OFFLINE=1 "$work/train-venv/bin/gridrun" canary cluster=local >"$work/canary.txt" 2>&1
code=$?
set -e
cat "$work/canary.txt"
[[ $code == 0 ]] && grep -q "^GO: projected " "$work/canary.txt" && grep -q "^rank 0/1 on " "$work/canary.txt" ||
    fail "the wheel's canary did not say GO with its rank's line (exit $code)"
grep -q "this CPU canary trains on the 38-problem math sample shipped with gridrun ($work/train-venv/" "$work/canary.txt" ||
    fail "the wheel's canary did not train on the math sample it ships"

say "the wheel install works without torch"
