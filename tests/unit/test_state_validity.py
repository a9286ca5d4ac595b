"""What a saved state is valid for: the one comparison, the graph walk, the adapter and existing-pipeline
paths, and the settings `mimo-pipes run --resume` compares (every one but an explicit exempt list)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from node_checks import as_saved, assert_same, take
from scenarios_exchange import PAD_VALUES
from state_folders import save_job
from test_plugin_dist import reorder_config, single_rank_batches

from mimo_pipes.adapters.microbatch_iterator import balance_iterator
from mimo_pipes.adapters.torchdata_pipeline import balanced_loader
from mimo_pipes.checkpoint import MANIFEST_FILE
from mimo_pipes.checkpoint.validity import VALID_FOR_KEY, check_graph_state, check_valid_for, plain_copy, valid_for
from mimo_pipes.cli.job.resume_checks import RESUME_EXEMPT, check_resume_dir, setting_flag
from mimo_pipes.cli.main import build_parser
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.config.flags import flag_names
from mimo_pipes.config.job_options import JobOptions
from mimo_pipes.errors import ConfigError, StateMismatchError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.nodes import CanonicalShardReader, SnapshotGuard
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.existing_pipeline import example_samples
from mimo_pipes_recipes.vlm_sft import pipeline

# --- the comparison and the graph walk ---------------------------------------------------------------

WINDOWER = valid_for("Windower", {"micro-batch size per rank": 4, "window size": (3,)})
READER = valid_for("Reader", {"seed": 1})


def test_descriptions_survive_json_and_compare_setting_by_setting():
    assert WINDOWER["window size"] == [3]
    check_valid_for(as_saved({VALID_FOR_KEY: WINDOWER}), WINDOWER)
    with pytest.raises(StateMismatchError, match=r"^Windower: saved state was made with window size \[3\], this graph has \[2\]$"):
        check_valid_for({VALID_FOR_KEY: WINDOWER}, valid_for("Windower", {"micro-batch size per rank": 4, "window size": [2]}))
    newer = {VALID_FOR_KEY: {**WINDOWER, "pack": True}}
    with pytest.raises(StateMismatchError, match=r"made with pack true, this graph has \(not recorded\)"):
        check_valid_for(newer, WINDOWER)
    for legacy in ({"source": {}}, None, [1]):
        with pytest.raises(StateMismatchError, match="does not say what it is valid for"):
            check_valid_for(legacy, WINDOWER)


def test_the_graph_walk_finds_node_states_through_other_nodes():
    # a torchdata mapper between the two keeps its source's state under keys of its own
    state = {VALID_FOR_KEY: WINDOWER, "source": {"it_state": {"snapshot": {VALID_FOR_KEY: READER, "n": 3}, "steps": 1}}}
    check_graph_state(state, [WINDOWER, READER])
    with pytest.raises(StateMismatchError, match="Reader: saved state was made with seed 1, this graph has 2"):
        check_graph_state(state, [WINDOWER, valid_for("Reader", {"seed": 2})])
    check_graph_state(state, [WINDOWER])  # the reader's state is left to the reader (one the walk does not reach)
    with pytest.raises(StateMismatchError, match="^Other: the saved state holds no state for this node"):
        check_graph_state(state, [WINDOWER, READER, valid_for("Other", {})])
    with pytest.raises(StateMismatchError, match="Windower: the saved state does not say"):
        check_graph_state({"source": {"n": 3}}, [WINDOWER, READER])


def test_a_mismatch_is_a_config_error():
    with pytest.raises(ConfigError):
        check_valid_for({VALID_FOR_KEY: READER}, valid_for("Reader", {"seed": 2}))


# --- the adapter and the existing-pipeline recipe ----------------------------------------------------


def wrapped(window_size=2, encoder_weight=1.0, micro_batch_size=4):
    config = reorder_config(reorder_window_size=window_size, reorder_encoder_cost_weight=encoder_weight, reorder_language_cost_weight=1)
    return balance_iterator(source_factory=single_rank_batches, config=config, layout=RankLayout(0, 1, 1), micro_batch_size=micro_batch_size,
                            image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES, seq_length=2048)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(window_size=3), "BalanceExchange: saved state was made with window size 2, this graph has 3"),
        (dict(encoder_weight=2), "CostAnnotator: saved state was made with encoder cost weight 1, this graph has 2"),
        (dict(micro_batch_size=2), "BalanceExchange: saved state was made with micro-batch size per rank 4, this graph has 2"),
    ],
)
def test_balance_iterator_refuses_a_state_made_for_other_settings(overrides, message):
    with wrapped() as source:
        take(source, 3)
        state = as_saved(source.state_dict())
    with pytest.raises(StateMismatchError) as raised:
        wrapped(**overrides).load_state_dict(state)
    assert str(raised.value) == message
    with wrapped() as same:  # and the same settings restore it
        same.load_state_dict(state)
        assert next(same)["step"] == 3


def existing(encoder_weight=1.0, seed=2):
    layout = RankLayout(0, 1, 1)
    reorder = ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=2,
                            reorder_encoder_cost_weight=encoder_weight, reorder_language_cost_weight=1)
    dataset = SyntheticProcessedDataset(64, seed=seed, text_tokens=4, patch_dim=2)
    samples = example_samples(dataset, micro_batch_size=4, layout=layout, seed=seed, num_workers=1)
    return balanced_loader(samples, reorder=reorder, layout=layout, micro_batch_size=4, seq_length=1600,
                 image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)


def test_existing_pipeline_recipe_refuses_a_state_made_for_other_settings():
    loader = existing()
    take(loader, 3)
    state = as_saved(loader.state_dict())
    expected = take(loader, 2)
    with pytest.raises(StateMismatchError, match="^CostAnnotator: saved state was made with encoder cost weight 1, this graph has 3$"):
        existing(encoder_weight=3).load_state_dict(state)
    restored = existing()
    restored.load_state_dict(state)
    got = take(restored, 2)
    assert [b["sample_ids"] for b in got] == [b["sample_ids"] for b in expected]
    assert all(torch.equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(got, expected))
    for each in (loader, restored):
        each.close()


# --- `mimo-pipes run --resume`: every setting that shapes the stream ---------------------------------


def save_meta(directory, config: PipelineConfig, recipe="mimo_pipes_recipes.vlm_sft", world_size=4):
    save_job(directory, config, JobOptions(recipe=recipe), world_size=world_size)


def other_value(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, tuple):
        return (*value, "images=dp=2,rank_offset=4")
    return "elsewhere" if value is None else f"{value}-other"


def fields(config) -> list[tuple[object, str]]:
    """(holder, field name) of every leaf setting of a PipelineConfig, nested configs included."""
    out = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        out += fields(value) if dataclasses.is_dataclass(value) else [(config, field.name)]
    return out


def run_flags() -> set[str]:
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    return {option for action in run._actions for option in action.option_strings}


def test_resume_refuses_every_setting_but_the_exempt_ones_naming_the_flag(tmp_path):
    """The command's check: every setting named by its run flag."""
    with flag_names():
        base = PipelineConfig()
        save_meta(tmp_path, base)
        flags = run_flags()
        checked = set()
        for holder, name in fields(PipelineConfig()):
            config = PipelineConfig()
            target = config.reorder if isinstance(holder, ReorderConfig) else config
            setattr(target, name, other_value(getattr(target, name)))
            assert setting_flag(name) in flags, f"{name}: {setting_flag(name)} is not a run flag"
            if name in RESUME_EXEMPT:
                assert check_resume_dir(str(tmp_path), config, 4, JobOptions()) == 3
                continue
            with pytest.raises(ConfigError) as raised:
                check_resume_dir(str(tmp_path), config, 4, JobOptions())
            assert raised.value.setting == "--resume" and f" was saved with {setting_flag(name)} " in str(raised.value), name
            checked.add(name)
        assert {"embedded_samples", "processor", "seq_length", "dataset", "seed", "reorder_window_size"} <= checked
        with pytest.raises(ConfigError, match="saved with --recipe mimo_pipes_recipes.vlm_sft, this run has mine"):
            check_resume_dir(str(tmp_path), base, 4, JobOptions(recipe="mine"))


