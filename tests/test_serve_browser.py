"""The playground at `/`, in a real headless Chromium: type a message, watch the answer stream with
every token coloured by its origin, and see the stats. The page must show exactly the answer the
API gives for the same conversation.

Needs /usr/bin/chromium (Debian package `chromium`; `.ci/run` installs it). Without it the test is
skipped, unless DFLASH2_REQUIRE_BROWSER=1 (CI), where that is a failure. DFLASH2_SCREENSHOT=PATH
also saves the screenshot there."""
from __future__ import annotations

import os
import shutil

import openai
import pytest

from dflash2.tools.browser import CHROMIUM, ask, chromium
from serve_util import API_KEY, LiveServer, tiny_serving_pipeline

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM) and not os.environ.get("DFLASH2_REQUIRE_BROWSER"),
                                reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")


def test_playground_streams_coloured_tokens(tmp_path):
    from playwright.sync_api import sync_playwright

    server = LiveServer(tiny_serving_pipeline(), api_key=API_KEY)
    try:
        api = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
        message = "hello there playground"
        want = api.chat.completions.create(model=server.model, messages=[{"role": "user", "content": message}],
                                           max_tokens=40, temperature=0, extra_body={"return_token_ids": True})
        with sync_playwright() as playwright:
            context = chromium(playwright)
            try:
                page = context.new_page()
                errors = []
                page.on("pageerror", lambda err: errors.append(str(err)))
                answer = ask(page, server.url + "/", message, api_key=API_KEY, max_tokens=40)
                page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)
                follow_up = ask_again(page, "and once more")
            finally:
                context.close()
        assert errors == [] and answer.status == "done"
        assert answer.text == want.choices[0].message.content
        assert answer.origins and set(answer.origins) <= {"draft", "target", "plain"}
        assert int(answer.stats["tokens"]) == 40
        assert int(answer.stats["draft"]) == want.choices[0].origins.count("draft")
        assert answer.stats["tps"] != "–" and answer.stats["ttft"].endswith("ms")
        assert follow_up == "done"                    # a second turn in the same conversation
        if os.environ.get("DFLASH2_SCREENSHOT"):
            shutil.copy(tmp_path / "playground.png", os.environ["DFLASH2_SCREENSHOT"])
    finally:
        server.close()
    assert server.scheduler.running == 0


def ask_again(page, message: str) -> str:
    page.fill("#message", message)
    page.press("#message", "Enter")
    page.wait_for_function("document.querySelectorAll('.assistant').length == 2 && "
                           "['done', 'error'].includes(document.body.dataset.status)", timeout=60_000)
    return page.inner_text("#status")
