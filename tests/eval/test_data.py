"""Window construction (pure), lengths, and loading texts through `datasets` from local files."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path

import pytest

from hf_posenc.eval.data import PROTOCOLS, TextSource, build_windows, load_texts, parse_length, parse_lengths

DOC_LENGTHS = [5, 37, 100, 64, 1, 129]
CASES = [
    (protocol, length, bos, stride)
    for protocol, length, bos, stride in itertools.product(PROTOCOLS, (8, 17, 64), (False, True), (None, 3, 8))
    if protocol == "sliding" or stride is None  # a stride is an error elsewhere (tested below)
]


def _scored_positions(plan):
    return [(w.doc, p) for w in plan.windows for p in range(w.score_from, w.end)]


@pytest.mark.parametrize(("protocol", "length", "bos", "stride"), CASES)
def test_windows_score_each_token_at_most_once_with_only_past_context(protocol, length, bos, stride):
    span = length - bos
    if protocol == "sliding" and stride is not None and stride > span:
        with pytest.raises(ValueError, match="must be between 1 and the window's"):
            build_windows(DOC_LENGTHS, length, protocol, bos=bos, stride=stride)
        return
    plan = build_windows(DOC_LENGTHS, length, protocol, bos=bos, stride=stride)
    scored = _scored_positions(plan)
    assert len(scored) == len(set(scored)), "a token is scored twice"
    for w in plan.windows:
        assert 0 <= w.start <= w.score_from < w.end <= DOC_LENGTHS[w.doc]
        assert w.end - w.start + bos <= length  # the model reads at most `length` positions
        assert bos or w.score_from > w.start  # without BOS, the first token of a span is context only
        assert DOC_LENGTHS[w.doc] >= span
    assert plan.skipped_documents == sum(n < span for n in DOC_LENGTHS)


@pytest.mark.parametrize(("length", "bos", "stride"), [(8, False, 3), (17, True, 8), (64, False, None), (9, False, 8)])
def test_sliding_scores_every_token_with_at_least_length_minus_stride_context(length, bos, stride):
    plan = build_windows(DOC_LENGTHS, length, "sliding", bos=bos, stride=stride)
    stride = stride or length // 2
    span = length - bos
    expected = {(d, p) for d, n in enumerate(DOC_LENGTHS) if n >= span for p in range(0 if bos else 1, n)}
    assert set(_scored_positions(plan)) == expected
    for w in plan.windows:
        if w.start > 0:
            assert w.score_from - w.start >= span - stride


def test_disjoint_and_truncate_spans():
    disjoint = build_windows([20, 7], 8, "disjoint", bos=False)
    assert [(w.doc, w.start, w.end, w.score_from) for w in disjoint.windows] == [(0, 0, 8, 1), (0, 8, 16, 9)]
    assert (disjoint.skipped_documents, disjoint.dropped_tokens) == (1, 4)
    truncate = build_windows([20, 9, 3], 8, "truncate", bos=True)
    assert [(w.doc, w.start, w.end, w.score_from) for w in truncate.windows] == [(0, 0, 7, 0), (1, 0, 7, 0)]
    assert truncate.skipped_documents == 1
    assert len(build_windows([100, 100], 8, "disjoint", bos=False, max_windows=3).windows) == 3


@pytest.mark.parametrize(
    ("protocol", "length", "expected"),
    [
        ("truncate", 16, (2, 0, 2, (300 - 16) + (90 - 16))),  # documents 0 and 1; 2 and 3 never reached
        ("truncate", 171, (2, 2, 2, (300 - 171) + 0)),  # 90 and 20 skipped, then 171 reached
        ("disjoint", 64, (2, 0, 1, 300 - 2 * 64)),  # both windows from document 0, its 2 others cut
        ("sliding", 200, (1, 0, 1, 300 - 200)),  # document 0's first window
    ],
)
def test_max_windows_counts_only_the_documents_it_reached(protocol, length, expected):
    """Documents scored, skipped (shorter than a span, before the cap) and tokens of scored documents left out:
    a capped run reported every document after the one reaching the cap as scored, and for disjoint windows left
    the cut windows' tokens uncounted."""
    cap = 1 if protocol == "sliding" else 2
    plan = build_windows([300, 90, 20, 171], length, protocol, bos=False, max_windows=cap)
    assert (len(plan.windows), plan.skipped_documents, plan.documents, plan.dropped_tokens) == expected


