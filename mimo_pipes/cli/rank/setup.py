"""This rank's place in the job: the topology, every module's groups and the layout its graph is built for,
set up collectively before the loop."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from mimo_pipes.cli.job.launcher import report_phase
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.transport import resolve_exchange_transport
from mimo_pipes.data.from_config import check_data_settings
from mimo_pipes.exchange import RankLayout
from mimo_pipes.exchange.process_groups import RankGroups, build_rank_groups
from mimo_pipes.exchange.world import agreement_group, control_group, current_backend, job_group, world_size
from mimo_pipes.parallel.topology import RankPosition, Topology


@dataclass(frozen=True)
class RankSetup:
    """This rank's place in the job: the topology, its groups, the layout its graph is built for, the
    group of the job's ranks (None: the whole world) and a Gloo group of them for the loop's agreements."""

    topology: Topology
    groups: RankGroups
    layout: RankLayout
    job: Any = None
    control: Any = None

    @property
    def position(self) -> RankPosition:
        return self.groups.position

def set_up_rank(config: PipelineConfig, *, exchange_transport: str | None = None) -> RankSetup | None:
    """Collective over the world: check the config, build every module's groups, and this rank's layout;
    None on a rank beyond the job's (it only took part in making the groups). ``exchange_transport``
    None: resolved from the config and the world's backend."""
    topology = config.validate()
    check_data_settings(config)
    if topology.world_size > world_size():
        config.validate(world_size=world_size())  # names the first rank missing
    transport = exchange_transport or resolve_exchange_transport(
        config.exchange_transport,
        current_backend(),
        config.reorder.overlap_intra_microbatch_reorder or config.read_ahead > 0,  # off the training thread
        os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        warn=False,  # said once by the job's checks before the ranks started
    )
    groups = build_rank_groups(topology, exchange_backend=transport, timeout_s=config.exchange_timeout_s)
    job, control = job_group(topology.world_size), control_group(topology.world_size)
    # Rows that fail after the exchange are agreed on by every module (rows payload, --skip-bad-samples).
    masks = config.skip_bad_samples and config.exchange_payload == "rows"
    agreement = agreement_group(topology.world_size, config.exchange_timeout_s) if masks else None
    if groups is None:
        return None
    device = None
    if transport == "nccl":
        import torch

        device = torch.device("cuda", torch.cuda.current_device())
    layout = groups.layout(device, agreement)
    report_phase("joined")
    return RankSetup(topology, groups, layout, job, control)
