"""One module's process groups, from its ``HyperCommGrid``: the groups megatron-core's DDP, optimizer and
communicators ask for, made once per grid, and the module's ``ProcessGroupCollection`` read from them."""

from __future__ import annotations

from typing import Any

GRID_DIMS = ("tp", "cp", "pp", "dp")
"""Fastest first: the order the pipeline places a module's ranks in (:mod:`mimo_pipes.megatron.grids`)."""
EXPERT_DIMS = ("expt_tp", "ep", "pp", "expt_dp")
"""The view ``get_mimo_optimizer`` reads a module's expert groups from."""
DENSE_GROUPS = ("tp", "cp", "dp", "pp", ("dp", "cp"), ("tp", "pp"), ("tp", "cp"), ("tp", "cp", "dp", "pp"), ("tp", "dp", "cp"))
EXPERT_GROUPS = (("expt_tp", "ep", "pp"), "expt_dp", "ep", "expt_tp")


def _dims(dims: str | tuple[str, ...]) -> str | list[str]:
    return dims if isinstance(dims, str) else list(dims)


def module_grid(*, tp: int, pp: int, dp: int, rank_offset: int, create_groups: bool = True) -> Any:
    """A module's ``HyperCommGrid`` of ``tp x 1 x pp x dp`` ranks from ``rank_offset``. With ``create_groups``
    every group of ``DENSE_GROUPS`` and ``EXPERT_GROUPS`` is made (a collective over the world: every rank makes
    every module's grid, in the same order)."""
    from megatron.core.hyper_comm_grid import HyperCommGrid

    grid = HyperCommGrid([tp, 1, pp, dp], list(GRID_DIMS), rank_offset=rank_offset)
    if create_groups:
        grid.register_view("expert", [tp, 1, pp, dp], list(EXPERT_DIMS), shared_dims=["pp"])
        for dims in DENSE_GROUPS:
            grid.create_pg(_dims(dims))
        for dims in EXPERT_GROUPS:
            grid.create_pg(_dims(dims), view="expert")
    return grid


def pg_collection(grid: Any) -> Any:
    """One module's ``ProcessGroupCollection``, from its grid (the groups :func:`module_grid` made). Input and
    output embeddings are not shared (``share_embeddings_and_output_weights`` False): no embedding groups."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    pgs = ProcessGroupCollection()
    pgs.tp, pgs.cp, pgs.dp, pgs.pp = grid.get_pg("tp"), grid.get_pg("cp"), grid.get_pg("dp"), grid.get_pg("pp")
    pgs.dp_cp, pgs.mp, pgs.tp_cp = grid.get_pg(["dp", "cp"]), grid.get_pg(["tp", "pp"]), grid.get_pg(["tp", "cp"])
    pgs.tp_dp_cp = grid.get_pg(["tp", "dp", "cp"])
    pgs.intra_dist_opt = grid.get_pg(["tp", "cp", "dp", "pp"])
    pgs.expt_dp, pgs.ep = grid.get_pg("expt_dp", view="expert"), grid.get_pg("ep", view="expert")
    pgs.expt_tp, pgs.tp_ep_pp = grid.get_pg("expt_tp", view="expert"), grid.get_pg(["expt_tp", "ep", "pp"], view="expert")
    pgs.embd = pgs.pos_embd = None
    return pgs
