"""`dflash2 serve --proposer lookup` through the official `openai` client: answers equal the engine's
plain greedy decoding token for token, tokens accepted from lookup are marked `lookup` in the
`origins` extension (the playground's colour) and counted by source in /metrics."""
from __future__ import annotations

import re

import openai
import pytest

from dflash2.decoding.loop.engine import SpeculativeDecoder
from dflash2.decoding.proposers.lookup import SuffixStore
from dflash2.decoding.verifier.adapter import TargetAdapter
from dflash2.pipeline import Pipeline
from dflash2.targets.tiny import TinyTokenizer, tiny_target
from serve_util import LiveServer, reference
from test_lookup import repeating_prompts

VOCAB = 16   # a tiny random target with a small vocabulary repeats itself: lookup has work to do


@pytest.fixture(scope="module")
def lookup_server():
    target = tiny_target("llama", vocab_size=VOCAB)
    decoder = SpeculativeDecoder(TargetAdapter(target), None, speculate="always", proposer="lookup",
                                 suffix_store=SuffixStore())
    pipeline = Pipeline(decoder, TinyTokenizer(VOCAB), (), "no draft (lookup proposals)", False)
    server = LiveServer(pipeline, max_batch=4, max_queue=16)
    plain = SpeculativeDecoder(TargetAdapter(target), None, speculate="never")
    yield server, plain
    server.close()


def test_lookup_answers_are_lossless_and_their_origins_and_metrics_name_the_source(lookup_server):
    server, plain = lookup_server
    api = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    origins = []
    for prompt in repeating_prompts(VOCAB, 6):
        done = api.completions.create(model=server.model, prompt=prompt, max_tokens=24,
                                      extra_body={"return_token_ids": True})
        choice = done.choices[0]
        assert choice.token_ids == reference(plain, prompt, 24)
        assert len(choice.origins) == len(choice.token_ids)
        assert set(choice.origins) <= {"lookup", "target", "plain"}    # no draft model here
        origins += choice.origins
        assert done.model_extra["dflash2"]["accepted_lookup_tokens"] == choice.origins.count("lookup")
    accepted = origins.count("lookup")
    assert accepted > 0, "lookup never accepted a token: the test would not exercise the path"
    server.wait_idle()
    found = re.search(r'dflash2_accepted_tokens_total\{source="lookup"\} ([0-9.e+]+)', server.metrics())
    assert found is not None and float(found.group(1)) == accepted
