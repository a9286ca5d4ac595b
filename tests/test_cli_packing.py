"""`mimo-pipes run --pack-sequences-in-batch`: spawned Gloo ranks, the packing summary per rank."""

from __future__ import annotations

import re

from test_cli_run import REORDER, SMALL, read_dumps, run_cli


def test_run_with_packing_prints_padding_before_and_after_per_rank(tmp_path):
    result = run_cli(*SMALL, *REORDER, "--pack-sequences-in-batch", "--pack-pad-multiple", "4",
                     "--reorder-language-cost", "packed", "--reorder-language-cost-weight", "1",
                     "--dump-assignments", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "sequence packing on (THD, pad multiple 4)" in result.stdout
    rows = re.findall(r"^(language|images)\s+(\d)\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)$", result.stdout, re.M)
    assert sorted((module, int(rank)) for module, rank, *_ in rows) == [("images", 0), ("images", 1), ("language", 0), ("language", 1)]
    dumps = read_dumps(tmp_path)
    for module, rank, before, after, per_row in rows:
        assert float(after) < float(before)
        # tokens per packed row: the rank's real tokens, each sequence rounded up to a multiple of 4
        global_rank = int(rank) + (2 if module == "images" else 0)
        records = dumps[global_rank]
        expected = sum(-(-n // 4) * 4 for record in records for n in record["real_tokens"]) / len(records)
        assert float(per_row) == round(expected, 1)
