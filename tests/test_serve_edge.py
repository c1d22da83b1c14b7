"""`dflash2 serve` at its edge, against a live server on loopback (tiny random models): engine errors
mapped by type, a 400 for every malformed body and a 500 for a fault, each on a keep-alive connection
that the next request reuses, the body-size limit (413), every status counted in /metrics, a 20 MB
body while 16 streams run (/health keeps answering, every stream equals the engine), and the drain
cut on SIGTERM (an `error` event in the stream, no traceback in the log)."""
from __future__ import annotations

import dataclasses
import json
import logging
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from dflash2.decoding.loop.engine import GenerationConfig
from dflash2.errors import ContextLimitError
from dflash2.targets.tiny import TinyTokenizer
from serve_util import (API_KEY, POISON_TEXT, LiveServer, reference, start_server_process, stream_tokens,
                        tiny_serving_pipeline)

STREAM_TOKENS = 150
AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}


class Records(logging.Handler):
    """Every log record of the server's loggers (uvicorn's do not reach pytest's root handler)."""

    NAMES = ("dflash2.serve", "uvicorn.error")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def __enter__(self):
        for name in self.NAMES:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc):
        for name in self.NAMES:
            logging.getLogger(name).removeHandler(self)

    @property
    def tracebacks(self) -> list[logging.LogRecord]:
        return [r for r in self.records if r.exc_info]


class TimedTokenizer(TinyTokenizer):
    """The tiny tokenizer encoding every character of a text (no cut), recording when it encoded
    each long one (in `spans`, shared by the server's copies of it)."""

    spans: list[tuple[float, float]] = []

    def __init__(self, vocab_size: int):
        super().__init__(vocab_size, max_chars=10**9)

    def __call__(self, text: str, **bound) -> dict:
        started = time.perf_counter()
        try:
            return super().__call__(text, **bound)
        finally:
            if len(text) > 1_000_000:
                TimedTokenizer.spans.append((started, time.perf_counter()))


@pytest.fixture(scope="module")
def live():
    server = LiveServer(tiny_serving_pipeline(poison=True), api_key=API_KEY, max_request_bytes=64 * 1024)
    yield server
    server.close()


