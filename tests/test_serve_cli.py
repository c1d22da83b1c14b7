"""`dflash2 serve` as a command: bad options fail in one line before anything loads, and a real
server process (tiny models) answers like the engine and drains its requests on SIGTERM."""
from __future__ import annotations

import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from dflash2.cli import main
from serve_util import reference, start_server_process, stream_tokens, tiny_serving_pipeline


@pytest.mark.parametrize("argv, words", [
    (["--max-batch", "0"], "--max-batch must be at least 1"),
    (["--max-queue", "-1"], "--max-queue"),
    (["--port", "70000"], "--port must be in 0..65535"),
    (["--speculate", "sometimes"], "--speculate"),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--top-p", "2"], "--top-p must be in (0, 1]"),
    (["--max-tokens", "0"], "--max-tokens must be a positive integer"),
    (["--api-key", " "], "--api-key must not be empty"),
    (["--draft", "somewhere", "--no-draft"], "at most one of --draft and --no-draft"),
    (["--log-level", "loud"], "--log-level"),
    (["--weights", "int2"], "--weights"),
    (["--per-request-spec-decode-metrics", "full"], "--per-request-spec-decode-metrics"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_options_fail_in_one_line(argv, words, capsys):
    started = time.perf_counter()
    assert main(["serve", "--tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1
    assert time.perf_counter() - started < 2            # nothing was loaded


def test_busy_port_fails_in_one_line(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--tiny", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot listen on 127.0.0.1:{port}") and err.count("\n") == 1


def test_server_process_answers_like_the_engine_and_drains_on_sigterm(tmp_path):
    proc, url = start_server_process(tmp_path, "--speculate", "always", "--threads", "1", "--log-level", "warning")
    try:
        api = openai.OpenAI(base_url=url + "/v1", api_key="from-env", max_retries=0, timeout=60)
        engine = tiny_serving_pipeline(speculate="never")
        prompts = [f"drain me {i}" for i in range(3)]
        want = [reference(engine.decoder, engine.tokenizer(p)["input_ids"], 150) for p in prompts]
        going = threading.Barrier(4)

        def streamed(i):
            return stream_tokens(api, "tiny-random-llama", prompts[i], 150, going, after=1)

        with ThreadPoolExecutor(3) as pool:
            jobs = [pool.submit(streamed, i) for i in range(3)]
            going.wait(timeout=60)                       # three answers are streaming
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            with pytest.raises(httpx.TransportError):     # no new connections while draining
                httpx.get(url + "/health", timeout=5)
            results = [job.result(timeout=120) for job in jobs]
        assert results == [(w, "length") for w in want]  # every request in flight finished, in full
        assert proc.wait(timeout=60) == 0
        assert "dflash2 serve: stopped" in (tmp_path / "serve.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_loaded_models_are_out_of_the_collectors_sight():
    """A full garbage collection over torch's and the models' objects paused a real server for up to
    0.7 s (/health included); once loaded, they are frozen out of the collector's scans."""
    import gc

    from dflash2.serve.command import load_pipeline
    from dflash2.serve.settings import ServeSettings

    gc.unfreeze()
    try:
        pipeline = load_pipeline(ServeSettings(tiny=True, port=0))
        assert gc.get_freeze_count() > 0
        frozen = {id(o) for o in gc.get_objects()}   # get_objects lists the unfrozen ones only
        assert id(pipeline.decoder) not in frozen and id(pipeline.decoder.target) not in frozen
    finally:
        gc.unfreeze()


def test_the_socket_accepts_connections_as_soon_as_it_is_claimed():
    """The `dflash2 serve: http://...` line is printed once the socket is claimed, before uvicorn
    runs: a client that connects then must wait in the backlog, not be refused."""
    from dflash2.serve.command import bind

    sock = bind("127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname()[:2], timeout=5):
            pass
    finally:
        sock.close()
