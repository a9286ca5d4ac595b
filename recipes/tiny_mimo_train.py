"""Recipe: train a tiny non-colocated MIMO model on the embedded data, on CPU (Gloo).

The encoder module's ranks run a Qwen2-VL-style vision tower, the language module's ranks a small causal
LM (random seeded weights, the embedded tokenizer's vocabulary). Both read through the same graph (this
recipe's :func:`build`, the graph of :mod:`mimo_pipes_recipes.vlm_sft`), so encoder replica i's
micro-batch is, sample for sample, the micro-batches of language replicas [i*k, (i+1)*k) concatenated;
the bridge checks the sample ids. A recipe of your own can train on its own data with this model:
import :class:`Trainer` and provide ``prepare`` and ``build`` (``mimo-pipes train`` hands the loader
``build`` returns to the Trainer).

One iteration = one global batch = ``config.microbatches_per_global_batch`` micro-batches with gradient
accumulation. The loss is normalised over the global batch: sum of per-token losses of every micro-batch
on every language rank, divided by the global batch's count of loss tokens (one all-reduce before the
first micro-batch). Which rank or micro-batch holds a sample does not change it (see docs/training.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.counts import as_count
from mimo_pipes.config.job_options import TrainOptions
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.demo_model.bridge import recv_embeddings, recv_gradients, send_embeddings, send_gradient
from mimo_pipes.demo_model.encoders import build_vision_tower, encode, vision_tower_config
from mimo_pipes.demo_model.reduce import sum_gradients, sum_over
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.exchange.process_groups import RankGroups
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.observe.bad_rows_report import bad_row_fields
from mimo_pipes.observe.third_party import quiet_transformers
from mimo_pipes.parallel.topology import COMPONENT_FLAG, Topology, fanout_targets
from mimo_pipes_recipes import vlm_sft

# The data side is the SFT recipe's: run, analyze and train read alike.
prepare = vlm_sft.prepare
row_counts = vlm_sft.row_counts

IGNORE_INDEX = -100
# A causal LM small enough for two CPU cores; its width is the vision tower's output width.
TINY_LANGUAGE = {"intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2}


@dataclass
class StepResult:
    """One iteration on one rank: the global batch's loss (language ranks), wall time, model compute time."""

    iteration: int  # 1-based, counted from the start of training
    module: str
    dp_rank: int
    loss: float | None
    seconds: float
    compute_seconds: float  # forward + backward of this rank's model, summed over the micro-batches
    records: list[dict[str, Any]] = field(default_factory=list)  # per micro-batch, as `run` records them


def check_layout(topology: Topology) -> None:
    """The tiny trainer runs data parallelism only, with one encoder module feeding the language module."""
    if len(topology.encoders) != 1:
        raise ConfigError(COMPONENT_FLAG, f"training needs exactly one encoder module besides language, got {len(topology.encoders)}")
    for module in topology.modules:
        if module.tp * module.cp * module.pp > 1:
            raise ConfigError(COMPONENT_FLAG, f"{module.name}: the tiny training recipe runs data parallelism only (tp=cp=pp=1)")


def language_model(vocab_size: int, width: int, max_positions: int, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=width, max_position_embeddings=max_positions, **TINY_LANGUAGE)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def vocabulary_size(config: PipelineConfig) -> int:
    from transformers import AutoTokenizer

    with quiet_transformers():
        return len(AutoTokenizer.from_pretrained(vlm_sft.processor_path(config)))