@pytest.mark.parametrize("protocol", ["disjoint", "truncate"])
def test_a_stride_is_an_error_outside_sliding(protocol):
    with pytest.raises(ValueError, match=f"`stride` applies to `protocol` sliding; `protocol` {protocol} does not"):
        build_windows(DOC_LENGTHS, 8, protocol, bos=False, stride=4)


def test_length_longer_than_every_document_is_an_error():
    with pytest.raises(ValueError, match=r"longer than every document \(the longest has 129 tokens\)") as error:
        build_windows(DOC_LENGTHS, 1024, "truncate", bos=False)
    assert "`join`" not in str(error.value)  # the 336 tokens together are too few as well


@pytest.mark.parametrize(("doc_lengths", "suggested"), [([100, 129, 107], True), ([129], False), ([100, 29], False)])
def test_join_is_suggested_only_where_joining_makes_a_window_fit(doc_lengths, suggested):
    with pytest.raises(ValueError, match="longer than every document") as error:
        build_windows(doc_lengths, 300, "truncate", bos=False)
    assert ("`join` to evaluate the documents as one stream (336 tokens together)" in str(error.value)) == suggested


@pytest.mark.parametrize(("text", "expected"), [("512", 512), ("4k", 4096), (" 16K ", 16384)])
def test_parse_length(text, expected):
    assert parse_length(text) == expected


@pytest.mark.parametrize("text", ["", "4x", "-1", "0", "1.5k", "k", "four"])
def test_parse_length_rejects(text):
    with pytest.raises(ValueError, match="not a positive number of tokens"):
        parse_length(text)


def test_parse_length_refuses_more_than_any_window():
    assert parse_length("16384k") == 2**24
    with pytest.raises(ValueError, match=r"'16385k' is more than 16384k tokens"):
        parse_length("16385k")
    with pytest.raises(ValueError, match=r"'100000000000000000000' is more than 16384k tokens"):
        parse_length("100000000000000000000")


def test_parse_lengths_sorted_unique():
    assert parse_lengths("8k,2k,2048,4k") == [2048, 4096, 8192]


def test_load_local_txt_folder_jsonl_and_join(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.txt").write_text("second\nline two")
    (tmp_path / "docs" / "a.txt").write_text("first")
    assert load_texts(TextSource(str(tmp_path / "docs"))) == ["first", "second\nline two"]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps({"body": t}) for t in ["x", "y", "z"]))
    assert load_texts(TextSource(str(jsonl), text_column="body", max_documents=2, join="|")) == ["x|y"]
    with pytest.raises(ValueError, match=r"no column 'text'; its columns are \['body'\]"):
        load_texts(TextSource(str(jsonl)))


def test_unknown_hub_dataset_is_a_clear_error(monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="Cannot load dataset 'no-such-user/no-such-dataset'"):
        load_texts(TextSource("no-such-user/no-such-dataset"))


@pytest.mark.parametrize("name", ["./nope.txt", "/no/such/folder", "~/nope.jsonl", "a/b/c"])
def test_a_path_to_nothing_is_said_so_not_taken_for_a_hub_id(name):
    """A mistyped local file is said to be missing; datasets' "Repo id must use alphanumeric chars ..." does not
    lead the message."""
    with pytest.raises(
        ValueError,
        match=rf"^Cannot load dataset '{re.escape(name)}': no such file or folder \(a path, not a Hub id\)\.$",
    ):
        load_texts(TextSource(name))


def test_streaming_reads_only_the_first_documents_and_checks_the_column(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"body": str(i)}) for i in range(100)))
    assert load_texts(TextSource(str(path), text_column="body", streaming=True, max_documents=3)) == ["0", "1", "2"]
    with pytest.raises(ValueError, match=r"no column 'text'; its columns are \['body'\]"):
        load_texts(TextSource(str(path), streaming=True))


