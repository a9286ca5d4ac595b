"""`mimo-pipes run --pack-sequences-in-batch` (its per-rank body on the pool's Gloo ranks): the packing
summary per language rank (an encoder module's input_ids stay one row per sample: it never packs)."""

from __future__ import annotations

import re

from job_runs import run_in_pool
from test_cli_run import REORDER, SMALL, read_dumps


def test_run_with_packing_prints_padding_before_and_after_per_rank(gloo_pool, tmp_path):
    outcome = run_in_pool(gloo_pool, [*SMALL, *REORDER, "--pack-sequences-in-batch", "--pack-pad-multiple", "4",
                                      "--reorder-language-cost", "packed", "--reorder-language-cost-weight", "1",
                                      "--dump-assignments", str(tmp_path)])
    stdout = outcome["stdout"]
    assert "sequence packing on (THD, pad multiple 4)" in stdout
    rows = re.findall(r"^(language|images)\s+(\d)\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)$", stdout, re.M)
    # Only the language module packs (mimo_pipes/samples/module_fields.py: ModuleFields.packs).
    assert sorted((module, int(rank)) for module, rank, *_ in rows) == [("language", 0), ("language", 1)]
    dumps = read_dumps(tmp_path)
    for _, rank, before, after, per_row in rows:
        assert float(after) < float(before)
        # tokens per packed row: the rank's real tokens, each sequence rounded up to a multiple of 4
        records = dumps[int(rank)]
        expected = sum(-(-n // 4) * 4 for record in records for n in record["real_tokens"]) / len(records)
        assert float(per_row) == round(expected, 1)
