"""MetaMathQA JSONL reading: file:line errors, skipping bad lines with a count, empty files."""

import json

import pytest

from lazytrain_jax.data import DataError, Example, read_jsonl, write_jsonl


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_round_trip_and_blank_lines(tmp_path):
    rows = [Example("What is 1 + 2?", "The answer is: 3", "x"), Example("Q2", "The answer is: 4")]
    write_jsonl(tmp_path / "a.jsonl", rows)
    text = (tmp_path / "a.jsonl").read_text()
    (tmp_path / "b.jsonl").write_text("\n" + text + "\n\n")
    data = read_jsonl(tmp_path / "b.jsonl")
    assert data.examples == tuple(rows) and data.num_skipped == 0


@pytest.mark.parametrize("bad, what", [
    ('{"query": "q", "response": ', "not valid JSON"),
    ('["q", "r"]', "expected a JSON object"),
    ('{"query": "q"}', "missing key 'response'"),
    ('{"query": "q", "response": 3}', "'response' must be a non-empty string"),
    ('{"query": "q", "response": "r", "type": 1}', "'type' must be a string"),
])
def test_bad_line_names_file_and_line(tmp_path, bad, what):
    good = json.dumps({"query": "q", "response": "The answer is: 1"})
    path = _write(tmp_path / "d.jsonl", [good, good, bad, good])
    with pytest.raises(DataError) as e:
        read_jsonl(path)
    assert f"{path}:3:" in str(e.value) and what in str(e.value) and "skip_bad_lines" in str(e.value)
    data = read_jsonl(path, skip_bad_lines=True)
    assert len(data.examples) == 3 and data.num_skipped == 1


def test_empty_and_missing(tmp_path):
    with pytest.raises(DataError, match="empty"):
        read_jsonl(_write(tmp_path / "e.jsonl", ["", " "]))
    with pytest.raises(DataError, match=r"empty \(2 bad lines skipped\)"):
        read_jsonl(_write(tmp_path / "f.jsonl", ["{", "x"]), skip_bad_lines=True)
    with pytest.raises(DataError, match="does not exist"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_a_byte_order_mark_is_read_and_a_line_not_utf8_is_a_bad_line(tmp_path):
    good = json.dumps({"query": "q", "response": "The answer is: 1"}).encode()
    # a file saved with a UTF-8 byte order mark (as editors on Windows write it), CRLF line ends
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + good + b"\r\n" + good + b"\r\n")
    assert len(read_jsonl(tmp_path / "bom.jsonl").examples) == 2
    (tmp_path / "cr.jsonl").write_bytes(good + b"\r" + good + b"\r")   # bare CR line ends
    assert len(read_jsonl(tmp_path / "cr.jsonl").examples) == 2
    # bytes that are not UTF-8 on line 2: named like any bad line, and skippable
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(good + b"\n" + '{"query": "caf\u00e9", "response": "r"}'.encode("latin-1") + b"\n" + good + b"\n")
    with pytest.raises(DataError, match=rf"^{path}:2: not valid UTF-8 \(byte 0xe9 at byte 15 of the line\)"):
        read_jsonl(path)
    data = read_jsonl(path, skip_bad_lines=True)
    assert len(data.examples) == 2 and data.num_skipped == 1
