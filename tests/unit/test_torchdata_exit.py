"""A process that exits with a loader it never closed (an exception skipped the close) prints nothing of
torchdata's at exit: no ``Exception ignored in ... __del__`` (torchdata 0.11's mapper iterators are collected
after the modules' globals are cleared), and the exception itself still shows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.launch  # six fresh interpreters, each importing torch and the library: the unit run stays in-process

SCRIPT = textwrap.dedent("""
    from failing_map_recipe import fail_on_bad_sample
    from mimo_pipes.config import PipelineConfig, ReorderConfig
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
    from mimo_pipes_recipes.vlm_sft import pipeline

    config = PipelineConfig(components=("language=dp=1",), micro_batch_size=4, num_workers={workers},
                            reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=3))
    loader = pipeline(SyntheticProcessedDataset(64), config, RankLayout(0, 1, 1), map_fn={map_fn},
                      image_token_id=IMAGE_TOKEN_ID, pad_values={{}})
    {ending}
""")
ENDINGS = {
    "raised": "for _ in range(20):\n        next(loader)",  # uncaught: the traceback holds the loader's iterators
    "caught": "try:\n        [next(loader) for _ in range(20)]\n    except Exception:\n        print('caught')",
    "left open": "next(loader)",  # no exception: a loader never closed
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("ending", ENDINGS)
def test_no_exception_ignored_at_exit(ending, workers):
    map_fn = "lambda sample: sample" if ending == "left open" else "fail_on_bad_sample"
    script = SCRIPT.format(workers=workers, map_fn=map_fn, ending=ENDINGS[ending].replace("\n    ", "\n"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}  # this test's imports, the failing recipe's too
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert "Exception ignored" not in done.stderr and "maxsize" not in done.stderr, done.stderr
    if ending == "raised":
        assert done.returncode == 1 and done.stderr.rstrip().endswith("sample 5, field 'input_ids': cannot be tokenized"), done.stderr
    else:
        assert done.returncode == 0, done.stderr
