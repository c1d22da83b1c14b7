"""Where proposed tokens come from (vLLM v1's proposers).

- `draft`: `DraftProposer`, the DFlash2 draft's context cache and one block proposal per cycle
  (a path through the selector's candidates; with `lattice`, its second path too); `Drafter`, what
  a decoder needs to make one per batch.
- `lookup`: `LookupProposer`, n-gram lookup in each row's own text and in recent requests
  (`SuffixStore`); no model.
- `tree`: token trees, several proposals of a row packed into one verify pass, and their greedy
  acceptance.
- `kinds`: which proposers there are, the default one, and the block size each proposes in.
"""
