"""The llm agent's reasoning on the match page, in a real browser (Debian's chromium via
Playwright): a finished match with a thinking model, served by `opsarena serve`."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

from opsarena.agents.competitors import competitor_from_cli
from opsarena.challenges.catalog import find_challenge
from opsarena.match.controller import Controller, MatchPlan
from opsarena.store import SqliteEventStore
from tests.agents.openai_double import API_KEY, Model, OpenAIDouble, completion
from tests.browser import chromium
from tests.conftest import new_match_id

pytestmark = pytest.mark.hosts

THOUGHT = "The unit file comes first.\nThen enable it, then start it, in that order."


async def test_reasoning_shows_collapsed_with_the_serving_provider(
    openai_double: OpenAIDouble, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.async_api import async_playwright, expect

    executable = chromium()
    monkeypatch.setenv("OPSARENA_LLM_BASE_URL", openai_double.base_url)
    monkeypatch.setenv("OPSARENA_LLM_API_KEY", API_KEY)
    openai_double.models["lab/thinker"] = Model(reasoning_model="deepseek")
    openai_double.script = [
        completion(calls=[("bash", {"command": "true"})], reasoning_content=THOUGHT,
                   model="lab/thinker", provider="DeepInfra"),
        completion(calls=[("done", {"summary": "gave up"})], model="lab/thinker"),
    ]  # fmt: skip
    db = tmp_path / "log.db"
    plan = MatchPlan(
        challenge=find_challenge("durable-records"),
        competitors=[competitor_from_cli("builder-one", "llm:lab/thinker")],
        time_limit_s=60,
        match_id=new_match_id("m"),
    )
    with SqliteEventStore(db) as store:
        await Controller(plan, store).run()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "opsarena.cli.main", "serve", "--port", "0", "--db", str(db),
            stdout=out, stderr=out,
        )  # fmt: skip
    try:
        found: list[str] = []
        for _ in range(300):
            found = re.findall(r"http://127\.0\.0\.1:\d+", log.read_text())
            if found or server.returncode is not None:
                break
            await asyncio.sleep(0.1)
        assert found, log.read_text()
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=str(executable))
            page = await browser.new_page()
            await page.goto(f"{found[0]}/matches/{plan.match_id}")
            thought = page.locator('[data-agent="builder-one"] details.reasoning')
            await expect(thought).to_have_count(1, timeout=60_000)
            await expect(thought.locator("summary")).to_contain_text(
                "reasoning: The unit file comes first."
            )
            assert await thought.get_attribute("open") is None  # collapsed
            await expect(thought.locator("pre")).not_to_be_visible()
            await thought.locator("summary").click()
            await expect(thought.locator("pre")).to_have_text(THOUGHT)
            served = page.locator('[data-agent="builder-one"] .entry[data-kind="assistant"] code')
            await expect(served.first).to_contain_text("DeepInfra")
            await browser.close()
    finally:
        if server.returncode is None:
            server.terminate()
            await server.wait()
