"""A local lm-eval task folder for the lm-eval tests: two tiny tasks on local JSONL files, nothing downloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path

TASKS = ("tiny_ppl", "tiny_choice")

PPL_TASK = """\
task: tiny_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false
  - metric: bits_per_byte
    aggregation: bits_per_byte
    higher_is_better: false
metadata:
  version: 1.0
"""
CHOICE_TASK = """\
task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
GENERATE_TASK = """\
task: tiny_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["."]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def write_tasks(folder: Path) -> Path:
    """``folder`` with the task YAMLs and their data: 4 documents of 90-200 characters (past the tiny model's 64
    trained positions: one token a character) to score as a rolling loglikelihood, 6 three-way choices, and 4
    prompts of 80-150 characters to continue greedily (``tiny_generate``, generation as RULER and NIAH score it)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 6))) for _ in range(200)]
    documents = [" ".join(rng.sample(words, n)) for n in (20, 35, 25, 40)]
    choices = [
        {"question": f"{rng.choice(words)} {rng.choice(words)} is", "choices": rng.sample(words, 3)} for _ in range(6)
    ]
    _write_jsonl(folder / "ppl.jsonl", [{"text": text} for text in documents])
    _write_jsonl(folder / "choice.jsonl", [{**c, "answer": i % 3} for i, c in enumerate(choices)])
    (folder / "tiny_ppl.yaml").write_text(PPL_TASK.format(data=folder / "ppl.jsonl"))
    (folder / "tiny_choice.yaml").write_text(CHOICE_TASK.format(data=folder / "choice.jsonl"))
    prompts = [" ".join(rng.sample(words, n)) for n in (15, 20, 25, 30)]
    _write_jsonl(folder / "generate.jsonl", [{"prompt": p, "answer": " " + p.split()[0]} for p in prompts])
    (folder / "tiny_generate.yaml").write_text(GENERATE_TASK.format(data=folder / "generate.jsonl"))
    return folder


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
