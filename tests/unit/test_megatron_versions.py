"""One rule for M-RoPE positions and packed micro-batches (megatron-core >= 0.18, whose MimoModel.forward takes
packing_kwargs), held by fit_to_forward and by the recipes before they build anything: with the installed
megatron-core and with a fake forward of a later release."""

from __future__ import annotations

import pytest
import torch

from mimo_pipes.megatron import ForwardSupport, fit_to_forward, forward_support, require_mrope_and_packing
from mimo_pipes.megatron.forward import installed_version, release
from mimo_pipes_recipes import megatron_mimo_grids, megatron_mimo_train


def forward_016(self, input_ids, position_ids=None, attention_mask=None, loss_mask=None, labels=None, modality_inputs=None):
    return None


def forward_018(self, input_ids, position_ids=None, attention_mask=None, loss_mask=None, labels=None, modality_inputs=None,
                packing_kwargs=None):
    return None


def kwargs(*, mrope: bool, packed: bool = False) -> dict:
    positions = torch.zeros((3, 2, 8) if mrope else (2, 8), dtype=torch.long)
    packing = {"cu_seqlens_q": torch.tensor([0, 8], dtype=torch.int32), "max_seqlen_q": 8} if packed else None
    return {"input_ids": torch.zeros(2, 8, dtype=torch.long), "position_ids": positions, "attention_mask": None,
            "loss_mask": torch.ones(2, 8), "labels": torch.zeros(2, 8, dtype=torch.long), "modality_inputs": None,
            "packing_kwargs": packing}


@pytest.mark.parametrize(("version", "forward", "both"), [
    ("0.16.1", forward_016, False),
    ("0.17.0", forward_018, False),   # packing_kwargs in the signature, the release below the floor
    ("0.18.0", forward_016, False),   # a forward without packing_kwargs, whatever the release says
    ("0.18.0", forward_018, True),
    ("0.18.0rc2", forward_018, True),
    ("0.19.2", forward_018, True),
    ("1.0.0", forward_018, True),
])
def test_the_rule_needs_the_release_and_the_signature(version, forward, both):
    support = forward_support(forward, version=version)
    assert support.mrope_and_packing is both
    for mrope, packed in ((True, False), (False, True), (True, True)):
        if both:
            fitted = fit_to_forward(kwargs(mrope=mrope, packed=packed), forward, version=version)
            assert fitted["position_ids"].dim() == (3 if mrope else 2) and (fitted["packing_kwargs"] is not None) == packed
        else:
            with pytest.raises(ValueError, match=r"^fit_to_forward: .* need megatron-core >= 0\.18.*Python >= 3\.12") as error:
                fit_to_forward(kwargs(mrope=mrope, packed=packed), forward, version=version)
            assert "\n" not in str(error.value) and "mrope=False" in str(error.value)


def test_plain_positions_pass_everywhere_and_a_missing_key_is_dropped_only_when_none():
    for version, forward in (("0.16.1", forward_016), ("0.19.2", forward_018)):
        fitted = fit_to_forward(kwargs(mrope=False), forward, version=version)
        assert fitted["position_ids"].shape == (2, 8)
        assert ("packing_kwargs" in fitted) == (forward is forward_018)
    with pytest.raises(ValueError, match="takes no extra"):
        fit_to_forward({**kwargs(mrope=False), "extra": 1}, forward_018, version="0.19.2")


def test_the_installed_release_is_held_to_the_same_rule():
    """The installed megatron-core (0.16.1 under Python 3.11 here; 0.18+ under 3.12) and its own forward."""
    support = forward_support()
    assert support.version == installed_version()
    expected = release(support.version) >= (0, 18) and "packing_kwargs" in support.parameters
    assert support.mrope_and_packing is expected
    if not expected:
        with pytest.raises(ValueError, match="cannot take M-RoPE position_ids"):
            fit_to_forward(kwargs(mrope=True))
    else:
        assert fit_to_forward(kwargs(mrope=True))["position_ids"].dim() == 3


@pytest.mark.parametrize("recipe", [megatron_mimo_train, megatron_mimo_grids])
def test_the_recipes_check_the_release_before_building_anything(recipe, monkeypatch, capsys):
    """Below the rule the recipe ends in one line before any model, process group or loader exists; at or above
    it, the check passes (the recipe then goes on)."""
    built = []
    for name in ("build_model", "train_run"):
        monkeypatch.setattr(recipe, name, lambda *a, _name=name, **k: built.append(_name), raising=False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: built.append("process group"))
    monkeypatch.setattr(torch.cuda, "set_device", lambda *a, **k: built.append("device"))
    monkeypatch.setattr("mimo_pipes.megatron.forward.installed_version", lambda: "0.16.1")
    monkeypatch.setattr("mimo_pipes.megatron.forward.mimo_forward", lambda: forward_016)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the release is said before the machine is looked at
    floor = "megatron-core >= 0.18" if recipe is megatron_mimo_train else "megatron-core 0.19 or later"  # the grids' communicator
    try:
        status = recipe.main(["--iterations", "1"])
    except SystemExit as exit_info:
        status = exit_info.code
    message = capsys.readouterr().err.strip()
    assert status == 2, status  # both recipes: a refused setting or machine is exit status 2
    assert message.startswith(recipe.__name__.rsplit(".", 1)[-1] + ": ") and floor in message, message
    assert "0.16.1" in message and "\n" not in message and built == []


def test_the_check_passes_a_later_release_and_names_a_missing_one(monkeypatch):
    support = require_mrope_and_packing("prog", forward_018, version="0.19.2")
    assert support == ForwardSupport("0.19.2", forward_support(forward_018, version="0.19.2").parameters) and support.mrope_and_packing
    monkeypatch.setattr("mimo_pipes.megatron.forward.installed_version", lambda: None)
    with pytest.raises(SystemExit, match="^prog: needs megatron-core's MimoModel: megatron-core is not installed"):
        require_mrope_and_packing("prog")


@pytest.mark.parametrize(("text", "expected"), [("0.16.1", (0, 16)), ("0.18.0rc1", (0, 18)), ("0.19", (0, 19)), ("1", (1, 0))])
def test_release_reads_major_and_minor(text, expected):
    assert release(text) == expected
