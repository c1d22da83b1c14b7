"""The lattice's second path (`CandidateSelector.second_path`) against a walk done by hand."""
import torch

from dflash2.model.selector import CandidateSelector


def _by_hand(scores, cand, main_picks, main_conf):
    """One row: the fork from its definition, then a greedy walk from the runner-up."""
    t_len, k = scores.shape[0], scores.shape[-1]
    best, fork, prev = -1.0, 0, 0
    reach = 1.0
    for t in range(t_len):
        p = torch.softmax(scores[t, prev].float(), -1)
        second = float(p.sort(descending=True).values[1])
        if reach * second > best:
            best, fork = reach * second, t
        reach *= float(main_conf[t])
        prev = int(main_picks[t])
    prev = 0 if fork == 0 else int(main_picks[fork - 1])
    picks = list(main_picks[:fork])
    p = torch.softmax(scores[fork, prev].float(), -1)
    current = int(p.sort(descending=True).indices[1])
    picks.append(current)
    for t in range(fork + 1, t_len):
        current = int(scores[t, current].float().argmax())
        picks.append(current)
    return fork, [int(cand[t, i]) for t, i in enumerate(picks)]


def test_second_path_matches_its_definition():
    torch.manual_seed(0)
    b, t_len, k = 6, 7, 16
    scores = torch.randn(b, t_len, k, k) * 4
    cand = torch.stack([torch.randperm(1000)[:k] for _ in range(b * t_len)]).view(b, t_len, k)
    main = CandidateSelector.walk(scores, cand, 0.0)
    second = CandidateSelector.second_path(scores, cand, main)
    forks = set()
    for r in range(b):
        picks = [int((cand[r, t] == main.tokens[r, t]).nonzero()) for t in range(t_len)]
        fork, tokens = _by_hand(scores[r], cand[r], picks, main.confidence[r])
        forks.add(fork)
        assert int(second.fork[r]) == fork
        assert second.tokens[r].tolist() == tokens
        assert second.tokens[r, :fork].tolist() == main.tokens[r, :fork].tolist()
        assert int(second.tokens[r, fork]) != int(main.tokens[r, fork])
    assert len(forks) > 1          # the rows fork at different positions: the rule is exercised


def test_a_certain_main_path_forks_where_it_is_least_sure():
    t_len, k = 5, 4
    scores = torch.full((1, t_len, k, k), -20.0)
    scores[..., 0] = 20.0                       # every step: candidate 0, near certain
    scores[0, 3, 0, 1] = 19.5                   # except position 3, where candidate 1 is close
    cand = torch.arange(t_len * k).view(1, t_len, k)
    main = CandidateSelector.walk(scores, cand, 0.0)
    second = CandidateSelector.second_path(scores, cand, main)
    assert int(second.fork[0]) == 3
    assert second.tokens[0].tolist() == [0, 4, 8, 13, 16]
    assert abs(float(second.confidence[0, 3]) - float(torch.softmax(scores[0, 3, 0], -1)[1])) < 1e-6