def test_resume_settings_that_do_not_shape_the_stream(tmp_path):
    save_meta(tmp_path, PipelineConfig(dataset="data", embedded_samples=48))
    assert check_resume_dir(str(tmp_path), PipelineConfig(dataset="data", embedded_samples=64), 4, JobOptions()) == 3
    save_meta(tmp_path, PipelineConfig(reorder=ReorderConfig(reorder_encoder_cost_weight="1.0")))
    assert check_resume_dir(str(tmp_path), PipelineConfig(reorder=ReorderConfig(reorder_encoder_cost_weight=1)), 4, JobOptions()) == 3


def test_resume_refuses_an_older_state_format(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"format": 2, "consumed_microbatches": 3, "settings": {}}))
    with pytest.raises(ConfigError, match="holds a state of format 2 .meta.json., saved by an older mimo-pipes: start the run again"):
        check_resume_dir(str(tmp_path), PipelineConfig(), 4, JobOptions())
    save_meta(tmp_path, PipelineConfig())
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({**manifest, "format": 99}))
    with pytest.raises(ConfigError, match="state format 99 is not 3"):
        check_resume_dir(str(tmp_path), PipelineConfig(), 4, JobOptions())


def test_balance_iterator_over_a_graph_loader_restores_both():
    """A loader as the source: its nodes' states nest inside the adapter's, and are checked by its own nodes."""
    layout = RankLayout(0, 1, 1)

    def adapter(seed=4):
        config = PipelineConfig(components=("language=dp=1",), micro_batch_size=4, seq_length=1600, seed=seed)
        dataset = SyntheticProcessedDataset(64, seed=4, text_tokens=4, patch_dim=2)
        inner = pipeline(dataset, config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)
        return balance_iterator(inner, config=reorder_config(reorder_window_size=2), layout=layout, micro_batch_size=4,
                                image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES, seq_length=1600)

    first = adapter()
    take(first, 3)
    state = as_saved(first.state_dict())
    expected = take(first, 3)
    second = adapter()
    second.load_state_dict(state)
    assert_same(take(second, 3), expected)
    with pytest.raises(StateMismatchError, match="CanonicalShardReader: saved state was made with seed 4, this graph has 5"):
        restored = adapter(seed=5)
        restored.load_state_dict(state)
        next(restored)  # the inner loader's reader checks its state when the adapter restores its source


