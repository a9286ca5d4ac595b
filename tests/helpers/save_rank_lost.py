"""One rank of a training script that joins its process group itself (as a Megatron loop under torchrun does) and
saves the pipeline's state into an iteration folder; ``--victim`` rank dies (``os._exit``) while writing its part.
Every other rank prints one JSON line: the type and message of what the save raised, or ``saved``.

    python save_rank_lost.py --rank R --world-size N --checkpoint DIR --victim V
(MASTER_ADDR, MASTER_PORT and TORCHELASTIC_USE_AGENT_STORE from the environment, as torchrun sets them.)"""

from __future__ import annotations

import argparse
import datetime
import json
import os

import torch.distributed as dist

from mimo_pipes.config import PipelineConfig
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.megatron import checkpoint

COMPONENTS = ("language=dp=2,rank_offset=0", "images=dp=1,rank_offset=2")


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--rank", "--world-size", "--victim", "--timeout"):
        parser.add_argument(flag, type=int, required=flag != "--timeout", default=60)
    parser.add_argument("--checkpoint", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world_size, timeout=datetime.timedelta(seconds=args.timeout))
    if args.rank == args.victim:
        def die(*_args, **_kwargs):
            os._exit(9)  # killed mid-save: nothing said, nothing flushed

        checkpoint.write_rank_files = die
    config = PipelineConfig(components=COMPONENTS, micro_batch_size=2, seq_length=64)
    try:
        checkpoint.save_pipeline_state(args.checkpoint, 1, {GraphLoader.CONSUMED_KEY: 3}, config=config, consumed_microbatches=3)
        said = {"rank": args.rank, "type": "saved", "message": ""}
    except Exception as error:  # noqa: BLE001 - what the save raised is what the test reads
        said = {"rank": args.rank, "type": type(error).__name__, "message": str(error)}
    print(json.dumps(said), flush=True)
    os._exit(0)  # the process group is broken: no teardown


if __name__ == "__main__":
    main()
