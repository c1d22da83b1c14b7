"""`dflash2 serve` through the official `openai` client, against a live server on loopback (tiny random
models): chat and completions, streaming and not, 16 concurrent clients equal to the engine token for
token, seeded sampling repeats, stop strings across token boundaries, the API key, bad requests, a
client leaving mid-stream, a request that breaks its batch, a full queue. After each: /health is OK."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from dflash2.targets.chat import encode_messages
from serve_util import API_KEY, POISON, LiveServer, reference, tiny_serving_pipeline


@pytest.fixture(scope="module")
def live():
    server = LiveServer(tiny_serving_pipeline(poison=True), api_key=API_KEY, max_batch=16, max_queue=64)
    yield server
    server.close()


@pytest.fixture(scope="module")
def engine():
    """A separate copy of the same models: the references (`decoder.generate` on one prompt)."""
    return tiny_serving_pipeline(speculate="never")


@pytest.fixture(autouse=True)
def still_healthy(request):
    yield
    if "live" in request.fixturenames:
        server = request.getfixturevalue("live")
        server.wait_idle()
        assert server.health()["status"] == "ok"


def client(live, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=kw.pop("api_key", API_KEY), max_retries=0, timeout=60, **kw)


def chat_ids(engine, text: str) -> list[int]:
    return encode_messages(engine.tokenizer, [{"role": "user", "content": text}])


def completion_ids(engine, text: str) -> list[int]:
    return engine.tokenizer(text)["input_ids"]


def decode(engine, ids) -> str:
    return engine.tokenizer.decode(ids, skip_special_tokens=True)


TOKEN_IDS = {"return_token_ids": True}
HELLO = [{"role": "user", "content": "hello"}]


def test_models_health_metrics_page(live):
    assert [m.id for m in client(live).models.list()] == [live.model]
    assert live.health() == {"status": "ok", "running": 0, "queued": 0}
    page = httpx.get(live.url + "/", timeout=10)
    assert page.status_code == 200 and "dflash2 playground" in page.text and live.model in page.text
    assert httpx.get(live.url + "/playground.js", timeout=10).status_code == 200
    missing = httpx.get(live.url + "/v2/nothing", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    text = live.metrics()
    for name in ("dflash2_requests_total", "dflash2_prompt_tokens_total", "dflash2_generation_tokens_total",
                 "dflash2_acceptance_length_bucket", "dflash2_time_to_first_token_seconds_bucket",
                 "dflash2_time_per_output_token_seconds_bucket", "dflash2_queue_depth", "dflash2_running_batch_size"):
        assert name in text


def test_chat_and_completions_equal_the_engine(live, engine):
    api = client(live)
    prompt = "tell me about rivers"
    want = reference(engine.decoder, chat_ids(engine, prompt), 24)
    reply = api.chat.completions.create(model=live.model, messages=[{"role": "user", "content": prompt}],
                                        max_tokens=24, extra_body=TOKEN_IDS)
    choice = reply.choices[0]
    assert choice.token_ids == want and choice.message.content == decode(engine, want)
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert reply.usage.completion_tokens == 24 and reply.usage.prompt_tokens == len(chat_ids(engine, prompt))
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")

    chunks = list(api.chat.completions.create(model=live.model, messages=[{"role": "user", "content": prompt}],
                                              max_tokens=24, stream=True, stream_options={"include_usage": True},
                                              extra_body=TOKEN_IDS))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert [t for c in chunks if c.choices for t in (c.choices[0].token_ids or [])] == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(c.object == "chat.completion.chunk" for c in chunks)

    want = reference(engine.decoder, completion_ids(engine, prompt), 20)
    done = api.completions.create(model=live.model, prompt=prompt, max_tokens=20, extra_body=TOKEN_IDS)
    assert done.choices[0].token_ids == want and done.choices[0].text == decode(engine, want)
    streamed = list(api.completions.create(model=live.model, prompt=prompt, max_tokens=20, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == done.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "length" and all(c.usage is None for c in streamed)
    by_ids = api.completions.create(model=live.model, prompt=completion_ids(engine, prompt), max_tokens=20,
                                    extra_body=TOKEN_IDS)
    assert by_ids.choices[0].token_ids == want


def test_16_concurrent_clients_are_lossless_and_seeded_sampling_repeats(live, engine):
    api = client(live)
    prompts = [f"question {i}: " + "why is the sky blue " * (1 + i % 3) for i in range(16)]
    lengths = [12 + (i * 5) % 17 for i in range(16)]           # rows leave the batch at different cycles
    want = [reference(engine.decoder, chat_ids(engine, p), n) for p, n in zip(prompts, lengths)]
    sampled = [dict(temperature=0.9, top_p=0.95, seed=100 + i, extra_body={"top_k": 20, **TOKEN_IDS}) for i in range(4)]

    def greedy(i):
        kw = dict(model=live.model, messages=[{"role": "user", "content": prompts[i]}], max_tokens=lengths[i],
                  extra_body=TOKEN_IDS)
        if i % 2:  # half of the clients stream
            chunks = api.chat.completions.create(stream=True, **kw)
            return [t for c in chunks for t in (c.choices[0].token_ids or [])]
        return api.chat.completions.create(**kw).choices[0].token_ids

    def sample(i):
        reply = api.chat.completions.create(model=live.model, messages=[{"role": "user", "content": prompts[i]}],
                                            max_tokens=20, **sampled[i])
        return reply.choices[0].message.content

    before = live.scheduler.peak_running
    with ThreadPoolExecutor(20) as pool:
        greedy_jobs = [pool.submit(greedy, i) for i in range(16)]
        sampled_jobs = [pool.submit(sample, i) for i in range(4)]
        got = [job.result() for job in greedy_jobs]
        together = [job.result() for job in sampled_jobs]
    assert got == want                                  # token for token, every one of the 16
    assert live.scheduler.peak_running > max(before, 4)  # they really shared the batch
    alone = [sample(i) for i in range(4)]               # the same seeded requests, one at a time
    assert alone == together
    assert len(set(alone)) > 1


def test_stop_strings_across_token_boundaries(live, engine):
    api = client(live)
    prompt = "the quick brown fox"
    full = decode(engine, reference(engine.decoder, completion_ids(engine, prompt), 40))
    stop = full[12:15]                      # three characters: three tokens of the tiny tokenizer
    cut = full[:full.find(stop)]
    kw = dict(model=live.model, prompt=prompt, max_tokens=40)
    reply = api.completions.create(stop=stop, **kw)
    assert reply.choices[0].text == cut and reply.choices[0].finish_reason == "stop"
    chunks = list(api.completions.create(stop=[stop], stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == cut and chunks[-1].choices[0].finish_reason == "stop"
    other = full[20:22]
    both = api.completions.create(stop=[other, stop], **kw).choices[0].text
    assert both == full[:min(full.find(stop), full.find(other))]
    absent = api.completions.create(stop=["0"], **kw).choices[0]   # the tiny tokenizer never writes digits
    assert absent.text == full and absent.finish_reason == "length"
    chat = api.chat.completions.create(model=live.model, messages=[{"role": "user", "content": prompt}],
                                       max_tokens=40, stop=stop)
    assert chat.choices[0].message.content == cut and chat.choices[0].finish_reason == "stop"


def test_api_key(live):
    with pytest.raises(openai.AuthenticationError) as info:
        client(live, api_key="wrong-key").chat.completions.create(model=live.model, messages=HELLO)
    assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
    bare = httpx.post(live.url + "/v1/completions", json={"model": live.model, "prompt": "hi"}, timeout=10)
    assert bare.status_code == 401 and bare.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(live.url + "/v1/models", timeout=10).status_code == 401


@pytest.mark.parametrize("endpoint, fields, param, words", [
    ("chat", dict(model="no-such-model"), "model", "does not exist"),
    ("chat", dict(max_tokens=0), "max_tokens", "'max_tokens' must be a positive integer"),
    ("chat", dict(max_tokens=-5), "max_tokens", "max_tokens"),
    ("chat", dict(max_completion_tokens=0), "max_completion_tokens", "max_completion_tokens"),
    ("chat", dict(temperature=-0.5), "temperature", "'temperature' must be a finite number >= 0"),
    ("chat", dict(top_p=0.0), "top_p", "'top_p' must be in (0, 1]"),
    ("chat", dict(top_p=1.5), "top_p", "top_p"),
    ("chat", dict(messages=None), "messages", "'messages' is required"),
    ("chat", dict(messages=[{"role": "robot", "content": "x"}]), "messages", "role"),
    ("chat", dict(n=2), "n", "not supported"),
    ("chat", dict(logprobs=True), "logprobs", "not supported"),
    ("chat", dict(frequency_penalty=0.5), "frequency_penalty", "not supported"),
    ("chat", dict(extra_body={"top_k": -1}), "top_k", "top_k"),
    ("chat", dict(extra_body={"mirostat": 2}), "mirostat", "Unsupported field"),
    ("chat", dict(max_tokens=600), "messages", "context"),
    ("completion", dict(prompt=list(range(3, 100)) * 6), "prompt", "context"),
    ("completion", dict(prompt=[5, 999]), "prompt", "outside the vocabulary"),
    ("completion", dict(prompt=["one", "two"]), "prompt", "Several prompts"),
    ("completion", dict(echo=True), "echo", "not supported"),
    ("completion", dict(stop=[""]), "stop", "stop"),
])
def test_bad_requests_get_400_with_an_openai_error(live, endpoint, fields, param, words):
    api = client(live)
    base = dict(model=live.model, max_tokens=8)
    base.update({"messages": HELLO} if endpoint == "chat" else {"prompt": "hello"})
    base.update(fields)
    create = api.chat.completions.create if endpoint == "chat" else api.completions.create
    with pytest.raises(openai.BadRequestError) as info:
        create(**base)
    error = info.value.body
    assert info.value.status_code == 400
    assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"]
    assert "\n" not in error["message"]


def test_malformed_json_and_wrong_shapes(live):
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    for body in (b'{"model": "x", "messages": [', b"[1, 2]", b"\xff\xfe", b""):
        response = httpx.post(live.url + "/v1/chat/completions", content=body, headers=headers, timeout=10)
        assert response.status_code == 400, body
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_json"
    wrong = httpx.post(live.url + "/v1/completions", json={"model": live.model, "prompt": "x", "max_tokens": "8"},
                       headers=headers, timeout=10)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "max_tokens"
    method = httpx.get(live.url + "/v1/chat/completions", headers=headers, timeout=10)
    assert method.status_code == 405 and "error" in method.json()


def test_client_disconnect_mid_stream_frees_its_row(live):
    body = {"model": live.model, "prompt": "a long answer please", "max_tokens": 480, "stream": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", live.url + "/v1/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: {") for line in got)
            assert live.scheduler.running == 1
    started = time.time()
    live.wait_idle(timeout=10)                 # freed long before 480 tokens could have been decoded
    assert time.time() - started < 10
    assert 'dflash2_requests_total{endpoint="/v1/completions",status="499"}' in live.metrics()
    assert 'dflash2_finished_total{reason="cancelled"}' in live.metrics()


def test_a_failing_request_does_not_take_the_batch_down(live, engine):
    api = client(live)
    prompts = [f"steady request {i}" for i in range(3)]
    want = [reference(engine.decoder, completion_ids(engine, p), 60) for p in prompts]
    started = threading.Barrier(4)

    def steady(i):
        stream = api.completions.create(model=live.model, prompt=prompts[i], max_tokens=60, stream=True,
                                        extra_body=TOKEN_IDS)
        tokens = []
        for n, chunk in enumerate(stream):
            tokens += chunk.choices[0].token_ids or []
            if n == 2:
                started.wait(timeout=30)
        return tokens

    with ThreadPoolExecutor(3) as pool:
        jobs = [pool.submit(steady, i) for i in range(3)]
        started.wait(timeout=30)             # all three are decoding; now one request breaks the step
        with pytest.raises(openai.InternalServerError) as info:
            api.completions.create(model=live.model, prompt=[1, 5, POISON, 7], max_tokens=8)
        assert info.value.status_code == 500 and info.value.body["type"] == "server_error"
        assert "poisoned prompt" in info.value.body["message"]
        assert [job.result() for job in jobs] == want
    after = api.completions.create(model=live.model, prompt=prompts[0], max_tokens=60, extra_body=TOKEN_IDS)
    assert after.choices[0].token_ids == want[0]


def test_full_queue_gets_429_with_retry_after():
    server = LiveServer(tiny_serving_pipeline(), max_batch=1, max_queue=1, retry_after_s=3)
    try:
        api = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        running = api.completions.create(model=server.model, prompt="first", max_tokens=400, stream=True)
        next(iter(running))                           # the only row is taken
        waiting = ThreadPoolExecutor(1).submit(api.completions.create, model=server.model, prompt="second",
                                               max_tokens=5)
        deadline = time.time() + 10
        while server.scheduler.queue_depth < 1:
            assert time.time() < deadline
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as info:
            api.completions.create(model=server.model, prompt="third", max_tokens=5)
        assert info.value.status_code == 429 and info.value.response.headers["retry-after"] == "3"
        assert info.value.body["code"] == "queue_full"
        running.close()                               # leaves: the waiting request gets the row
        assert waiting.result(timeout=30).choices[0].finish_reason == "length"
        server.wait_idle()
        assert server.health()["status"] == "ok"
    finally:
        server.close()


def test_loadtest_against_the_live_server(live, tmp_path, capsys):
    from dflash2.cli import main

    out = tmp_path / "load.json"
    status = main(["loadtest", "--tiny", "--url", live.url, "--api-key", API_KEY, "--concurrency", "1,4",
                   "--requests", "4", "--max-tokens", "12", "--out", str(out)])
    assert status == 0, capsys.readouterr().err
    import json

    results = json.loads(out.read_text())
    assert [r["concurrency"] for r in results["rows"]] == [1, 4]
    for row in results["rows"]:
        assert row["errors"] == 0 and row["mismatches"] == 0 and row["requests"] == 4
        assert row["output_tokens_per_s"] > 0 and row["latency_p99_s"] >= row["latency_p50_s"] > 0
    assert "***" in results["command"] and API_KEY not in out.read_text()
    assert "| speculative | 4 | 4 | 0 | 0 |" in capsys.readouterr().out
    assert main(["loadtest", "--url", "http://example.com:8000"]) == 2


def test_tokenize_answers_like_vllm(live, engine):
    def post(body, key=API_KEY):
        return httpx.post(live.url + "/tokenize", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10)

    text = "tell me about rivers"
    got = post({"model": live.model, "prompt": text})
    assert got.status_code == 200
    assert got.json() == {"count": len(completion_ids(engine, text)), "tokens": completion_ids(engine, text),
                          "max_model_len": engine.decoder.target.max_positions}
    bare = post({"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert bare == engine.tokenizer(text, add_special_tokens=False)["input_ids"] != completion_ids(engine, text)
    for body, param in (({"prompt": 5}, "prompt"), ({"prompt": "x", "messages": []}, "messages"),
                        ({"prompt": "x", "model": "other"}, "model"), ({"prompt": "x", "add_special_tokens": 1},
                                                                       "add_special_tokens")):
        refused = post(body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, body
    assert post({"prompt": text}, key="wrong").status_code == 401