class Trainer:
    """One rank of the tiny MIMO run: its module's model, an SGD optimizer and the rank's ``loader`` (what
    the recipe's ``build`` made for this rank's layout)."""

    def __init__(self, config: PipelineConfig, options: TrainOptions, groups: RankGroups, topology: Topology, loader: GraphLoader) -> None:
        check_layout(topology)
        self.config = config
        self.position = position = groups.position
        self.dp_group = groups.dp_group if position.dp_size > 1 else None
        self.microbatches = config.microbatches_per_global_batch
        self.loader = loader
        self.image_token_id = load_processor(vlm_sft.processor_path(config), config.seq_length).image_token_id
        encoder, language = topology.encoders[0], topology.language
        self.width = vision_tower_config(options.vision_tower).hidden_size
        self.is_language = position.module.is_language
        if self.is_language:
            source_dp = position.dp_rank // (language.dp // encoder.dp)
            self.source = encoder.rank_offset + source_dp
            self.model = language_model(vocabulary_size(config), self.width, config.seq_length, config.seed)
        else:
            self.targets = [language.rank_offset + j for j in fanout_targets(position.dp_rank, encoder.dp, language.dp)]
            self.model = build_vision_tower(options.vision_tower, dtype=torch.float32, seed=config.seed)
        # SGD, not Adam: an update linear in the gradient keeps float-order noise at float-order size (Adam's
        # first step is ~lr * sign(g), which turns noise in a near-zero gradient into a full step).
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=options.lr)

    @property
    def iteration(self) -> int:
        """Iterations done since the start of training (continues across a resume)."""
        return self.loader.consumed_microbatches // self.microbatches

    def step(self) -> StepResult:
        started = time.perf_counter()
        batches = [next(self.loader) for _ in range(self.microbatches)]
        if self.is_language:
            loss, compute = self._language_step(batches)
        else:
            loss, compute = None, self._encoder_step(batches)
        sum_gradients(self.model.parameters(), self.dp_group)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(
            iteration=self.iteration,
            module=self.position.module.name,
            dp_rank=self.position.dp_rank,
            loss=loss,
            seconds=time.perf_counter() - started,
            compute_seconds=compute,
            records=[self._record(batch) for batch in batches],
        )

    def _language_step(self, batches: list[dict]) -> tuple[float, float]:
        # The global batch's loss-token count, known before the first backward: every micro-batch's loss is
        # divided by the same number on every rank, so the summed gradient is d(global mean)/d(weights).
        local_tokens = sum(int((batch["labels"] != IGNORE_INDEX).sum()) for batch in batches)
        tokens = max(sum_over(local_tokens, self.dp_group), 1.0)
        loss_sum, compute = 0.0, 0.0
        for batch in batches:
            embeddings, sample_ids = recv_embeddings(self.source)
            if sample_ids != list(batch["sample_ids"]):
                raise RuntimeError(
                    f"language dp rank {self.position.dp_rank}, micro-batch {batch['step']}: encoder rank {self.source} "
                    f"sent samples {sample_ids}, this rank holds {batch['sample_ids']}"
                )
            began = time.perf_counter()
            embeddings.requires_grad_(True)
            token_loss = self._token_loss_sum(batch, embeddings)
            (token_loss / tokens).backward()
            compute += time.perf_counter() - began
            send_gradient(embeddings.grad, self.source)
            loss_sum += float(token_loss.detach())
        return sum_over(loss_sum, self.dp_group) / tokens, compute

    def _token_loss_sum(self, batch: dict, embeddings: torch.Tensor) -> torch.Tensor:
        """Sum of the micro-batch's per-token losses, image embeddings spliced in at the placeholders."""
        input_ids = batch["input_ids"]
        placeholders = input_ids == self.image_token_id
        if int(placeholders.sum()) != embeddings.shape[0]:
            raise RuntimeError(f"micro-batch {batch['step']}: {int(placeholders.sum())} image placeholders, {embeddings.shape[0]} embeddings")
        inputs = self.model.get_input_embeddings()(input_ids)
        inputs = inputs.masked_scatter(placeholders.unsqueeze(-1), embeddings.to(inputs.dtype))
        logits = self.model(inputs_embeds=inputs, attention_mask=batch["attention_mask"]).logits
        # The processor's labels are already next-token targets: no shift here. Summed in float64, so the sum
        # does not depend on how the samples are grouped beyond the last bits of each token's loss.
        token_losses = F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE_INDEX, reduction="none")
        return token_losses.double().sum()

    def _encoder_step(self, batches: list[dict]) -> float:
        compute = 0.0
        for batch in batches:
            began = time.perf_counter()
            has_images = batch["pixel_values"].shape[0] > 0
            embeddings = encode(self.model, batch["pixel_values"], batch["image_grid_thw"]) if has_images else torch.zeros(0, self.width)
            compute += time.perf_counter() - began
            rows = send_embeddings(embeddings, batch["sample_ids"], batch["image_tokens"], self.targets)
            gradient = recv_gradients(self.targets, rows, self.width)
            began = time.perf_counter()
            if has_images:
                embeddings.backward(gradient)
            compute += time.perf_counter() - began
        return compute

    def _record(self, batch: dict) -> dict[str, Any]:
        position = self.position
        keys = ("step", "sample_ids", "image_tokens", "real_tokens", "slots", "read_steps")
        return {"module": position.module.name, "dp_rank": position.dp_rank, "dp_size": position.dp_size, **{k: batch[k] for k in keys},
                **bad_row_fields(batch)}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.loader.load_state_dict(state["loader"])

    def close(self) -> None:
        self.loader.close()


def build(config: PipelineConfig, layout: RankLayout, *, consumed_microbatches: int = 0) -> GraphLoader:
    """The loader both modules read through (so ``mimo-pipes run --recipe`` works with this recipe too)."""
    return vlm_sft.build(config, layout, consumed_microbatches=as_count(consumed_microbatches, "consumed_microbatches"))
