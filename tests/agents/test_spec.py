"""Agent specs, building agents by kind, and the competitors file (no hosts needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import opsarena.agents.spec
from opsarena.agents.command import CommandAgent
from opsarena.agents.competitors import competitor_from_cli, load_competitors, parse_competitors
from opsarena.agents.human import HumanAgent
from opsarena.agents.llm import LlmAgent
from opsarena.agents.registry import agent_kinds, build_agent, parse_agent_spec
from opsarena.agents.scripted import ScriptedAgent
from opsarena.agents.spec import AgentSettings, AgentSpec, Limits, Price
from opsarena.challenges.catalog import builtin_root
from opsarena.errors import AgentConfigError, AgentSpecError, CompetitorsFileError, OpsArenaError

EXAMPLE = Path(__file__).parents[2] / "examples" / "seed-match.toml"
ENV = {"OPSARENA_LLM_BASE_URL": "http://127.0.0.1:9/v1", "OPSARENA_LLM_API_KEY": "k"}


def test_specs_parse_by_kind() -> None:
    assert parse_agent_spec("llm:z-ai/glm-5.2") == AgentSpec(
        "llm", "z-ai/glm-5.2", "llm:z-ai/glm-5.2"
    )
    assert parse_agent_spec("human") == AgentSpec("human", "", "human")
    command = parse_agent_spec("command:./my-agent.sh --fast 'two words'")
    assert command.argv == ["./my-agent.sh", "--fast", "two words"]
    assert parse_agent_spec("scripted:reference").arg == "reference"
    # Tests may register kinds of their own; the four built-in ones are always there.
    assert {"command", "human", "llm", "scripted"} <= set(agent_kinds())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "robot:r2",
            "unknown agent kind 'robot' in 'robot:r2': use one of command:PROGRAM, human, "
            "llm:MODEL, scripted:NAME",
        ),
        ("llm", "agent 'llm' needs MODEL: write llm:MODEL"),
        ("llm:  ", "agent 'llm:' needs MODEL: write llm:MODEL"),
        ("human:bob", "agent kind 'human' takes no argument: write just human"),
        ("command:./x 'unclosed", "cannot split command"),
    ],
)
def test_bad_specs_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(AgentSpecError) as exc:
        parse_agent_spec(text)
    assert str(exc.value).startswith(message)
    assert "\n" not in str(exc.value)


def test_agents_are_built_by_kind() -> None:
    llm = build_agent(
        parse_agent_spec("llm:openai/gpt-4o-mini"),
        AgentSettings(limits=Limits(turns=5)),
        ENV,
    )
    assert isinstance(llm, LlmAgent)
    assert (llm.model, llm.limits.turns, llm.endpoint.base_url) == (
        "openai/gpt-4o-mini",
        5,
        "http://127.0.0.1:9/v1",
    )
    assert llm.price is not None and llm.price.input_usd_per_mtok == 0.15  # built-in table
    command = build_agent(parse_agent_spec("command:./a.sh x"), AgentSettings(model="claude-x"))
    assert isinstance(command, CommandAgent)
    assert (command.argv, command.model) == (["./a.sh", "x"], "claude-x")
    assert isinstance(build_agent(parse_agent_spec("human")), HumanAgent)
    scripted = build_agent(parse_agent_spec("scripted:reference"))
    assert scripted.model


def test_building_says_what_cannot_work() -> None:
    with pytest.raises(AgentConfigError, match="no LLM endpoint configured"):
        build_agent(parse_agent_spec("llm:m"), AgentSettings(), {})
    with pytest.raises(AgentSpecError, match="setting base_url does not apply to command agents"):
        build_agent(parse_agent_spec("command:./a.sh"), AgentSettings(base_url="http://x/v1"))
    with pytest.raises(AgentSpecError, match="contradicts"):
        build_agent(parse_agent_spec("llm:a"), AgentSettings(model="b"), ENV)
    # A limit the agent cannot count is refused, never silently ignored.
    tokens = AgentSettings(limits=Limits(output_tokens=9, wall_s=60))
    with pytest.raises(AgentSpecError, match=r"limits.output_tokens does not apply to command"):
        build_agent(parse_agent_spec("command:./a.sh"), tokens)
    wall = AgentSettings(limits=Limits(wall_s=60))
    assert build_agent(parse_agent_spec("command:./a.sh"), wall).wall_s == 60  # type: ignore[attr-defined]
    for kind in ("scripted:reference", "human"):
        with pytest.raises(AgentSpecError, match=r"limits.wall_s does not apply"):
            build_agent(parse_agent_spec(kind), wall)
    with pytest.raises(OpsArenaError, match="unknown scripted builder 'nobody'"):
        ScriptedAgent("nobody", builtin_root() / "durable-records")
    with pytest.raises(OpsArenaError, match="unknown scripted builder 'no/body'"):
        build_agent(parse_agent_spec("scripted:no/body"))


def test_the_seed_example_loads() -> None:
    loaded = load_competitors(EXAMPLE)
    assert loaded.challenge == "durable-records"
    assert [(c.territory, c.name, c.spec.text) for c in loaded.competitors] == [
        ("builder-one", "deepseek-builder", "llm:deepseek/deepseek-v4-flash-0731"),
        ("builder-two", "luna-builder", "llm:openai/gpt-5.6-luna"),
        ("builder-three", "glm-builder", "llm:z-ai/glm-5.2"),
    ]
    agents = [c.build(ENV) for c in loaded.competitors]
    assert all(isinstance(a, LlmAgent) and a.limits.cost_microusd == 2_000_000 for a in agents)
    with pytest.raises(AgentConfigError, match="no LLM endpoint configured"):
        loaded.competitors[0].build({})


def test_llm_defaults_and_prices_merge_under_each_territory() -> None:
    loaded = parse_competitors(
        """
        [llm]
        base_url = "http://127.0.0.1:9/v1"
        limits = { turns = 50, wall_s = 600 }

        [prices."lab/model-a"]
        input_usd_per_mtok = 1.0
        output_usd_per_mtok = 3.0

        [territories.a]
        agent = "llm:lab/model-a"
        limits = { turns = 10 }

        [territories.b]
        agent = "llm:lab/model-b"
        price = { input_usd_per_mtok = 0.1, output_usd_per_mtok = 0.2 }

        [territories.c]
        agent = "command:./c.sh"
        env = { FAST = "1" }
        """,
        "t.toml",
    )
    a, b, c = loaded.competitors
    assert a.settings.limits == Limits(turns=10, wall_s=600)
    assert a.settings.base_url == "http://127.0.0.1:9/v1"
    assert a.settings.price == Price(input_usd_per_mtok=1.0, output_usd_per_mtok=3.0)
    assert b.settings.price == Price(input_usd_per_mtok=0.1, output_usd_per_mtok=0.2)
    assert b.settings.limits.turns == 50
    assert (c.kind, c.settings.base_url, c.settings.env) == ("command", None, {"FAST": "1"})


def test_every_problem_in_a_competitors_file_is_one_line_naming_file_and_field() -> None:
    with pytest.raises(CompetitorsFileError) as exc:
        parse_competitors(
            """
            [territories.a]
            agent = "llm:m"
            limits = { turns = 0 }
            colour = "red"

            [territories.b]
            """,
            "bad.toml",
        )
    assert str(exc.value).splitlines() == [
        "bad.toml: territories.a.limits.turns: Input should be greater than 0 (got 0)",
        "bad.toml: territories.a.colour: Extra inputs are not permitted",
        "bad.toml: territories.b.agent: Field required",
    ]
    with pytest.raises(CompetitorsFileError) as exc:
        parse_competitors(
            """
            [territories.Bad_Name]
            agent = "robot:x"
            [territories.two]
            agent = "command:./x"
            name = "dup"
            base_url = "http://x/v1"
            [territories.three]
            agent = "human"
            name = "dup"
            """,
            "bad.toml",
        )
    lines = str(exc.value).splitlines()
    assert lines[0] == (
        "bad.toml: territories.Bad_Name: not a valid territory name (1-40 of a-z, 0-9, '-')"
    )
    assert lines[1].startswith("bad.toml: territories.Bad_Name.agent: unknown agent kind 'robot'")
    assert lines[2].startswith("bad.toml: territories.two: setting base_url does not apply")
    assert lines[3] == "bad.toml: territories.three.name: 'dup' is also the agent of two"
    assert len(lines) == 4


def test_unreadable_competitors_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(CompetitorsFileError, match="does not exist"):
        load_competitors(tmp_path / "none.toml")
    (tmp_path / "broken.toml").write_text("territories = [")
    with pytest.raises(CompetitorsFileError, match=r"broken\.toml: not valid TOML"):
        load_competitors(tmp_path / "broken.toml")
    with pytest.raises(CompetitorsFileError, match="territories: Field required"):
        parse_competitors("", "empty.toml")


def test_a_builder_from_the_command_line() -> None:
    competitor = competitor_from_cli("a", "command:./my-agent.sh")
    assert (competitor.territory, competitor.name, competitor.kind) == ("a", "a", "command")
    with pytest.raises(AgentSpecError, match="territory 'A!' is not valid"):
        competitor_from_cli("A!", "human")


def test_the_seed_example_sets_routing_and_reasoning_per_model() -> None:
    loaded = load_competitors(EXAMPLE)
    deepseek, luna, glm = (c.build(ENV) for c in loaded.competitors)
    assert isinstance(deepseek, LlmAgent) and isinstance(luna, LlmAgent)
    assert isinstance(glm, LlmAgent)
    assert deepseek.provider is not None and deepseek.provider.order == ["deepseek"]
    assert luna.provider is not None and luna.provider.allow_fallbacks is False
    assert deepseek.reasoning is not None and deepseek.reasoning.effort == "high"
    assert (glm.temperature, glm.max_output_tokens) == (0.6, 16_000)


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ("bash_timeout_s = -5", "bash_timeout_s: Value error, must be a finite number above 0"),
        ("request_timeout_s = 0", "request_timeout_s: Value error, must be a finite number"),
        ("bash_timeout_s = nan", "bash_timeout_s: Value error, must be a finite number"),
        ("limits = { wall_s = inf }", "limits.wall_s: Value error, must be a finite number"),
        ("extra_body = { messages = [] }", "extra_body: Value error, may not set messages"),
        ('reasoning = { effort = "high", max_tokens = 100 }', "give effort or max_tokens"),
        ('reasoning = { effort = "huge" }', "reasoning.effort: Input should be"),
        ('provider = { order = ["a"], prefer = "b" }', "provider.prefer: Extra inputs"),
        ('provider = { data_collection = "maybe" }', "provider.data_collection: Input should"),
        ("temperature = 3", "temperature: Input should be less than or equal to 2"),
    ],
)
def test_llm_settings_are_checked_one_line_each(table: str, words: str) -> None:
    text = f'[territories.a]\nagent = "llm:m"\n{table}\n'
    with pytest.raises(CompetitorsFileError) as exc:
        parse_competitors(text, "c.toml")
    assert str(exc.value).startswith("c.toml: territories.a.")
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_llm_settings_do_not_apply_to_other_kinds() -> None:
    with pytest.raises(CompetitorsFileError, match="setting reasoning does not apply to command"):
        parse_competitors(
            '[territories.a]\nagent = "command:./x"\nreasoning = { effort = "low" }\n', "c.toml"
        )


def test_specs_describe_and_only_the_registry_imports_the_agents() -> None:
    """Item 8 of issue 15: no import circle between spec and the agent modules."""
    code = (
        "import sys; import opsarena.agents.spec, opsarena.agents.llm, opsarena.agents.command; "
        "print(sorted(m for m in sys.modules if m == 'opsarena.agents.registry'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    source = Path(opsarena.agents.spec.__file__).read_text()
    assert "opsarena.agents.llm" not in source and "opsarena.agents.command" not in source
