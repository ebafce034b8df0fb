"""``dlsim stacks``: the software stacks a prediction can assume, and every key of one with its source."""

from __future__ import annotations

import click

from dlsim.cli import main
from dlsim.cli.options import json_option
from dlsim.cli.output import emit_record
from dlsim.io.stack_yaml import all_stacks, load_stack
from dlsim.report.stack_text import stack_diff_table, stack_table, stacks_table


@main.group("stacks", invoke_without_command=True)
@json_option
@click.pass_context
def stacks_group(ctx: click.Context, json_out: str | None) -> None:
    """List the software stacks (framework and version) a run can name with --stack.

    `dlsim stacks show NAME` prints every key of one stack with the framework code it was read from;
    `dlsim stacks diff A B` the keys two stacks set differently.
    """
    if ctx.invoked_subcommand is not None:
        return
    emit_record([{**s.to_dict(), "description": s.description, "path": s.path} for s in all_stacks()], json_out,
                stacks_table)


@stacks_group.command("show")
@click.argument("name")
@json_option
def show_cmd(name: str, json_out: str | None) -> None:
    """Every key of stack NAME (a name from `dlsim stacks` or a stack YAML file) with its source."""
    s = load_stack(name)
    rec = {**s.to_dict(), "description": s.description, "repositories": list(s.repositories),
           "sources": {k: s.sources[k] for k in s.values}, "notes": list(s.notes), "path": s.path}
    emit_record(rec, json_out, stack_table)


@stacks_group.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--sources", is_flag=True, help="Print the framework code each value was read from.")
@json_option
def diff_cmd(a: str, b: str, sources: bool, json_out: str | None) -> None:
    """The keys stacks A and B (names from `dlsim stacks` or stack YAML files) set differently; a key
    one stack leaves unset shows what a strategy then runs. The JSON record has every source."""
    from dlsim.api.stacks import stack_diff
    emit_record(stack_diff(load_stack(a), load_stack(b)), json_out, lambda rec: stack_diff_table(rec, sources))