def test_a_collator_with_declared_vision_fields_is_described_and_compared() -> None:
    """Declared vision fields carry dtypes: the description names them and survives a JSON round trip."""
    import json

    import torch

    from mimo_pipes.checkpoint.validity import VALID_FOR_KEY, check_valid_for, collation_settings, valid_for
    from mimo_pipes.samples.collate import Collator

    collator = Collator(64, {"labels": -100}, {"pixel_values": ((1176,), torch.float32)})
    described = valid_for("MicroBatchAssembler", collation_settings(collator))
    check_valid_for(json.loads(json.dumps({VALID_FOR_KEY: described})), described)
    other = valid_for("MicroBatchAssembler", collation_settings(Collator(64, {"labels": -100}, {"pixel_values": ((1176,), torch.bfloat16)})))
    with pytest.raises(ConfigError, match="collation vision fields"):
        check_valid_for({VALID_FOR_KEY: described}, other)


_PLAIN = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=12)


def _containers(value):
    if isinstance(value, (dict, list)):
        yield value
        for item in (value.values() if isinstance(value, dict) else value):
            yield from _containers(item)


@settings(max_examples=40, deadline=None)
@given(_PLAIN)
def test_plain_copy_is_equal_and_shares_no_container(value):
    copied = plain_copy(value)
    assert copied == value
    assert not {id(c) for c in _containers(copied)} & {id(c) for c in _containers(value)}


def test_a_saved_state_changed_later_changes_no_other_state():
    # get_state copies less than it did (each node's state is built afresh); what it hands out is still the caller's.
    node = CanonicalShardReader(SyntheticProcessedDataset(40, seed=3), micro_batch_size=8, dp_rank=0, dp_size=2, grid_size=2)
    guard = SnapshotGuard(node)
    next(guard)
    first = guard.state_dict()
    first[GraphNode.SOURCE_KEY][VALID_FOR_KEY]["seed"] = 99
    first[VALID_FOR_KEY]["node"] = "changed"
    second = guard.state_dict()
    assert second[GraphNode.SOURCE_KEY][VALID_FOR_KEY]["seed"] == 0 and second[VALID_FOR_KEY]["node"] == "SnapshotGuard"
    assert node.valid_for["seed"] == 0
