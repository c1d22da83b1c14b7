"""Helpers shared by the serve tests: a live server on loopback (in a thread) or as a `dflash2 serve`
process, tiny pipelines with a fault you can trigger, and engine references."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from dflash2.decoding.loop.engine import GenerationConfig, SpeculativeDecoder
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.pipeline import Pipeline
from dflash2.serve.command import bind, make_server, url_of
from dflash2.serve.settings import ServeSettings
from dflash2.targets.tiny import TinyTokenizer, tiny_draft, tiny_target

API_KEY = "sk-test-dflash2"
POISON = 126   # a prompt holding this token id makes the target fail (TinyTokenizer never writes it
               # for the letters, digits and spaces the tests use)


POISON_TEXT = "\x07"   # a prompt holding this character makes the tokenizer fail


class PoisonTokenizer(TinyTokenizer):
    """The tiny tokenizer, but it fails on `POISON_TEXT` (a fault inside a request's encoding)."""

    def __call__(self, text: str, **bound) -> dict:
        if POISON_TEXT in text:
            raise RuntimeError("poisoned text")
        return super().__call__(text, **bound)


class PoisonTarget(TargetAdapter):
    """A real target adapter that fails when a new row's prompt holds `POISON`: a request that
    breaks the batch it joins, so the tests can check that it breaks nothing else."""

    def add_rows(self, prompts):
        if any(POISON in prompt for prompt in prompts):
            raise RuntimeError("poisoned prompt")
        return super().add_rows(prompts)


def tiny_serving_pipeline(speculate: str = "always", poison: bool = False) -> Pipeline:
    """The `--tiny` models (`pipeline.tiny_pipeline`, seed 0), optionally with `PoisonTarget` and
    `PoisonTokenizer`."""
    target = tiny_target("llama", seed=0)
    draft = tiny_draft(target, seed=0)
    adapter = (PoisonTarget if poison else TargetAdapter)(target, draft.config.target_layer_ids)
    decoder = SpeculativeDecoder(adapter, draft, speculate=speculate)
    tokenizer = (PoisonTokenizer if poison else TinyTokenizer)(target.config.vocab_size)
    return Pipeline(decoder, tokenizer, (), "tiny random DFlash2 draft [DFlash2]", False)


class LiveServer:
    """`dflash2 serve`'s own server object on a free loopback port, run in a thread."""

    def __init__(self, pipeline: Pipeline, **settings):
        self.settings = ServeSettings(tiny=True, port=0, **settings)
        self.settings.validate()
        self.pipeline = pipeline
        self.sock = bind("127.0.0.1", 0)
        self.url = url_of(self.sock)
        self.server = make_server(pipeline, self.settings)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.time() < deadline, "server did not start"
            time.sleep(0.02)
        self.scheduler = self.server.config.app.state.scheduler

    @property
    def model(self) -> str:
        return self.settings.served_model

    def health(self) -> dict:
        response = httpx.get(self.url + "/health", timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def wait_idle(self, timeout: float = 20.0) -> None:
        deadline = time.time() + timeout
        while self.scheduler.running or self.scheduler.queue_depth:
            assert time.time() < deadline, f"rows still running: {self.scheduler.running}"
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def reference(decoder, prompt_ids: list[int], max_tokens: int, stop_token_ids=()) -> list[int]:
    """What `dflash2 generate` gives for one prompt, greedy: the engine alone on that prompt."""
    config = GenerationConfig(max_new_tokens=max_tokens, temperature=0.0, stop_token_ids=tuple(stop_token_ids))
    [result] = decoder.generate([prompt_ids], config)
    return result.tokens


def start_server_process(tmp_path: Path, *options: str, api_key: str = "from-env",
                         tiny: bool = True) -> tuple[subprocess.Popen, str]:
    """A real `dflash2 serve` process (`--tiny` unless `tiny=False`: then `options` name the target)
    on a free port (log in tmp_path/serve.log), healthy."""
    log = open(tmp_path / "serve.log", "w+")
    env = dict(os.environ, HF_HUB_OFFLINE="1", DFLASH2_API_KEY=api_key)
    proc = subprocess.Popen([sys.executable, "-m", "dflash2.cli", "serve", *(["--tiny"] if tiny else []), "--port", "0",
                             *options], stderr=log, stdout=log, env=env)
    deadline = time.time() + 90
    url = None
    while url is None:
        assert proc.poll() is None and time.time() < deadline, (tmp_path / "serve.log").read_text()
        for line in (tmp_path / "serve.log").read_text().splitlines():
            if line.startswith("dflash2 serve: http://"):
                url = line.split()[2]
        time.sleep(0.1)
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert time.time() < deadline
        time.sleep(0.1)


def stream_tokens(api, model: str, prompt: str, max_tokens: int, barrier: threading.Barrier, after: int):
    """A streamed completion's token ids and final finish reason, waiting at `barrier` once `after`
    chunks have come (so several streams are known to be running at once)."""
    chunks = api.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
                                    extra_body={"return_token_ids": True})
    tokens, reasons = [], []
    for n, chunk in enumerate(chunks):
        tokens += chunk.choices[0].token_ids or []
        reasons.append(chunk.choices[0].finish_reason)
        if n == after:
            barrier.wait(timeout=60)
    return tokens, reasons[-1]
