"""A user's prompt and conversation files (`dflash2 regenerate --prompts FILE`): the three record kinds
recognised line by line (or in one JSON array), and every malformed record refused in one line that
names the file and the line, before anything loads."""
from __future__ import annotations

import json
import time

import pytest

from dflash2.data.chat_files import load_chat_file
from dflash2.errors import DFlash2Error
from dflash2.training import regenerate as regen


def write(path, *records, raw: str | None = None):
    path.write_text(raw if raw is not None else "\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_the_three_kinds_are_recognised_record_by_record(tmp_path):
    path = write(tmp_path / "mine.jsonl",
                 {"prompt": "one"},
                 {"id": "x", "messages": [{"role": "developer", "content": "sys"},
                                          {"role": "user", "content": [{"type": "text", "text": "tw"},
                                                                       {"type": "text", "text": "o"}]},
                                          {"role": "assistant", "content": "old"}]},
                 {"id": 7, "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "three"},
                                             {"from": "gpt", "value": "a1"}, {"from": "human", "value": "again"},
                                             {"from": "gpt", "value": "a2"}]})
    one, two, three = load_chat_file(path)
    assert one.id == "1" and one.prompt_messages() == [{"role": "user", "content": "one"}]
    assert one.answered_turns() == []
    assert two.id == "x" and two.prompt_messages() == [{"role": "system", "content": "sys"},
                                                       {"role": "user", "content": "two"}]
    assert [answer for _, answer in two.answered_turns()] == ["old"]
    assert three.id == "7" and three.prompt_messages()[-1] == {"role": "user", "content": "again"}
    turns = three.answered_turns()
    assert [answer for _, answer in turns] == ["a1", "a2"]
    assert [m["content"] for m in turns[1][0]] == ["s", "three", "a1", "again"]


def test_a_json_array_of_sharegpt_records_is_read_too(tmp_path):
    records = [{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
               {"conversations": [{"role": "user", "content": "written the openai way"}]}]
    path = write(tmp_path / "sharegpt.json", raw=json.dumps(records, indent=2))
    first, second = load_chat_file(path)
    assert first.id == "a" and second.id == "2" and second.messages[0]["role"] == "user"


@pytest.mark.parametrize("line, words", [
    ("not json", ":2: this line is not valid JSON"),
    ("[1, 2]", ":2: expected a JSON object, got list"),
    ('{"text": "hi"}', ":2: needs exactly one of 'prompt'"),
    ('{"prompt": "a", "messages": []}', ":2: needs exactly one of 'prompt' (a string), 'messages' (OpenAI chat "
                                        "messages) or 'conversations' (ShareGPT turns), got prompt and messages"),
    ('{"prompt": "  "}', ":2: 'prompt' must be a non-empty string"),
    ('{"messages": []}', ":2: 'messages' must be a non-empty list"),
    ('{"messages": [{"role": "tool", "content": "x"}]}', ":2: messages[0] has role 'tool'"),
    ('{"messages": [{"role": "user", "content": 5}]}', ":2: messages[0] content must be a string or a list of"),
    ('{"messages": [{"role": "assistant", "content": "only me"}]}', ":2: 'messages' holds no user message"),
    ('{"conversations": [{"from": "robot", "value": "x"}]}', ":2: conversations[0] has from 'robot'"),
    ('{"prompt": "a", "id": true}', ":2: 'id' must be a non-empty string or an integer"),
    ('{"prompt": "a", "id": "1"}', "id '1' is used twice"),
])
def test_a_malformed_record_is_one_line_naming_the_line(tmp_path, line, words, capsys):
    path = write(tmp_path / "bad.jsonl", raw='{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(DFlash2Error) as caught:
        load_chat_file(path)
    message = str(caught.value)
    assert words in message and "\n" not in message and str(path) in message
    started = time.perf_counter()                                         # the command says it before loading
    assert regen.main(["--target", "no-such-target", "--prompts", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and time.perf_counter() - started < 5


def test_empty_and_missing_files_are_refused(tmp_path):
    with pytest.raises(DFlash2Error, match="holds no records"):
        load_chat_file(write(tmp_path / "empty.jsonl", raw="\n\n"))
    with pytest.raises(DFlash2Error, match="prompt file not found"):
        load_chat_file(tmp_path / "nowhere.jsonl")


def test_option_conflicts_are_one_line(tmp_path, capsys):
    path = write(tmp_path / "p.jsonl", {"prompt": "hi"})
    for argv, words in ((["--prompts", str(path), "--source", "chitchat"], "give --source or --prompts, not both"),
                        (["--num-prompts", "3", "--off-policy"], "--off-policy stores the answers of a --prompts FILE"),
                        ([], "--num-prompts is required with --source")):
        assert regen.main(["--out", str(tmp_path / "o"), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], (argv, err)
