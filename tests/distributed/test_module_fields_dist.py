"""Every entry point honours the module of its layout (real Gloo ranks, the warm pool): with
``RankLayout(..., module="language")`` the recipe over a user's nodes (recipes/existing_pipeline.py),
``balance_iterator`` and the DataLoader adapter hand language ranks no pixels and move none (no pixel field is
encoded for the exchange), exactly as the recipe's graph that ``mimo-pipes run`` builds: the same fields and the
same bytes in every window. Their layout is the one docs/plugging-in.md builds (``build_rank_groups(...).layout()``)."""

from __future__ import annotations

import pytest
from scenarios_module_fields import entry_points

from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.tail import balanced_tail
from mimo_pipes.samples.module_fields import ENCODER_TOKEN_FIELDS, PIXEL_FIELDS, TOKEN_FIELDS
from mimo_pipes.testing import tail_settings

LAYOUTS = {
    "lang2-img2": (["language=dp=2", "images=dp=2,rank_offset=2"], 8, 1),
    "lang1-img3": (["language=dp=1", "images=dp=3,rank_offset=1"], 6, 2),
    "lang3-img1": (["language=dp=3", "images=dp=1,rank_offset=3"], 6, 1),
}
ENTRY_POINTS = ("existing_pipeline", "balance_iterator", "dataloader")
METADATA_BYTES = 64  # per sample: a user's reader may tag samples with fewer scalars than the recipe's (no ``slot``)


def same_bytes(got, run) -> bool:
    """The same samples moved in every window, and the same bytes up to per-sample scalar metadata."""
    if [w[2:] for w in got] != [w[2:] for w in run]:
        return False
    return all(abs(g[0] - r[0]) <= METADATA_BYTES * r[2] and abs(g[1] - r[1]) <= METADATA_BYTES * r[3] for g, r in zip(got, run))


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_entry_point_carries_and_moves_only_its_module_fields(gloo_pool, name):
    components, batch, window = LAYOUTS[name]
    results = [r for r in gloo_pool.run(entry_points, components, steps=4, micro_batch_size=batch, seed=5, window_size=window)
               if r is not None]
    assert {r["module"] for r in results} == {"language", "images"}
    sent = {module: {"run": 0, "all-fields": 0} for module in ("language", "images")}
    for result in results:
        where = f"{name}: {result['module']} dp rank {result['dp_rank']}"
        run = result["run"]
        dropped = PIXEL_FIELDS if result["module"] == "language" else tuple(set(TOKEN_FIELDS) - set(ENCODER_TOKEN_FIELDS))
        assert not set(run["keys"]) & set(dropped), f"{where}: the run's graph carries {dropped}"
        assert set(result["all-fields"]["keys"]) & set(dropped), f"{where}: the data has no field to drop"
        for entry in ENTRY_POINTS:
            got = result[entry]
            assert not set(got["keys"]) & set(dropped), f"{where}: {entry} hands out {sorted(set(got['keys']) & set(dropped))}"
            assert not set(got["encoded"]) & set(dropped), f"{where}: {entry} moves {sorted(set(got['encoded']) & set(dropped))}"
            assert result["layout_module"] == result["module"], f"{where}: the layout names module {result['layout_module']!r}"
            assert sorted(map(sorted, got["ids"])) == sorted(map(sorted, run["ids"])), f"{where}: {entry} holds other samples"
            assert same_bytes(got["moved"], run["moved"]), f"{where}: {entry} moved {got['moved']} bytes, the run {run['moved']}"
        if result["dp_size"] > 1:  # the spy sees what moves: a graph of every field encodes the module's dropped fields
            assert set(result["all-fields"]["encoded"]) & set(dropped), f"{where}: nothing dropped was seen moving"
        for graph in ("run", "all-fields"):
            sent[result["module"]][graph] += sum(window[0] for window in result[graph]["moved"])
    # a module of DP > 1 moved samples, without the fields a graph of every field would have moved
    for module, dp in zip(("language", "images"), (components[0], components[1])):
        if "dp=1," not in dp + ",":
            assert 0 < sent[module]["run"] < sent[module]["all-fields"], f"{name}: {module} ranks sent {sent[module]}"


def test_a_tail_resolved_for_another_module_is_refused():
    with pytest.raises(ValueError, match="module=layout.module"):
        balanced_tail(None, settings=tail_settings(samples_per_rank=2), layout=RankLayout(0, 1, 1, module="language"))
