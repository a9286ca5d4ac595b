#!/usr/bin/env bash
# What users install is what is tested: build the wheel, install it without -e into a fresh venv, import every
# module of the package from outside the checkout, and run the main job's first two micro-batches from there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
quiet() { "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; echo "wheel check failed: $*" >&2; exit 1; }; }
quiet "$py" -m pip install -q --upgrade pip
# From a copy of the files git would commit (tracked and untracked-not-ignored): a stale build/ or an ignored
# file of this checkout never reaches the wheel.
mkdir "$work/src"
git -C "$root" ls-files -z --cached --others --exclude-standard | (cd "$root" && xargs -0 tar -cf - --ignore-failed-read 2>/dev/null) | tar -xf - -C "$work/src"
quiet "$py" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
# As in scripts/setup.sh: modules compiled as they are first imported where Python may write them.
compile=()
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then compile=(--no-compile); fi
quiet "$py" -m pip install -q ${compile[@]+"${compile[@]}"} "${TORCH_SPEC:-torch==2.13.0}"
quiet "$py" -m pip install -q ${compile[@]+"${compile[@]}"} "$work"/dist/mimo_pipes-*.whl
cd "$work"
"$py" - <<'PY'
import importlib, pkgutil, sys
import mimo_pipes, mimo_pipes_recipes
assert "site-packages" in mimo_pipes.__file__, mimo_pipes.__file__
names = [m.name for root in (mimo_pipes, mimo_pipes_recipes) for m in pkgutil.walk_packages(root.__path__, root.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(f"wheel {mimo_pipes.__version__}: {len(names)} modules import from {mimo_pipes.__file__.rsplit('/', 2)[0]}")
PY
MIMO_PIPES_CACHE="${MIMO_PIPES_CACHE:-$HOME/.cache/mimo-pipes}" "$work/venv/bin/mimo-pipes" run --steps 2 --scalable-dp --intra-microbatch-reorder --quiet --summary-json "$work/summary.json"
"$py" -c "import json, sys; s = json.load(open(sys.argv[1])); assert all(m['steps'] == 2 for m in s['modules'].values()), s; print('wheel run: ok,', sorted(s['modules']))" "$work/summary.json"
