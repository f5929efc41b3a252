"""Planner: costs, hardware presets, the MILP, heuristics, simulator, lower bound and the Plan.

Pure Python (numpy-free core, python-mip for the MILP): it never imports jax, so a 27B model can
be planned on a laptop. The executor runs exactly the decisions of a ``Plan``.
"""

from lazytrain_jax.schedule.costs import Costs, analytic_costs, synthetic_costs
from lazytrain_jax.schedule.hardware import PRESETS, Hardware
from lazytrain_jax.schedule.plan import PLAN_VERSION, Plan

__all__ = ["Costs", "Hardware", "PLAN_VERSION", "PRESETS", "Plan", "analytic_costs", "synthetic_costs"]
