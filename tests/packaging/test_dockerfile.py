"""The Dockerfile's shape, read without Docker: stages, user, entry points, ports, build context.

No Docker engine runs on the development and CI machines, so the image is never built here;
``test_wheel.py`` does what the image's build does (wheel, clean venv, entry points, migrations).
"""

from __future__ import annotations

import re
import tomllib

import pyjson5
import yaml
from image_spec import REPO, builder_sources, dockerignore_patterns, exec_form, load, parse

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
SCRIPTS = set(PYPROJECT["project"]["scripts"])
CHART_VALUES = REPO / "deploy" / "helm" / "nstance-operator" / "values.yaml"


def requirement_name(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def test_the_four_programs_are_the_packages_console_scripts() -> None:
    assert {"nstance-server", "nstance-agent", "nstance-operator", "nstance-admin"} == SCRIPTS


def test_multi_stage_with_a_wheel_builder_and_a_slim_python_311_runtime() -> None:
    dockerfile = load()
    assert len(dockerfile.stages) >= 2
    builder, final = dockerfile.stages[0], dockerfile.final
    assert any("pip wheel" in run and "--no-deps" in run for run in builder.runs())
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", dockerfile.resolve(final.base))
    assert dockerfile.resolve(builder.base) == dockerfile.resolve(final.base)
    assert final.context_copies() == [], "the runtime stage takes only the wheel from the builder"


def test_final_stage_runs_as_a_fixed_non_root_uid_matching_the_chart() -> None:
    final = load().final
    users = final.all("USER")
    assert users, "the final stage sets no USER"
    # Numeric, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
    uid, _, gid = users[-1].args.partition(":")
    assert uid.isdigit(), users[-1]
    assert int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)
    last_user_at = final.instructions.index(users[-1])
    assert all(i.keyword != "USER" for i in final.instructions[last_user_at + 1 :])
    created = [run for run in final.runs() if "useradd" in run]
    assert created
    assert f"--uid {uid}" in created[0]
    pod = yaml.safe_load(CHART_VALUES.read_text(encoding="utf-8"))["podSecurityContext"]
    assert int(uid) == pod["runAsUser"]
    assert not gid or int(gid) == pod["runAsGroup"]


def test_workdir_and_data_directories_belong_to_the_user() -> None:
    final = load().final
    workdirs = final.all("WORKDIR")
    assert workdirs
    workdir = workdirs[-1].args
    env = " ".join(i.args for i in final.all("ENV"))
    cache = re.search(r"NSTANCE_CACHEDIR=(\S+)", env)
    assert cache is not None, "NSTANCE_CACHEDIR is not set"
    owned = [run for run in final.runs() if re.search(r"install -d -o \S+ -g \S+|chown", run)]
    assert owned, "no RUN creates directories owned by the runtime user"
    for directory in (workdir, cache.group(1)):
        assert any(directory in run for run in owned), f"{directory} is not created for the user"


def test_entry_points_server_by_default_and_the_others_documented() -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    final = load().final
    entrypoints = final.all("ENTRYPOINT")
    assert [exec_form(e.args) for e in entrypoints][-1:] == [["nstance-server"]]
    for script in SCRIPTS - {"nstance-server"}:
        assert f"--entrypoint {script}" in text, f"how to run {script} is not documented"
    # The build runs every program once, so an image with a broken entry point is not built.
    smoke = [run for run in final.runs() if "--help" in run]
    assert smoke
    for script in SCRIPTS:
        assert script in smoke[0]


def test_every_program_is_also_at_the_root_where_upstreams_chart_runs_it() -> None:
    # upstream's Helm chart runs `command: /nstance-operator`; its images keep each program at /.
    links = [run for run in load().final.runs() if "ln -s" in run]
    assert links, "no program is linked at the root of the image"
    for script in SCRIPTS:
        assert script in links[0]
    assert '"/opt/nstance/bin/$program" "/$program"' in links[0]


def test_runtime_stage_installs_the_wheel_and_no_dev_dependencies() -> None:
    dockerfile = load()
    dev = {requirement_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    assert "pytest" in dev
    for stage in dockerfile.stages:
        assert "[dev]" not in stage.text()
    runtime = dockerfile.final.text().lower()
    words = set(re.findall(r"[a-z0-9][a-z0-9._-]*", runtime))
    assert not (dev & {re.sub(r"[-_.]+", "-", w) for w in words}), "a dev dependency in the runtime stage"
    installs = [run for run in dockerfile.final.runs() if re.search(r"pip .*install", run)]
    assert len(installs) == 1
    assert re.search(r"nstance-\*\.whl", installs[0])
    assert " -e " not in installs[0]
    assert "-r " not in installs[0]


def test_exposes_the_servers_default_ports() -> None:
    exposed = {int(p.split("/")[0]) for e in load().final.all("EXPOSE") for p in e.args.split()}
    assert exposed == {8990, 8991, 8992, 8993, 8994}
    config = pyjson5.loads((REPO / "examples" / "local" / "config.jsonc").read_text(encoding="utf-8"))
    bind = config["shard"]["bind"]
    assert {int(addr.rsplit(":", 1)[1]) for addr in bind.values()} == exposed


def test_build_context_is_an_allow_list_of_what_the_builder_copies() -> None:
    patterns = dockerignore_patterns()
    assert patterns[0] == "*", "the .dockerignore should exclude everything first"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    sources = {s.rstrip("/") for s in builder_sources()}
    assert sources == allowed
    for secret_dir in (".local", "temp", ".venv", ".git", "tests"):
        assert secret_dir not in allowed


def test_builder_copies_the_migrations_the_package_links_to() -> None:
    link = REPO / "nstance" / "_migrations"
    assert link.is_symlink()
    target = (link.parent / link.readlink()).resolve()
    assert target == (REPO / "migrations").resolve()
    sources = {s.rstrip("/") for s in builder_sources()}
    assert {"nstance", "migrations", "pyproject.toml", "README.md"} <= sources


def test_parser_joins_continuations_and_skips_comments() -> None:
    parsed = parse(
        "ARG BASE=python:3.11-slim\n"
        "FROM ${BASE} AS one\n"
        "# a comment\n"
        "RUN a \\\n"
        "    # inside\n"
        "    && b\n"
        "FROM $BASE\n"
        'ENTRYPOINT ["x"]\n'
    )
    assert [s.name for s in parsed.stages] == ["one", None]
    assert parsed.resolve(parsed.stages[1].base) == "python:3.11-slim"
    assert parsed.stages[0].runs() == ["a && b"]
    assert exec_form(parsed.final.all("ENTRYPOINT")[0].args) == ["x"]
