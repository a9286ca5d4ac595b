"""The MimoModel training recipe's pieces that need no GPU: settings, the vision submodule on a real
micro-batch through ``mimo_batch``, the keyword arguments against the installed ``MimoModel.forward``,
the read-ahead setting and the run summary. (The training itself runs on a GPU: docs/benchmarks.md.)"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mimo_pipes.exchange import RankLayout
from mimo_pipes.megatron import FORWARD_KEYS, MimoBatchSettings, mimo_batch
from mimo_pipes_recipes import megatron_mimo_grids as grids
from mimo_pipes_recipes import megatron_mimo_train as recipe
from mimo_pipes_recipes import vlm_sft

TINY = ["--lm-layers", "1", "--lm-hidden", "64", "--lm-heads", "4", "--vision-depth", "1", "--vision-width", "32",
        "--vision-heads", "2", "--micro-batch-size", "2", "--microbatches", "2", "--embedded-samples", "64", "--num-workers", "1"]


def test_defaults_and_reorder_modes() -> None:
    args = recipe.parse_args(["--reorder", "off,on"])
    assert (args.iterations, args.microbatches, args.prefetch, args.reorder_modes) == (100, 4, 2, ["off", "on"])


@pytest.mark.parametrize(("argv", "flag"), [
    (["--reorder", "sideways"], "--reorder"),
    (["--lm-hidden", "100", "--lm-heads", "16"], "--lm-hidden"),
    (["--vision-width", "100", "--vision-heads", "12"], "--vision-width"),
    (["--prefetch", "-1"], "--prefetch"),
    (["--iterations", "0"], "--iterations"),
    (["--pack-pad-multiple", "0"], "--pack-pad-multiple"),
])
def test_bad_settings_exit_2_naming_the_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        recipe.parse_args(argv)
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


@given(st.integers(min_value=1, max_value=64))
def test_mrope_sections_cover_half_the_head(sixteenths: int) -> None:
    head = 16 * sixteenths
    sections = recipe.mrope_section(head)
    assert sum(sections) == head // 2 and sections[1] == sections[2] and min(sections) > 0


def test_mrope_section_of_qwen2_vl() -> None:
    assert recipe.mrope_section(128) == [16, 24, 24]
    with pytest.raises(ValueError):
        recipe.mrope_section(24)


def test_both_reorder_modes_are_valid_one_rank_jobs_over_the_same_batches() -> None:
    args = recipe.parse_args([])
    off, on = recipe.pipeline_config(args, "off"), recipe.pipeline_config(args, "on")
    for config in (off, on):
        assert config.validate(1).world_size == 1
        assert config.microbatches_per_global_batch == args.microbatches
    assert on.reorder.intra_microbatch_reorder and on.reorder.reorder_across_microbatches and not off.reorder.intra_microbatch_reorder


def test_the_grids_recipe_lays_the_pipeline_out_from_its_own_grids(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe's module_to_grid_map (vision first, then a language grid of tp x pp x dp) gives the pipeline's
    topology: one layout for the model and the pipeline."""
    from mimo_pipes.megatron.grids import grid_layout

    args = grids.parse_args(["--images-dp", "2", "--language-dp", "4", "--language-tp", "2", "--micro-batch-size", "8"])
    monkeypatch.setenv("WORLD_SIZE", "10")
    layout = grid_layout(grids.module_grids(args, create_groups=False), micro_batch_size=args.micro_batch_size)
    topology = grids.pipeline_config(args, "on", layout.components).validate(10)
    assert [(m.name, m.tp, m.dp, m.rank_offset) for m in topology.modules] == [("images", 1, 2, 0), ("language", 2, 4, 2)]
    with pytest.raises(SystemExit):
        grids.parse_args(["--images-dp", "0"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--save", "out", "--save-interval", "0"], "--save-interval: must be >= 1, got 0"),
    (["--save", "out", "--reorder", "off,on"], "--save / --load: one --reorder mode per run"),
    (["--load", "out", "--reorder", "off,on"], "--save / --load: one --reorder mode per run"),
])
def test_the_grids_recipes_checkpoint_flags_are_checked(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        grids.parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    args = grids.parse_args(["--save", "out", "--load", "in", "--save-interval", "5"])
    assert (args.save, args.load, args.save_interval) == ("out", "in", 5)
    assert grids.parse_args([]).save is None and grids.parse_args([]).load is None


@pytest.mark.parametrize(("installed", "refused"), [("0.16.1", True), ("0.18.0", True), ("0.19.2", False), ("0.20.0rc1", False), ("x.y", True)])
def test_the_grids_recipe_needs_megatron_core_0_19(installed: str, refused: bool) -> None:
    problem = grids.megatron_core_problem(installed)
    assert (problem is not None) == refused
    if refused:
        assert "0.19" in problem and "\n" not in problem


def test_without_cuda_the_grids_recipe_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Before anything is built: the installed megatron-core (below 0.19: its version), then the device; status 2."""
    monkeypatch.setattr(grids, "megatron_core_problem", lambda installed=None: "needs megatron-core 0.19 or later; installed 0.16.1")
    assert grids.main([]) == 2
    assert capsys.readouterr().err.strip() == "megatron_mimo_grids: needs megatron-core 0.19 or later; installed 0.16.1"
    monkeypatch.setattr(grids, "megatron_core_problem", lambda installed=None: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert grids.main([]) == 2
    assert capsys.readouterr().err.strip() == ("megatron_mimo_grids: --device cuda: no CUDA GPU found (--device cpu trains on the CPU "
                                               "over Gloo: slow, for debugging and CI)")


def test_packing_is_the_pipelines_setting() -> None:
    plain = recipe.pipeline_config(recipe.parse_args([]), "on")
    packed = recipe.pipeline_config(recipe.parse_args(["--pack-sequences-in-batch", "--pack-pad-multiple", "8"]), "on")
    assert (plain.pack_sequences_in_batch, plain.pack_pad_multiple) == (False, 1)
    assert (packed.pack_sequences_in_batch, packed.pack_pad_multiple) == (True, 8)


def test_packing_without_transformer_engine_is_refused_in_one_line_before_anything_is_built(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Packed micro-batches need TransformerEngine's attention (megatron-core's local one refuses THD): without it
    both recipes say so in one line, status 2; with it, or without packing, nothing is refused."""
    monkeypatch.setattr(grids, "megatron_core_problem", lambda installed=None: None)
    monkeypatch.setattr(recipe, "has_transformer_engine", lambda: False)
    monkeypatch.setattr(grids.dist, "init_process_group", lambda *a, **k: pytest.fail("built something"))
    monkeypatch.setenv("WORLD_SIZE", "3")
    packed = ["--device", "cpu", "--pack-sequences-in-batch"]
    assert grids.main(packed) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("megatron_mimo_grids: --pack-sequences-in-batch: ") and "transformer_engine is not installed" in err and "\n" not in err
    monkeypatch.setattr(recipe, "require_mrope_and_packing", lambda program: None)
    assert recipe.main(packed) == 2
    assert capsys.readouterr().err.strip() == err.replace("megatron_mimo_grids", "megatron_mimo_train")
    assert grids.refusal(grids.parse_args(packed[:2])) is None
    monkeypatch.setattr(recipe, "has_transformer_engine", lambda: True)
    assert grids.refusal(grids.parse_args(packed)) is None


def test_on_the_cpu_the_grids_recipe_asks_for_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """--device cpu: no GPU count is checked (CPU processes over Gloo); the layout still is."""
    monkeypatch.setattr(grids, "megatron_core_problem", lambda installed=None: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert grids.refusal(grids.parse_args(["--device", "cpu"])) is None
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert "needs 3 processes, got 4" in grids.refusal(grids.parse_args(["--device", "cpu"]))


@pytest.mark.parametrize(("argv", "world", "words"), [
    (["--images-dp", "2", "--language-dp", "1"], 3, "images dp=2 exceeds language dp=1: fan-in"),
    (["--images-dp", "2", "--language-dp", "3", "--micro-batch-size", "6"], 5, "language dp=3 is not a multiple of images dp=2"),
    (["--images-dp", "1", "--language-dp", "4", "--micro-batch-size", "6"], 5, "not a multiple of 4, the lcm of the DP sizes"),
    (["--images-dp", "1", "--language-dp", "2"], 4, "needs 3 processes, got 4"),
    (["--images-dp", "1", "--language-dp", "4", "--micro-batch-size", "8"], 5, "5 processes on this node but 4 GPUs: NCCL takes one GPU per rank"),
])
def test_a_layout_megatron_core_or_the_pipeline_cannot_serve_is_refused_before_anything_is_built(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], world: int, words: str
) -> None:
    monkeypatch.setattr(grids, "megatron_core_problem", lambda installed=None: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setattr(grids.dist, "init_process_group", lambda *a, **k: pytest.fail("built something"))
    assert grids.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("megatron_mimo_grids: ") and words in err and "\n" not in err


@pytest.fixture(scope="module")
def micro_batches() -> list[dict]:
    """Two micro-batches of the embedded data as the one-rank loader yields them."""
    args = recipe.parse_args(TINY)
    config = recipe.pipeline_config(args, "on")
    vlm_sft.prepare(config, log=lambda line: None)
    loader = vlm_sft.build(config, RankLayout(dp_rank=0, dp_size=1, grid_size=1))
    try:
        return [next(loader) for _ in range(2)]
    finally:
        loader.close()


def settings() -> MimoBatchSettings:
    processor = vlm_sft.open_processor(recipe.pipeline_config(recipe.parse_args(TINY), "off"))
    return MimoBatchSettings.for_processor(processor, modality=recipe.MODALITY, encoder_key=recipe.ENCODER_KEY)


def test_the_vision_submodule_fills_every_placeholder(micro_batches: list[dict]) -> None:
    """megatron-core's VisionModalitySubmodules, built from the recipe's spec, encodes mimo_batch's
    modality_inputs into one row of the language width per image placeholder."""
    from megatron.core.models.mimo.submodules.vision import VisionModalitySubmodules

    args = recipe.parse_args(TINY)
    processor = vlm_sft.open_processor(recipe.pipeline_config(args, "off"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = recipe.mimo_model_config(args, len(processor.tokenizer), processor.image_token_id)
        vision = VisionModalitySubmodules.from_spec(config.modality_submodules_spec[recipe.MODALITY])
    assert config.special_token_ids == {recipe.MODALITY: processor.image_token_id}
    for batch in micro_batches:
        kwargs = mimo_batch(batch, settings())
        placeholders = int((kwargs["input_ids"] == processor.image_token_id).sum())
        assert placeholders > 0
        with torch.no_grad():
            embeddings = vision(encoder_inputs=kwargs["modality_inputs"][recipe.MODALITY])
        assert tuple(embeddings.shape) == (placeholders, args.lm_hidden)


def test_the_keyword_arguments_are_mimo_model_forwards(micro_batches: list[dict]) -> None:
    """Every key mimo_batch gives is a parameter of the installed MimoModel.forward (0.16 has no
    packing_kwargs: an unpacked micro-batch leaves it None), with M-RoPE positions [3, B, S]."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.mimo import MimoModel
    parameters = set(inspect.signature(MimoModel.forward).parameters) - {"self"}
    kwargs = mimo_batch(micro_batches[0], settings())
    assert set(kwargs) == set(FORWARD_KEYS)
    assert set(kwargs) - parameters <= {"packing_kwargs"} and kwargs["packing_kwargs"] is None
    batch, rows = micro_batches[0]["input_ids"].shape
    assert tuple(kwargs["position_ids"].shape) == (3, batch, rows)
    assert set(kwargs["modality_inputs"][recipe.MODALITY][recipe.ENCODER_KEY]) == {"hidden_states", "grid_thw"}


def test_to_device_moves_nested_tensors_and_keeps_the_rest() -> None:
    value = {"a": torch.ones(2), "b": {"c": torch.zeros(1), "d": None}, "e": 3}
    moved = recipe.to_device(value, torch.device("cpu"))
    assert torch.equal(moved["a"], value["a"]) and moved["b"]["d"] is None and moved["e"] == 3


@pytest.mark.parametrize("prefetch", ["0", "3"])
def test_the_recipe_reads_ahead_through_the_pipelines_setting(prefetch: str) -> None:
    config = recipe.pipeline_config(recipe.parse_args(["--prefetch", prefetch]), "on")
    assert config.read_ahead == int(prefetch)
    config.validate(1)


def _record(iteration: int, loss: float, model: float, wait: float, batch: float) -> recipe.IterationRecord:
    return recipe.IterationRecord(iteration=iteration, loss=loss, model_ms=model, wait_ms=wait, batch_ms=batch,
                                  iteration_ms=model + wait + batch, grad_norm=1.0, loss_tokens=10, images=1, image_tokens=4,
                                  sample_ids=[[iteration]])


def test_the_summary_leaves_out_the_first_iteration_and_counts_conversion_only_on_the_training_thread() -> None:
    records = [_record(1, 9.0, 5000.0, 900.0, 100.0), _record(2, 8.0, 97.0, 1.0, 2.0), _record(3, 7.0, 97.0, 1.0, 2.0)]
    direct = recipe.summary(records, prefetching=False)
    assert (direct["loss_first"], direct["loss_last"], direct["median_model_ms"]) == (9.0, 7.0, 97.0)
    assert direct["wait_percent"] == pytest.approx(1.0) and direct["data_percent"] == pytest.approx(3.0)
    prefetched = recipe.summary(records, prefetching=True)
    assert prefetched["data_percent"] == pytest.approx(1.0) and prefetched["micro_batches"] == 3


def test_out_of_gpu_memory_ends_in_one_line_naming_what_cuts_memory(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def run_out(args, argv):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(recipe, "run", run_out)
    assert recipe.main(["--seq-length", "4096", "--micro-batch-size", "8"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("megatron_mimo_train: out of GPU memory at --micro-batch-size 8 --seq-length 4096 ") and "lower --micro-batch-size" in err


@pytest.mark.parametrize(("tokens", "seq_length", "refused"), [([10, 30, 20], 31, False), ([10, 30, 20], 30, True), ([], 8, False)])
def test_rows_whose_placeholders_leave_no_token_to_train_on_are_found(tokens: list[int], seq_length: int, refused: bool) -> None:
    from mimo_pipes.megatron.fit import seq_length_problem

    problem = seq_length_problem(tokens, seq_length)
    assert (problem is not None) == refused
    if refused:
        assert problem == ("1 dataset row needs more than 30 tokens for their image placeholders alone (row 1: 30 placeholders and one "
                           "token to train on); give a --seq-length above 31")


def test_a_seq_length_too_short_for_the_data_is_refused_before_the_model_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    from mimo_pipes.errors import ConfigError

    monkeypatch.setattr(recipe, "build_model", lambda *args, **kwargs: pytest.fail("built the model"))
    monkeypatch.setenv("MIMO_PIPES_SETTING_NAMES", "flags")  # the recipe's command names its flags
    args = recipe.parse_args([*TINY, "--seq-length", "512", "--device", "cpu"])
    with pytest.raises(ConfigError, match=r"^--seq-length: .*dataset row \d+: needs \d+ tokens for its images.* more than --seq-length 512") as error:
        recipe.train_run(args, "off", pgs=None, log=lambda line: None)
    assert "\n" not in str(error.value)
