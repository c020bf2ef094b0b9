"""Options of a ``PersistentGroup`` are accepted on the group and after every command below it, as
cobra's persistent flags are (upstream's nstance-admin declares --temp-dir/--debug on the root, the
storage flags on ``cluster`` and the shard flags on ``group`` and ``config`` that way)."""

from __future__ import annotations

from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from nstance.admin.persistent import PersistentGroup, option_value


def version_callback(value: bool) -> None:
    if value:
        typer.echo("v1")
        raise typer.Exit(0)


def build() -> typer.Typer:
    """A root with --top and an eager --version; below it ``grp`` with --where/-f and two commands."""
    root = typer.Typer(cls=PersistentGroup, add_completion=False)
    group = typer.Typer(cls=PersistentGroup, add_completion=False)
    root.add_typer(group, name="grp")

    @root.callback()
    def root_options(
        top: Annotated[str, typer.Option("--top")] = "top-default",
        version: Annotated[bool, typer.Option("--version", is_eager=True, callback=version_callback)] = False,
    ) -> None:
        del top, version

    @group.callback()
    def group_options(
        where: Annotated[str, typer.Option("--where", envvar="TEST_WHERE")] = "where-default",
        flag: Annotated[bool, typer.Option("--flag", "-f")] = False,
    ) -> None:
        del where, flag

    @group.command("show")
    def show(ctx: typer.Context, extra: Annotated[str, typer.Option("--extra")] = "") -> None:
        names = ("top", "where", "flag")
        typer.echo(" ".join(str(option_value(ctx, name)) for name in names) + f" {extra}")

    @group.command("own")
    def own(ctx: typer.Context, where: Annotated[str, typer.Option("--where")] = "own-default") -> None:
        typer.echo(f"{where} {option_value(ctx.parent, 'where')}")  # type: ignore[arg-type]

    return root


def run(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(build(), list(args), env={"TEST_WHERE": None, **(env or {})})
    return result.exit_code, result.output.strip()


@pytest.mark.parametrize(
    "args",
    [
        ["--top", "T", "grp", "--where", "W", "-f", "show"],  # each where it is declared
        ["grp", "show", "--top", "T", "--where", "W", "--flag"],  # all after the subcommand
        ["grp", "--top", "T", "show", "-f", "--where", "W"],  # the root's option on the group
    ],
)
def test_group_options_are_accepted_on_the_group_and_after_its_commands(args: list[str]) -> None:
    assert run(*args) == (0, "T W True")


def test_defaults_and_the_later_of_two_values() -> None:
    assert run("grp", "show") == (0, "top-default where-default False")
    assert run("grp", "--where", "first", "show", "--where", "second") == (0, "top-default second False")


def test_an_environment_variable_does_not_override_the_command_line() -> None:
    env: dict[str, str | None] = {"TEST_WHERE": "from-env"}
    assert run("grp", "show", env=env) == (0, "top-default from-env False")
    assert run("grp", "--where", "typed", "show", env=env) == (0, "top-default typed False")
    assert run("grp", "show", "--where", "typed", env=env) == (0, "top-default typed False")


def test_a_command_keeps_its_own_option_of_the_same_name() -> None:
    assert run("grp", "own", "--where", "mine") == (0, "mine where-default")
    assert run("grp", "--where", "group", "own") == (0, "own-default group")


def test_eager_options_stay_where_they_are_declared() -> None:
    assert run("--version") == (0, "v1")
    code, output = run("grp", "show", "--version")
    assert code == 2
    assert "No such option" in output


def test_subcommand_help_lists_the_borrowed_options() -> None:
    code, output = run("grp", "show", "--help")
    assert code == 0
    assert "Global options" in output
    assert "--where" in output
    assert "--top" in output
