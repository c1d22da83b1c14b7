"""`dflash2 serve` on a hybrid target directory (a tiny random Qwen3.5, Gated DeltaNet + attention, saved
with save_pretrained, and a draft made by `init-draft`), loaded as the command loads it, answering the
official `openai` client: completions and chat, streamed and not, and 8 concurrent clients sharing the
batch (rows joining and leaving), every reply equal to the target's own greedy decoding (HF generate)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch

from dflash2.cli import main
from dflash2.pipeline import load_decoder
from dflash2.targets.chat import encode_messages
from dflash2.targets.tiny import tiny_target
from matrix_util import tiny_tokenizer
from serve_util import API_KEY, LiveServer
from test_lossless_hybrid import hf_greedy


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid-serve")
    target = tiny_target("qwen3_5")
    target.save_pretrained(root / "target")
    tiny_tokenizer().save_pretrained(root / "target")
    assert main(["init-draft", "--target", str(root / "target"), "--out", str(root / "draft"), "--layers", "1"]) == 0
    pipeline = load_decoder(str(root / "target"), str(root / "draft"), "cpu", "float32", speculate="always")
    assert pipeline.decoder.target.hybrid and pipeline.stop_token_ids == (STOP,)
    server = LiveServer(pipeline, api_key=API_KEY, max_batch=8, max_queue=32)
    yield server, target
    server.close()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


TOKEN_IDS = {"return_token_ids": True}
STOP = 2                                                           # the tokenizer's end of sequence: the server stops there


def test_completions_and_chat_equal_the_targets_greedy_decoding(live):
    server, target = live
    api = client(server)
    prompt = [1, 7, 12, 30, 9, 22, 5]
    want = hf_greedy(target, prompt, 16, eos=STOP)
    done = api.completions.create(model=server.model, prompt=prompt, max_tokens=16, extra_body=TOKEN_IDS)
    assert done.choices[0].token_ids == want
    streamed = list(api.completions.create(model=server.model, prompt=prompt, max_tokens=16, stream=True,
                                           extra_body=TOKEN_IDS))
    assert [t for c in streamed for t in (c.choices[0].token_ids or [])] == want

    messages = [{"role": "user", "content": "hello there"}]
    want = hf_greedy(target, encode_messages(server.pipeline.tokenizer, messages), 12, eos=STOP)
    reply = api.chat.completions.create(model=server.model, messages=messages, max_tokens=12, extra_body=TOKEN_IDS)
    assert reply.choices[0].token_ids == want


def test_concurrent_clients_share_the_batch_losslessly(live):
    server, target = live
    api = client(server)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, 31, (int(n),), generator=g).tolist() for n in torch.randint(2, 12, (8,), generator=g)]
    lengths = [6 + (3 * i) % 11 for i in range(8)]                # rows leave the batch at different cycles
    want = [hf_greedy(target, p, n, eos=STOP) for p, n in zip(prompts, lengths)]

    def ask(i):
        return api.completions.create(model=server.model, prompt=prompts[i], max_tokens=lengths[i],
                                      extra_body=TOKEN_IDS).choices[0].token_ids

    before = server.scheduler.peak_running
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, range(8)))
    assert got == want
    assert server.scheduler.peak_running > max(before, 2)         # they really shared the batch
    server.wait_idle()
    assert server.health()["status"] == "ok"