def local_address(response: httpx.Response) -> tuple:
    """The client end of the connection a response came on (the same one: a kept-alive connection)."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


def count(metrics: str, endpoint: str, status: int) -> float:
    line = f'dflash2_requests_total{{endpoint="{endpoint}",status="{status}"}} '
    return sum(float(row[len(line):]) for row in metrics.splitlines() if row.startswith(line))


def test_the_context_rule_raises_its_own_type():
    decoder = tiny_serving_pipeline(speculate="always").decoder     # the draft's block of 8 is reserved
    with pytest.raises(ContextLimitError) as info:
        decoder.check([[1] * 500], GenerationConfig(max_new_tokens=20))
    err = info.value
    assert (err.prompt_tokens, err.max_new_tokens, err.block, err.limit) == (500, 20, 8, 512)
    assert err.total == 528 and "context limit of 512" in str(err)


def _body(**fields) -> bytes:
    return json.dumps({"model": "tiny-random-llama", "max_tokens": 4, **fields}).encode()


MALFORMED = {
    "deep array": (b'{"model": "x", "prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", None, "nested too deeply"),
    "deep object": (b"{\"a\":" * 6_000 + b"1" + b"}" * 6_000, None, "nested too deeply"),
    "lone surrogate in a prompt": (b'{"model": "tiny-random-llama", "prompt": "hi \\ud800"}', None, "lone surrogate"),
    "lone surrogate in a stop": (b'{"model": "tiny-random-llama", "prompt": "hi", "stop": "\\udc00"}', None,
                                 "lone surrogate"),
    "lone surrogate in a key": (b'{"model": "tiny-random-llama", "prompt": "hi", "\\ud800": 1}', None,
                                "lone surrogate"),
    "integer of 5000 digits": (b'{"model": "tiny-random-llama", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",
                               None, "JSON"),
    "integer over 64 bits": (_body(prompt="hi", top_k=2**64, temperature=1.0), "top_k", "64-bit"),
    "a list as a role": (_body(messages=[{"role": ["user"], "content": "x"}]), "messages", "role"),
    "a number as content": (_body(messages=[{"role": "user", "content": 5}]), "messages", "content"),
    "a string as max_tokens": (_body(prompt="hi", max_tokens="8"), "max_tokens", "integer"),
    "a dict as stop": (_body(prompt="hi", stop={"a": 1}), "stop", "stop"),
    # a value that compares equal to the harmless one in Python, but is another JSON value
    "logprobs 0 (a request for log probabilities)": (_body(prompt="hi", logprobs=0), "logprobs", "not supported"),
    "n true": (_body(prompt="hi", n=True), "n", "not supported"),
    "n 1.0": (_body(prompt="hi", n=1.0), "n", "not supported"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_bodies_get_400_on_a_connection_that_survives(live, name):
    raw, param, words = MALFORMED[name]
    path = "/v1/chat/completions" if b'"messages"' in raw else "/v1/completions"
    with Records() as log, httpx.Client(base_url=live.url, headers=AUTH, timeout=30) as http:
        bad = http.post(path, content=raw)
        assert bad.status_code == 400, bad.text
        error = bad.json()["error"]
        assert error["type"] == "invalid_request_error" and words in error["message"] and "\n" not in error["message"]
        assert error["param"] == param and (param is not None or error["code"] == "invalid_json")
        good = http.post("/v1/completions", content=_body(prompt="hi"))
        assert good.status_code == 200 and local_address(good) == local_address(bad)
    assert log.tracebacks == []


def test_a_fault_is_a_500_on_a_connection_that_survives_and_every_status_is_counted(live):
    before = live.metrics()
    with Records() as log, httpx.Client(base_url=live.url, headers=AUTH, timeout=30) as http:
        fault = http.post("/v1/completions", content=_body(prompt="hi " + POISON_TEXT))
        assert fault.status_code == 500
        assert fault.json()["error"]["type"] == "server_error" and "poisoned text" in fault.json()["error"]["message"]
        after = http.post("/v1/completions", content=_body(prompt="hi"))   # the same connection, not reset
        assert after.status_code == 200 and local_address(after) == local_address(fault)
        statuses = [http.post("/v1/completions", content=b"{").status_code,
                    http.post("/v1/completions", content=b"{}", headers={"Authorization": "Bearer wrong"}).status_code,
                    http.get("/v2/nothing").status_code, http.get("/v1/completions").status_code,
                    http.post("/v1/completions", content=b" " * 70_000).status_code,
                    http.get("/health").status_code]
        assert statuses == [400, 401, 404, 405, 413, 200]
    assert [r.getMessage() for r in log.tracebacks] == ["unexpected error in POST /v1/completions"]  # logged once
    metrics = live.metrics()
    for endpoint, status in [("/v1/completions", 500), ("/v1/completions", 200), ("/v1/completions", 400),
                             ("/v1/completions", 401), ("other", 404), ("/v1/completions", 405),
                             ("/v1/completions", 413)]:
        assert count(metrics, endpoint, status) >= count(before, endpoint, status) + 1, (endpoint, status)
    assert count(metrics, "/health", 200) >= count(before, "/health", 200) + 1
    assert count(metrics, "/metrics", 200) >= 1


def test_request_size_limit_is_413_with_an_openai_error(live):
    api = openai.OpenAI(base_url=live.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as info:
        api.completions.create(model=live.model, prompt="x" * 70_000, max_tokens=4)
    assert info.value.status_code == 413
    assert info.value.body["type"] == "invalid_request_error" and info.value.body["code"] == "request_too_large"
    assert "65536 bytes" in info.value.body["message"] and "--max-request-mb" in info.value.body["message"]
    # by Content-Length (refused before it is read) or, without one (chunked), counted as it
    # arrives; the connection survives either way
    with httpx.Client(base_url=live.url, headers=AUTH, timeout=30) as http:
        declared = http.post("/v1/completions", content=_body(prompt="x" * 70_000))
        assert declared.status_code == 413 and declared.json()["error"]["code"] == "request_too_large"
        chunked = http.post("/v1/completions", content=iter([b'{"prompt": "', b"x" * 40_000, b"x" * 40_000, b'"}']))
        assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
        assert "content-length" not in chunked.request.headers
        again = http.post("/v1/completions", content=_body(prompt="y" * 60_000))   # just under the limit
        assert again.status_code == 200 and local_address(again) == local_address(chunked) == local_address(declared)
    # a body declared far too large is refused before any of it is sent
    with socket.create_connection(live.sock.getsockname()[:2], timeout=10) as raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 10000000000\r\n\r\n")
        head = raw.recv(4096)
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "0.0001"])
def test_a_bad_limit_fails_in_one_line(value, capsys):
    from dflash2.cli import main

    assert main(["serve", "--tiny", "--max-request-mb", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --max-request-mb") and err.count("\n") == 1


def test_a_20_mb_body_while_16_streams_run():
    """The big body is parsed and tokenised in full (a limit of 32 MiB, a tokenizer that keeps every
    character): /health keeps answering while it is, and the 16 streams all finish, equal to the engine."""
    pipeline = tiny_serving_pipeline(speculate="never")
    pipeline = dataclasses.replace(pipeline, tokenizer=TimedTokenizer(pipeline.tokenizer.span + 4))
    server = LiveServer(pipeline, max_batch=16, max_request_bytes=32 * 2**20)
    engine = tiny_serving_pipeline(speculate="never")
    try:
        api = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        prompts = [f"stream {i} keeps going" for i in range(16)]
        want = [reference(engine.decoder, engine.tokenizer(p)["input_ids"], STREAM_TOKENS) for p in prompts]
        streaming = threading.Barrier(17)

        def stream(i):
            return stream_tokens(api, server.model, prompts[i], STREAM_TOKENS, streaming, after=0)

        big = {"model": server.model, "prompt": "z" * 20_000_000, "max_tokens": 4}
        answers: list[tuple[float, float, int]] = []     # (sent, answered, status) per /health request
        done = threading.Event()

        def poll_health():
            with httpx.Client(base_url=server.url, timeout=30) as http:
                while not done.is_set():
                    sent = time.perf_counter()
                    status = http.get("/health").status_code
                    answers.append((sent, time.perf_counter(), status))
                    time.sleep(0.01)

        with ThreadPoolExecutor(18) as pool:
            streams = [pool.submit(stream, i) for i in range(16)]
            streaming.wait(timeout=60)                                     # all 16 are streaming
            poller = pool.submit(poll_health)
            started = time.perf_counter()
            reply = httpx.post(server.url + "/v1/completions", json=big, timeout=120)
            finished = time.perf_counter()
            done.set()
            poller.result()
            results = [job.result(timeout=120) for job in streams]
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"
        assert "the prompt alone is more than the context limit of 512" in reply.json()["error"]["message"]
        assert results == [(w, "length") for w in want]                          # every stream, token for token
        # /health kept answering while the big prompt was being tokenised: round trips that began
        # and ended inside it (a body tokenised on the event loop leaves none)
        [(encode_start, encode_end)] = TimedTokenizer.spans
        inside = [answered - sent for sent, answered, _ in answers if encode_start <= sent and answered <= encode_end]
        assert len(inside) >= 3 and all(status == 200 for _, _, status in answers)
        during = sorted(answered - sent for sent, answered, _ in answers if started <= sent and answered <= finished)
        print(f"20 MB body: {finished - started:.2f} s, tokenised in {encode_end - encode_start:.2f} s; /health: "
              f"{len(inside)} answers while tokenising, median {sorted(inside)[len(inside) // 2] * 1000:.1f} ms; "
              f"{len(during)} during the request, max {during[-1] * 1000:.1f} ms")
        server.wait_idle()
        assert server.health()["status"] == "ok"
    finally:
        server.close()


def test_drain_cut_ends_streams_with_an_error_event(tmp_path):
    proc, url = start_server_process(tmp_path, "--speculate", "always", "--threads", "1", "--drain-timeout", "1")
    try:
        api = openai.OpenAI(base_url=url + "/v1", api_key="from-env", max_retries=0, timeout=60)
        going = threading.Barrier(2)

        def streamed():
            chunks = api.completions.create(model="tiny-random-llama", prompt="a long answer", max_tokens=400,
                                            stream=True)
            got = 0
            with pytest.raises(openai.APIError) as info:
                for n, chunk in enumerate(chunks):
                    got += 1
                    if n == 1:
                        going.wait(timeout=60)
            return got, info.value

        def waiting():
            with pytest.raises(openai.InternalServerError) as info:
                api.completions.create(model="tiny-random-llama", prompt="a long answer too", max_tokens=400)
            return info.value

        with ThreadPoolExecutor(2) as pool:
            stream_job, wait_job = pool.submit(streamed), pool.submit(waiting)
            going.wait(timeout=60)
            deadline = time.time() + 60
            while httpx.get(url + "/health", timeout=10).json()["running"] < 2:   # both are decoding
                assert time.time() < deadline
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            got, cut = stream_job.result(timeout=60)
            refused = wait_job.result(timeout=60)
        assert got < 400 and "drain timeout" in cut.message and cut.body["code"] == "shutting_down"
        assert refused.status_code == 503 and refused.body["code"] == "shutting_down"
        assert proc.wait(timeout=60) == 0
        log = (tmp_path / "serve.log").read_text()
        assert "dflash2 serve: stopped" in log
        assert "Traceback" not in log and "CancelledError" not in log and "Exception in ASGI" not in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("mib, status", [(0.1, 413), (0.05, 200)])
def test_loadtest_sends_one_big_body_mid_run_and_polls_health(live, tmp_path, capsys, mib, status):
    """`dflash2 loadtest --big-body-mb`: the big body reaches the server while the streams run (over
    the 64 KiB limit: 413; under it: answered), /health is polled through the level, and every
    stream's completion is reported."""
    from dflash2.cli import main

    out = tmp_path / "load.json"
    code = main(["loadtest", "--tiny", "--url", live.url, "--api-key", API_KEY, "--concurrency", "4", "--requests", "4",
                 "--max-tokens", "24", "--big-body-mb", str(mib), "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    [row] = json.loads(out.read_text())["rows"]
    probe = row["probe"]
    assert row["completed"] == [True] * 4 and row["errors"] == 0 and row["mismatches"] == 0
    assert probe["big_body"]["bytes"] == int(mib * 2**20) and probe["big_body"]["status"] == status
    assert probe["big_body"]["code"] == ("request_too_large" if status == 413 else None)
    assert probe["health"]["polls"] >= 1 and probe["health"]["failures"] == 0
    assert probe["health"]["max_ms"] >= probe["health"]["median_ms"] > 0
    assert 0 <= probe["health"]["max_ms_less_poller_wait"] <= probe["health"]["max_ms"]
    assert "| speculative | 4 | 4 / 4 | " + str(status) in printed


def test_the_big_body_is_valid_json_of_the_size_asked():
    from dflash2.tools.loadprobe import big_body

    for size in (1000, 123_457):
        body = big_body("m", size)
        parsed = json.loads(body)
        assert len(body) == size and parsed["model"] == "m" and parsed["max_tokens"] == 1
        assert parsed["prompt"].startswith("hello world hello")
    assert json.loads(big_body("m", 10))["prompt"] == ""   # smaller than the fields: the fields alone


class CopyRecordingTokenizer(TinyTokenizer):
    """Records the thread that copies it (copying a real Rust tokenizer holds the GIL ~0.3 s)."""

    copied_in: list[str] = []

    def __deepcopy__(self, memo):
        CopyRecordingTokenizer.copied_in.append(threading.current_thread().name)
        return CopyRecordingTokenizer(self.span + 4)


def test_encoder_threads_get_tokenizer_copies_made_at_start_up_not_in_a_request():
    import asyncio

    from dflash2.serve.generation import Encoders

    CopyRecordingTokenizer.copied_in = []
    encoders = Encoders(CopyRecordingTokenizer(64), workers=3)
    made_at_start = list(CopyRecordingTokenizer.copied_in)

    def which(_i):
        time.sleep(0.05)   # keep the thread busy, so that the pool starts all of its threads
        return threading.current_thread().name, id(encoders.tokenizer)

    async def requests():
        return await asyncio.gather(*(encoders.run(which, i) for i in range(6)))
    try:
        seen = dict(asyncio.run(requests()))
    finally:
        encoders.close()
    assert made_at_start == [threading.current_thread().name] * 3
    assert CopyRecordingTokenizer.copied_in == made_at_start            # no copy made on a request's way
    assert len(seen) == 3 and len(set(seen.values())) == 3              # each thread its own copy


class ListedIds:
    """A real Hugging Face fast tokenizer, recording how many ids each call handed back."""

    def __init__(self, tokenizer):
        self.tokenizer, self.listed = tokenizer, []

    def __call__(self, text, **kwargs):
        out = self.tokenizer(text, **kwargs)
        self.listed.append(len(out["input_ids"]))
        return out


def test_a_prompt_beyond_the_context_is_refused_without_listing_all_its_ids():
    """Turning millions of ids into a Python list holds the GIL for about 0.5 s (/health waited that
    long behind a 20 MB prompt): the server asks the tokenizer for one id more than the context."""
    from dflash2.serve.jobs import build_job
    from dflash2.serve.protocol import ApiError, parse_completion
    from dflash2.serve.settings import RequestDefaults
    from matrix_util import tiny_tokenizer

    pipeline = tiny_serving_pipeline(speculate="never")
    tokenizer = ListedIds(tiny_tokenizer())
    limit = pipeline.decoder.target.max_positions
    request = parse_completion({"model": "m", "prompt": "ab " * 10_000, "max_tokens": 4})
    with pytest.raises(ApiError) as info:
        build_job(request, pipeline, RequestDefaults(), lambda _: None, tokenizer=tokenizer)
    assert info.value.code == "context_length_exceeded" and f"more than the context limit of {limit}" in info.value.message
    assert tokenizer.listed == [limit + 1]
    fits = parse_completion({"model": "m", "prompt": "ab " * 100, "max_tokens": 4})
    job = build_job(fits, pipeline, RequestDefaults(), lambda _: None, tokenizer=tokenizer)
    assert job.prompt == tiny_tokenizer()("ab " * 100)["input_ids"]            # a prompt that fits: every id


def test_a_client_that_leaves_before_its_body_arrives_is_no_fault(live):
    """A body shorter than its Content-Length, then the connection closed: no 500, no traceback,
    counted as 499 (the client left), and the server answers the next request."""
    before = count(live.metrics(), "/v1/completions", 499)
    with Records() as log:
        with socket.create_connection(live.sock.getsockname()[:2], timeout=10) as raw:
            raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
        deadline = time.time() + 20
        while count(live.metrics(), "/v1/completions", 499) < before + 1:
            assert time.time() < deadline, "the cut request was not counted as 499"
            time.sleep(0.05)
        good = httpx.post(live.url + "/v1/completions", content=_body(prompt="hi"), headers=AUTH, timeout=30)
    assert good.status_code == 200
    assert log.tracebacks == [] and not any(r.levelno >= logging.ERROR for r in log.records)
