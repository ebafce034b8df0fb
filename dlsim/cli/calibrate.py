"""``dlsim calibrate``: measure real kernels and collectives into a hardware profile.

Subcommands live in their own modules (``calibrate_comm``, ``calibrate_compute``) and attach here.
"""

from __future__ import annotations


from dlsim.cli import main


@main.group()
def calibrate() -> None:
    """Measure real kernels (compute) or collectives (comm) and write tables into a profile."""


for _name in ("calibrate_comm", "calibrate_compute", "calibrate_microbatch"):
    try:
        __import__(f"dlsim.cli.{_name}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"dlsim.cli.{_name}":
            raise
