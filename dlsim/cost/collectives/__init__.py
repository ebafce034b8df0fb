"""Collective communication: closed forms, executable schedules, automatic choice, vectorised sweeps.

Each algorithm is a pure function of the vector size n (bytes), the rank count p and the per-message
prices of `costs.py` (a p2p model from `dlsim.cost.p2p` and the reduction cost γ), with its formula
and source in its module docstring; its schedule replays to exactly the same time (`replay.py`).
"""

from dlsim.cost.collectives.bounds import bus_factor
from dlsim.cost.collectives.core import (choose_algorithm, collective_time, expand_schedule, lower_bound,
                                         make_options)
from dlsim.cost.collectives.costs import Costs, make_costs
from dlsim.cost.collectives.registry import ALGORITHMS, COLLECTIVES, Options
from dlsim.cost.collectives.replay import replay_dataflow, replay_steps
from dlsim.cost.collectives.schedule import Message, Schedule

__all__ = ["ALGORITHMS", "COLLECTIVES", "Costs", "Message", "Options", "Schedule", "bus_factor", "choose_algorithm",
           "collective_time", "expand_schedule", "lower_bound", "make_costs", "make_options", "replay_dataflow",
           "replay_steps"]
