"""`dflash2 regenerate --endpoint URL` against a real `dflash2 serve` of a tiny local target (speculating
with a draft): at T=0 its shards are the same bytes as local regeneration's, resuming continues a local
run, and a server of another model or another tokenizer is refused in one line before any work. The
text path (an endpoint that returns no token ids) is checked against the same kind of server."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash2.cli import main as cli
from dflash2.data.shards import ShardWriter, load_manifest, read_records
from dflash2.pipeline import load_decoder
from dflash2.training import regenerate as regen
from dflash2.training.endpoint import Endpoint, RemoteTarget, prove_same_target, request_into
from regen_util import write_prompts, write_target
from serve_util import LiveServer, start_server_process

MAX_NEW = 24
COMMON = ["--max-new-tokens", str(MAX_NEW), "--shard-size", "3", "--no-progress", "--dtype", "float32"]
KEY = "sk-regen-test"   # the served process requires it


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("regen-endpoint")
    target = write_target(root / "target")
    assert cli(["init-draft", "--target", str(target), "--out", str(root / "draft"), "--layers", "1"]) == 0
    prompts = write_prompts(root / "prompts.jsonl")
    proc, url = start_server_process(root, "--target", str(target), "--draft", str(root / "draft"), "--speculate",
                                     "always", "--threads", "1", "--log-level", "warning", "--dtype", "float32",
                                     api_key=KEY, tiny=False)
    try:
        local = root / "local"
        assert regen.main(["--target", str(target), "--prompts", str(prompts), "--out", str(local),
                           "--batch-size", "4", *COMMON]) == 0
        yield {"root": root, "target": target, "prompts": prompts, "url": url, "local": local}
    finally:
        proc.terminate()
        proc.wait(30)


def shard_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("shard-*.npz"))}


def records(directory: Path) -> dict[str, tuple]:
    return {r.id: (r.prompt.tolist(), r.response.tolist(), r.finish_reason) for r in read_records(directory)}


def test_endpoint_shards_equal_local_regeneration_byte_for_byte(world, tmp_path):
    out = tmp_path / "remote"
    assert regen.main(["--target", str(world["target"]), "--prompts", str(world["prompts"]), "--out", str(out),
                       "--endpoint", world["url"], "--api-key", KEY, "--concurrency", "3", *COMMON]) == 0
    local = shard_bytes(world["local"])
    assert len(local) == 3 and shard_bytes(out) == local
    mine, theirs = load_manifest(out), load_manifest(world["local"])
    for key in ("target", "tokenizer", "prompts", "sampling", "counts", "shards"):
        assert mine[key] == theirs[key], key
    [run] = mine["runs"]
    assert run["endpoint"] == world["url"] and run["concurrency"] == 3 and run["token_ids"] == "endpoint"
    assert run["tokenizer_fingerprint"] == "equal" and run["greedy_probe_tokens"] > 0
    stored = records(out)
    assert len(stored) == 8 and all(response[-1] == 2 or finish == "length" for _, response, finish in stored.values())


def test_an_endpoint_run_resumes_a_local_one(world, tmp_path):
    out = tmp_path / "mixed"
    assert regen.main(["--target", str(world["target"]), "--prompts", str(world["prompts"]), "--out", str(out),
                       "--num-prompts", "3", *COMMON]) == 0
    assert regen.main(["--target", str(world["target"]), "--prompts", str(world["prompts"]), "--out", str(out),
                       "--endpoint", world["url"], "--api-key", KEY, *COMMON]) == 0
    assert records(out) == records(world["local"])
    assert [run["records_added"] for run in load_manifest(out)["runs"]] == [3, 5]


@pytest.mark.parametrize("kind, words", [("other", "does not serve this target: its greedy answer"),
                                         ("retok", "does not use this target's tokenizer")])
def test_a_server_of_another_model_or_tokenizer_is_refused_in_one_line(world, tmp_path, kind, words, capsys):
    served = write_target(tmp_path / kind, seed=1 if kind == "other" else 0, shift=5 if kind == "retok" else 0)
    server = LiveServer(load_decoder(str(served), None, "cpu", "float32", no_draft=True, speculate="never"))
    try:
        out = tmp_path / "refused"
        capsys.readouterr()
        assert regen.main(["--target", str(world["target"]), "--prompts", str(world["prompts"]), "--out", str(out),
                           "--endpoint", server.url, *COMMON]) == 2
        err = capsys.readouterr().err.strip().splitlines()
    finally:
        server.close()
    assert len(err) == 1 and err[0].startswith("dflash2 regenerate: error: the endpoint") and words in err[0]
    assert not out.exists()                                                 # nothing was written


def test_bad_endpoints_are_one_line_before_the_target_loads(world, tmp_path, capsys):
    base = ["--target", str(world["target"]), "--prompts", str(world["prompts"]), "--out", str(tmp_path / "x"),
            "--api-key", KEY]
    cases = [(["--endpoint", "ftp://host"], "--endpoint must be an http:// or https:// URL"),
             (["--endpoint", "http://127.0.0.1:9"], "cannot reach the endpoint http://127.0.0.1:9"),
             (["--endpoint", world["url"], "--endpoint-model", "nope"], "does not serve 'nope'"),
             (["--endpoint", world["url"], "--api-key", "wrong"], "Incorrect or missing API key"),
             (["--endpoint", world["url"], "--off-policy"], "--off-policy decodes nothing"),
             (["--concurrency", "2"], "--concurrency sets the requests in flight to an --endpoint"),
             (["--endpoint", world["url"], "--concurrency", "0"], "concurrency must be a positive integer")]
    for extra, words in cases:
        assert regen.main([*base, *extra, *COMMON]) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (extra, err)
    assert not (tmp_path / "x").exists()


def test_without_token_ids_answers_are_re_encoded_and_checked(world, tmp_path):
    """The path for endpoints that return text only: each answer re-encoded with the local tokenizer,
    stored only when it decodes back to that text; the probe compares texts."""
    pipeline = load_decoder(str(world["target"]), None, "cpu", "float32", no_draft=True, speculate="never")
    server = LiveServer(pipeline)
    try:
        tokenizer = pipeline.tokenizer
        remote = RemoteTarget(Endpoint(server.url), server.model, tokenizer, pipeline.stop_token_ids,
                              {"max_new_tokens": MAX_NEW, "temperature": 0.0, "top_p": 1.0, "top_k": 0})
        remote.token_ids = "re-encoded"                                    # ask for text only
        local = records(world["local"])
        first = min(local, key=lambda i: (len(local[i][0]), i))
        checked = prove_same_target(remote, local[first][0], local[first][1], MAX_NEW)
        assert checked["token_ids"] == "re-encoded" and checked["tokenizer_fingerprint"] == "equal"
        queue = [regen.Prompt(i, prompt) for i, (prompt, _, _) in sorted(local.items(), key=lambda kv: len(kv[1][0]))]
        with ShardWriter(tmp_path / "text", {"note": "text path"}, shard_size=3) as writer:
            dropped = request_into(remote, writer, queue, 3, 0, _Quiet())
    finally:
        server.close()
    got = records(tmp_path / "text")
    assert dropped == 0 and set(got) == set(local)
    for key, (prompt, response, finish) in got.items():
        want = local[key][1]
        assert prompt == local[key][0] and finish == local[key][2]
        # the same text as the target's own answer (special tokens have no text to re-encode)
        assert tokenizer.decode(response, skip_special_tokens=True) == tokenizer.decode(want, skip_special_tokens=True)


class _Quiet:
    """What `request_into` reports progress to, here nobody."""

    def finished(self, tokens: int) -> None:
        pass

    def tick(self) -> None:
        pass


def test_the_manifest_names_the_user_file(world):
    manifest = load_manifest(world["local"])
    assert manifest["prompts"]["source"] == "file" and manifest["prompts"]["file"] == "prompts.jsonl"
    assert len(manifest["prompts"]["sha256"]) == 64
    ids = sorted(records(world["local"]))
    assert ids == sorted(["prompts:1", "prompts:m1", "prompts:3", "prompts:4", "prompts:m4", "prompts:6", "prompts:7",
                          "prompts:m7"]), json.dumps(ids)
