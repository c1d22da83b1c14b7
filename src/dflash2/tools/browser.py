"""Headless Chromium driving the playground: used by the browser test and for the docs screenshot.

Contract:
- `chromium(playwright)` launches the system Chromium (`/usr/bin/chromium`, or
  `DFLASH2_CHROMIUM`; never a browser download) headless with a fresh user-data directory and no
  network side traffic; returns a persistent browser context (close it when done).
- `ask(page, url, message, ...)` opens the playground at `url`, sends `message` and waits until the
  answer is done; returns `PlaygroundAnswer` (the text shown, the origin class of every token span,
  and the figures in the stats bar).
- `python -m dflash2.tools.browser --url URL --message TEXT --out docs/serve-playground.png`
  takes the docs screenshot of a running server.
Needs the `playwright` Python package (the test extra) and a Chromium; imports it lazily.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass

CHROMIUM = os.environ.get("DFLASH2_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@dataclass
class PlaygroundAnswer:
    text: str
    origins: list[str]           # class of each token span: draft / target / plain
    stats: dict[str, str]        # stat id -> shown text
    status: str


def chromium(playwright, width: int = 1100, height: int = 760):
    profile = tempfile.mkdtemp(prefix="dflash2-chromium-")
    return playwright.chromium.launch_persistent_context(
        profile, executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS,
        viewport={"width": width, "height": height})


def ask(page, url: str, message: str, api_key: str | None = None, max_tokens: int = 64,
        temperature: float = 0.0, timeout_s: float = 60.0) -> PlaygroundAnswer:
    page.goto(url)
    if api_key:
        page.fill("#api-key", api_key)
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", str(temperature))
    page.fill("#message", message)
    page.click("#send")
    page.wait_for_function("['done', 'error'].includes(document.body.dataset.status)", timeout=timeout_s * 1000)
    spans = page.query_selector_all(".assistant .tok")
    origins = [next(c for c in span.get_attribute("class").split() if c != "tok") for span in spans]
    text = page.eval_on_selector_all(".assistant .text", "els => els.map(e => e.dataset.text || '').pop()")
    stats = {key: page.inner_text(f"#stat-{key}") for key in ("tokens", "tps", "al", "draft", "ttft")}
    return PlaygroundAnswer(text or "", origins, stats, page.inner_text("#status"))


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright   # an optional dependency (the `test` extra)

    p = argparse.ArgumentParser(prog="python -m dflash2.tools.browser", description="Screenshot the playground.")
    p.add_argument("--url", default="http://127.0.0.1:8000/")
    p.add_argument("--message", default="Write a haiku about rivers.")
    p.add_argument("--api-key")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out", default="docs/serve-playground.png")
    args = p.parse_args(argv)
    with sync_playwright() as playwright:
        context = chromium(playwright)
        try:
            page = context.new_page()
            answer = ask(page, args.url, args.message, args.api_key, args.max_tokens, timeout_s=300)
            page.screenshot(path=args.out, full_page=True)
        finally:
            context.close()
    print(f"{args.out}: {answer.status}, {len(answer.origins)} token spans, stats {answer.stats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
