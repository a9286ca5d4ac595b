#!/usr/bin/env bash
# What users install is what is tested: build the wheel from the files git would commit, install it without -e into
# a fresh venv, check that its metadata's requirements are met there, import every module of the package from the
# wheel (never from the checkout), and run the main job's first two micro-batches with its console script.
#
# The fresh venv borrows the dependencies .venv already has (scripts/setup.sh makes it; WHEEL_CHECK_BASE names
# another venv of the same Python) instead of downloading and installing torch and the rest again: a plain path
# line in a .pth file puts .venv's site-packages on sys.path after the venv's own. A path line is not a site
# directory, so the .pth files inside it are not run: .venv's editable install of this checkout (its finder hook)
# stays out. The wheel goes in with --no-deps; `pip check` then proves its Requires-Dist (and theirs) are met.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
base="${WHEEL_CHECK_BASE:-$root/.venv}"
if [ ! -x "$base/bin/python" ]; then
    echo "wheel check: $base/bin/python not found (bash scripts/setup.sh makes .venv; WHEEL_CHECK_BASE names another venv)" >&2
    exit 1
fi
# Nothing from the caller's environment may put the checkout on sys.path.
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONUSERBASE
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
quiet() { "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; echo "wheel check failed: $*" >&2; exit 1; }; }
# From a copy of the files git would commit (tracked and untracked-not-ignored): a stale build/ or an ignored
# file of this checkout never reaches the wheel.
mkdir "$work/src"
git -C "$root" ls-files -z --cached --others --exclude-standard | (cd "$root" && xargs -0 tar -cf - --ignore-failed-read 2>/dev/null) | tar -xf - -C "$work/src"
quiet "$base/bin/python" -m pip wheel -q --no-deps -w "$work/dist" "$work/src"
# The venv is made by .venv's interpreter (so the same Python), without pip: .venv's pip installs into it
# (--python) before .venv's packages are visible there, so it can neither see nor touch .venv's editable install.
quiet "$base/bin/python" -m venv --without-pip "$work/venv"
py="$work/venv/bin/python"
compile=()
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then compile=(--no-compile); fi
quiet "$base/bin/python" -m pip --python "$py" install -q --no-deps ${compile[@]+"${compile[@]}"} "$work"/dist/mimo_pipes-*.whl
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$base_site" >"$site/borrowed-dependencies.pth"
# pip (.venv's, run by the venv's interpreter) over everything the venv sees: the wheel's distribution comes first
# on sys.path, so its requirements, and every installed requirement's own, are the ones checked.
quiet "$py" -m pip check
cd "$work"
"$py" - "$root" "$base" <<'PY'
import importlib, importlib.metadata, os, pkgutil, sys, sysconfig
import mimo_pipes, mimo_pipes_recipes

root, base = (os.path.realpath(path) for path in sys.argv[1:3])
site = os.path.realpath(sysconfig.get_paths()["purelib"])
inside = lambda path, folder: os.path.realpath(path).startswith(folder + os.sep)
names = [m.name for package in (mimo_pipes, mimo_pipes_recipes) for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in names:
    importlib.import_module(name)
ours = {name: getattr(module, "__file__", None) for name, module in sys.modules.items() if name.split(".")[0] in ("mimo_pipes", "mimo_pipes_recipes")}
# A module the wheel lacks would otherwise come from the checkout (the working directory, an editable hook): none may.
stray = [f"{name} from {path}" for name, path in ours.items() if not path or not inside(path, site)]
stray += [f"{name} from the checkout: {module.__file__}" for name, module in list(sys.modules.items())
          if getattr(module, "__file__", None) and inside(module.__file__, root) and not inside(module.__file__, base)]
stray += [f"editable install's hook: {name}" for name in sys.modules if name.startswith("__editable__")]
assert not stray, "not from the wheel:\n" + "\n".join(stray)
dist = importlib.metadata.distribution("mimo-pipes")
assert inside(str(dist.locate_file("mimo_pipes/__init__.py")), site) and dist.version == mimo_pipes.__version__, (dist.locate_file(""), dist.version)
print(f"wheel {dist.version}: {len(names)} modules import from {site}, its requirements met by {sys.argv[2]}'s packages")
PY
MIMO_PIPES_CACHE="${MIMO_PIPES_CACHE:-$HOME/.cache/mimo-pipes}" "$work/venv/bin/mimo-pipes" run --steps 2 --scalable-dp --intra-microbatch-reorder --quiet --summary-json "$work/summary.json"
"$py" -c "import json, sys; s = json.load(open(sys.argv[1])); assert all(m['steps'] == 2 for m in s['modules'].values()), s; print('wheel run: ok,', sorted(s['modules']))" "$work/summary.json"
