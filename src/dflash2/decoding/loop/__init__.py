"""The decoding loop: a batch of requests, one cycle at a time (vLLM's scheduler and runner step,
gpt-fast's `speculative_decode`, in one readable place).

- `engine`: `SpeculativeDecoder` (a target, its proposers, a policy; `generate`, `stream`,
  `session`, `variant`) and `DecodeSession` (rows join and leave between cycles; `_cycle` is one
  propose -> choose -> verify -> accept -> keep -> observe round).
- `requests`: what a request asks for and gets back (`GenerationConfig`, `GenerationResult`, `Event`).
- `block`: what a cycle's target pass verifies, row by row (a linear block or a token tree).
- `acceptance`: the greedy and exact sampling acceptance rules (pure tensor functions).
- `sampling`: per-row temperature, top-k, top-p and seed; `stats`: per-row counts and batch timing;
  `timing`: the stopwatch of a cycle's phases; `context`: the context-length rule.
"""
