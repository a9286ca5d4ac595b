"""The window planner's tuning: every knob in one frozen object, each a count (never a clock), so a plan is
the same on every machine. Each knob trades planning time (on the cold path of every window) against how
close the plan comes to the optimum; docs/balancing.md has the figures that set them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WindowTuning:
    """Budgets and thresholds of :func:`~mimo_pipes.balance.window.planner.balance_window` (samples moving
    between micro-batches). The defaults are :data:`TUNING`; a test or a benchmark passes another by keyword."""

    # Swaps across micro-batches (``improve``): swaps taken and candidate swaps looked at (a few ms of numpy
    # on a busy 2-core machine). More lowers the path further on windows far from their bound, at that cost.
    max_moves: int = 512
    max_work: int = 200_000
    # Work an iteration of the swaps counts at least (its fixed cost: a sort of the bins, a few small arrays),
    # so that small windows do not take many more iterations than the budget means.
    iteration_work: int = 2_000
    # Refinement rounds inside a micro-batch once the swaps across micro-batches touched it: a lower spread
    # inside it against time (its spread does not change the path).
    light_rounds: int = 2
    # The second starts (heads then fill, fill to level) place one sample at a time: windows up to this many
    # samples get them.
    fill_max_samples: int = 2048
    # The swaps (and the second starts) run on windows of at most this many samples: above it an iteration
    # looks at too many pairs to pay for itself within the budgets.
    search_max_samples: int = 2048
    # The swaps run only while the sorted runs are more than 1/near_bound (0.1%) above the window bound, and
    # the exact searches only while the best plan is: closer, they cannot gain enough to pay for themselves.
    near_bound: int = 1000
    # Windows of at most this many samples (two or more per slot) end with the branch and bounds over samples
    # (``bin_search``, then ``window_search``), each on this many samples placed: optimal on more windows
    # against tens of ms.
    exact_max_samples: int = 64
    exact_nodes: int = 500
    # Windows of at most ``few_costs`` distinct costs give the search over bins ``few_costs_factor`` times
    # its budget: there few distinct plans exist, and the larger budget reaches the optimum.
    few_costs: int = 8
    few_costs_factor: int = 10
    # The search over unlabelled bins goes first when the window has at most 1/ties as many distinct costs as
    # samples (equal costs are what it does not repeat).
    ties: int = 2
    # Windows of at most ``few_costs`` distinct costs whose bins come in at most ``count_max_types`` kinds (k
    # samples of d costs: C(d+k-1, k) kinds) and of at most ``count_max_samples`` samples (above
    # ``exact_max_samples`` it is their only search) start with the exact search over counts, on
    # ``count_work`` units (``count_search``: about 5,000 states bounded, tens of ms). 0 turns it off.
    count_max_types: int = 70
    count_work: int = 400_000
    count_max_samples: int = 256
    # Windows too large to search, up to ``certify_max_samples``, get one more start (fill to level) only when
    # the path bound cannot certify the plan within 1/certify_gap (3%) of the optimum: it places one sample at
    # a time (tens of ms at 4096 samples), which windows near their bound do not pay.
    certify_gap: int = 33
    certify_max_samples: int = 4096
    # Compositions scored: all of a family when it has at most ``compositions_dense`` members, else those and
    # then members that grow by at least 1/compositions_growth each (a few hundred at most for any window),
    # so large windows stay linear in their samples. More members find better compositions, slower.
    compositions_dense: int = 32
    compositions_growth: int = 16
    # Pairs (then triples, up to ``pairs_max_width``) of micro-batches re-planned together by the branch and
    # bound over samples (``pairs``): windows of at most ``pairs_max_samples`` samples (two or more per slot)
    # whose plan is more than 1/``pairs_near_bound`` above the path bound; a pair's search places at most
    # ``pair_nodes`` samples (a triple's twice that), all of one start's at most ``pairs_start_nodes``; the best
    # plan and then up to ``pairs_starts`` - 1 of the planner's other starts are searched (fewer: faster, the
    # plan higher on mixed windows). 0 samples turns the step off. ``pairs_after_exact``: the exact searches
    # (step 4) run first and the pair searches only when those did not prove their plan optimal (windows of a
    # few distinct costs, which the search over counts settles, then pay nothing for them); False runs the
    # pair searches first and the exact searches from their plan.
    pairs_max_samples: int = 512
    pairs_near_bound: int = 1000
    pair_nodes: int = 1_000
    pairs_start_nodes: int = 10_000
    pairs_max_width: int = 3
    pairs_starts: int = 1
    pairs_after_exact: bool = True
    # The search over levels (``levels``, after the pair searches, where the exact searches did not prove): windows
    # of at most ``levels_max_samples`` samples (0 turns it off) and 2 to ``levels_max_per_slot`` per slot (with
    # more, one swap at a time reaches the caps less often: balance.py's windows of 4 a slot gained little for
    # tens of ms), at most ``levels_distinct_percent`` distinct costs per 100 samples, more than
    # 1/``levels_near_bound`` above the path bound; at most ``levels_max_light`` light micro-batches, each no
    # heavier than the floor or 1/``levels_light_share`` of the mean slot load. A repair toward caps
    # takes at most ``levels_repair_swaps`` swaps and stops after ``levels_stall`` swaps without a new least
    # excess; a swapped sample stays put for ``levels_tabu`` swaps. Each descent looks at
    # ``levels_descent_work`` candidate swaps, the whole search at ``levels_work``.
    levels_max_samples: int = 512
    levels_max_per_slot: int = 3
    levels_repair_swaps: int = 400
    levels_stall: int = 10
    levels_tabu: int = 7
    levels_distinct_percent: int = 50
    levels_max_light: int = 2
    levels_near_bound: int = 100
    levels_light_share: int = 2
    levels_descent_work: int = 300_000
    levels_work: int = 5_000_000


TUNING = WindowTuning()