def test_a_column_that_is_not_text_is_a_clear_error(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "body": "x"}) for i in range(3)))
    with pytest.raises(
        ValueError, match=r"Column 'id' .* holds int values, not text; its columns are \['id', 'body'\]"
    ):
        load_texts(TextSource(str(path), text_column="id"))


def test_the_split_recorded_is_the_split_read(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    assert TextSource(str(tmp_path)).describe()["split"] == "train"  # how `datasets` names local files
    assert TextSource(str(tmp_path), split="train").describe()["split"] == "train"
    assert load_texts(TextSource(str(tmp_path), split="train")) == ["x"]
    assert TextSource("user/hub-dataset").describe()["split"] == "test"
    assert TextSource("user/hub-dataset", split="validation").describe()["split"] == "validation"


@pytest.mark.parametrize("given", [{"split": "test"}, {"config": "wikitext-103-raw-v1"}])
def test_a_split_or_config_for_local_files_is_an_error(tmp_path, given):
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(ValueError, match=r"local: its files are read whole, so `config` and `split`"):
        load_texts(TextSource(str(tmp_path), **given))


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
BAD_FILES = [
    ("binary", "txt", PNG, r"b.txt is not UTF-8 text \(byte 0x89 at offset 0\); save it as UTF-8\.$"),
    ("latin-1", "jsonl", b'{"text": "a"}\n{"text": "caf\xe9"}\n', r"b.jsonl is not UTF-8 text \(byte 0xe9 at offset 27\)"),
    ("NUL bytes", "txt", "ab".encode("utf-16-le"), r"b.txt holds a NUL byte at offset 1: a binary file, or UTF-16 or UTF-32 text"),
    ("bad line", "jsonl", b'{"text": "a"}\n{"text": \n', r"b.jsonl is not JSON: line 2, column 10: Expecting value\.$"),
    ("bad document", "json", b'{\n  "text": ["a", \n', r"b.json is not JSON: line 3, column 1: Expecting value\.$"),
    ("lines of strings", "jsonl", b'"a"\n"b"\n', r"b.jsonl holds a JSON string \(line 1\) where the datasets library reads one object per document\.$"),
    ("a number", "json", b"42", r"b.json holds a JSON number \(the whole file\) where the datasets library reads one object"),
    ("not parquet", "parquet", PNG, r"b.parquet is not a Parquet file \(Parquet magic bytes not found in footer"),
    ("empty text", "txt", b"", r"b.txt is empty; remove it or point at other files\.$"),
    ("empty parquet", "parquet", b"", r"b.parquet is empty"),
    ("nested too deep", "jsonl", b'{"text": ' + b"[" * 10_000 + b"]" * 10_000 + b"}\n", r"b.jsonl holds JSON nested deeper than 256 levels: not rows of documents\.$"),  # Arrow would crash the process
]  # fmt: skip


def _good_file(path):
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": ["a"]}), path)
    else:
        path.write_text("a" if path.suffix == ".txt" else json.dumps({"text": "a"}))


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streaming"])
@pytest.mark.parametrize(("case", "suffix", "data", "message"), BAD_FILES, ids=[case[0] for case in BAD_FILES])
def test_a_bad_local_file_is_a_one_line_error_naming_it(tmp_path, case, suffix, data, message, streaming):
    """Alone or beside a good file, the bad file is named with what is wrong (not in `datasets`'
    traceback, nor read as an empty document); the files stay as they were."""
    bad = tmp_path / "docs" / f"b.{suffix}"
    bad.parent.mkdir()
    bad.write_bytes(data)
    _good_file(tmp_path / "docs" / f"a.{suffix}")
    for target in (bad, bad.parent):
        with pytest.raises(ValueError, match=f"^{re.escape(str(bad.parent))}/{message}") as error:
            load_texts(TextSource(str(target), streaming=streaming))
        assert "\n" not in str(error.value)
    assert bad.read_bytes() == data


def test_what_the_reader_refuses_in_a_file_that_is_json_all_the_same_is_one_line(tmp_path):
    """Python reads 1e400 as inf; Arrow refuses it. Without a file to blame, the reader's reason is given."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b", "n": 1e400}\n')
    expected = re.escape(f"The datasets library cannot read {path} as json files: JSON parse error: ")
    for streaming in (False, True):
        with pytest.raises(ValueError, match=f"^{expected}[^\n]+$"):  # Arrow's words for it, one line
            load_texts(TextSource(str(path), streaming=streaming))


def test_a_json_file_of_blank_lines_is_named(tmp_path):
    """Named, not left to `datasets`' 'Instruction "train" corresponds to no data!' (read whole)."""
    path = tmp_path / "d.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} holds no JSON objects\.$"):
        load_texts(TextSource(str(path)))


def test_a_file_of_another_type_or_a_folder_without_one_is_named(tmp_path):
    (tmp_path / "d.csv").write_text("text\na\n")
    with pytest.raises(ValueError, match=r"d.csv is not a .txt, .jsonl, .json, .parquet file; give one of those"):
        load_texts(TextSource(str(tmp_path / "d.csv")))
    with pytest.raises(
        ValueError,
        match=rf"^{re.escape(str(tmp_path))} holds no readable files; expected .txt, .jsonl, .json, .parquet",
    ):
        load_texts(TextSource(str(tmp_path)))


def test_reading_local_files_does_not_say_downloading(tmp_path, capfd):
    """datasets names its bar over data files "Downloading data", local ones too: an offline run would say it
    downloads."""
    for i in range(20):  # datasets draws one bar over 16 files or more
        (tmp_path / f"{i:02}.txt").write_text(f"document {i}")
    texts = load_texts(TextSource(str(tmp_path)))
    assert texts == [f"document {i}" for i in range(20)]
    assert "Downloading" not in capfd.readouterr().err


def test_texts_in_memory_read_as_the_same_texts_from_a_file(tmp_path):
    documents = ["first essay", "second, longer essay", "third"]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in documents))
    for options in ({}, {"max_documents": 2}, {"join": "\n\n"}, {"max_documents": 2, "join": " | "}):
        from_file = load_texts(TextSource(str(tmp_path / "docs.jsonl"), **options))
        assert load_texts(TextSource.from_texts(documents, **options)) == from_file


def test_texts_in_memory_are_recorded_by_count_and_digest_never_as_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts").mkdir()  # a folder named as the texts are: not read
    source = TextSource.from_texts(["a", "b"])
    assert source.local is None and source.label == "texts" and source.read_split is None
    described = source.describe()
    one = (1).to_bytes(8, "little")
    assert described["texts"] == 2 and described["sha256"] == hashlib.sha256(one + b"a" + one + b"b").hexdigest()
    assert TextSource.from_texts(["a", "c"]).describe()["sha256"] != described["sha256"]  # a resume sees the change
    assert TextSource.from_texts(["a\0", "b"]).describe() != TextSource.from_texts(["a", "\0b"]).describe()
    assert load_texts(source) == ["a", "b"]


@pytest.mark.parametrize(
    ("texts", "message"),
    [([], "holds no documents"), ("one string", "a list of strings"), (["ok", 3], "a list of strings")],
)
def test_texts_in_memory_that_are_not_documents_are_refused(texts, message):
    with pytest.raises(ValueError, match=message):
        TextSource.from_texts(texts)


@pytest.mark.parametrize("given", [Path("essays.txt"), None, 5])
def test_a_path_or_no_list_given_as_texts_is_sent_to_textsource(given):
    with pytest.raises(ValueError, match=r"a list of strings, one per document, got .*TextSource\(path\)"):
        TextSource.from_texts(given)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_documents": 0}, "`max_documents` must be a whole number >= 1"),
        ({"max_documents": -1}, "`max_documents` must be a whole number >= 1"),
        ({"split": "test", "texts": ["a"]}, "`split` reads a dataset"),
        ({"text_column": "body", "texts": ["a"]}, "`text_column` reads a dataset"),
        ({"texts": ["a", 3]}, "a list of strings"),
        ({"texts": []}, "holds no documents"),
    ],
)
def test_settings_that_cannot_apply_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        TextSource("texts", **options)
    assert hash(TextSource("texts", texts=["a"])) == hash(TextSource("texts", texts=("a",)))
