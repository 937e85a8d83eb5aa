from __future__ import annotations

import json

import pytest

from rstar2.data import (
    BUILTIN_DATASETS,
    DataError,
    Decontaminator,
    benchmark_decontaminator,
    load_rows,
    prepare_dataset,
    read_rows,
)
from rstar2.data.sources import builtin_records
from tests.conftest import run_cli

EXPECTED_ROWS = {"aime24": 30, "aime25": 30, "hmmt25": 30, "math500": 500, "dapo17k": 14048}


def _public_port_rows(n: int = 3) -> list[dict]:
    """Rows shaped exactly as the public rStar2-Agent preprocessing scripts write them."""
    rows = []
    for idx in range(n):
        q, a = f"What is {idx} + 2?", str(idx + 2)
        rows.append(
            {
                "data_source": "rstar_open-r1/DAPO-Math-17k-Processed",
                "agent_name": "rstar2_agent",
                "prompt": [{"role": "user", "content": q}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": a},
                "extra_info": {
                    "split": "train",
                    "index": idx,
                    "answer": a,
                    "question": q,
                    "need_tools_kwargs": False,
                    "interaction_kwargs": {"query": q, "ground_truth": a},
                },
                "solution": a,  # the port keeps unused source columns
            }
        )
    return rows


@pytest.mark.parametrize("name", sorted(EXPECTED_ROWS))
def test_prepare_builtin_round_trips(tmp_path, name):
    result = prepare_dataset(name, tmp_path, progress=False)
    assert result.num_rows == EXPECTED_ROWS[name] == BUILTIN_DATASETS[name].num_rows
    back = read_rows(result.path)
    assert back == load_rows(name).rows
    first = back[0]
    assert first["data_source"].startswith("rstar_") and first["agent_name"] == "rstar2_agent"
    assert first["prompt"][0]["role"] == "user" and first["ability"] == "math"
    raw = next(builtin_records(name))
    assert first["prompt"][0]["content"] == raw["problem"]
    assert first["reward_model"] == {"style": "rule", "ground_truth": raw["answer"]}
    assert first["extra_info"]["index"] == 0 and first["extra_info"]["id"] == raw["id"]


def test_public_rstar2_parquet_loads_unchanged(tmp_path):
    import datasets

    rows = _public_port_rows()
    src = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(src))
    assert load_rows(str(src)).rows == rows
    out = prepare_dataset(str(src), tmp_path / "out", progress=False)
    assert read_rows(out.path) == rows


def test_local_jsonl_with_question_keys(tmp_path):
    src = tmp_path / "mine.jsonl"
    src.write_text(
        "\n".join(json.dumps({"question": f"q{i}", "final_answer": i}) for i in range(4))
    )
    rows = load_rows(str(src)).rows
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["0", "1", "2", "3"]
    assert rows[2]["prompt"] == [{"role": "user", "content": "q2"}]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"problem": "p", "answer": "1"}\n{not json}\n', "line 2"),
        ('{"problem": "p"}\n', "row 1: no answer"),
        ('["a list"]\n', "line 1: not a JSON object"),
    ],
)
def test_bad_local_files_name_the_place(tmp_path, content, needle):
    src = tmp_path / "bad.jsonl"
    src.write_text(content)
    with pytest.raises(DataError, match=needle):
        load_rows(str(src))


def test_unknown_dataset_is_a_data_error():
    with pytest.raises(DataError, match="unknown dataset"):
        load_rows("no-such-set")


def test_cli_prepare_and_errors(tmp_path):
    proc = run_cli(
        "data",
        "prepare",
        "--dataset",
        "aime25",
        "--dataset",
        "hmmt25",
        "--out",
        str(tmp_path),
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    assert len(read_rows(tmp_path / "hmmt25.parquet")) == 30
    bad = run_cli("data", "prepare", "--dataset", "nope", "--out", str(tmp_path))
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "unknown dataset 'nope'" in bad.stderr


def test_decontamination_flags_near_copies_not_boilerplate():
    aime = [r["problem"] for r in builtin_records("aime24")]
    deco = Decontaminator(aime)
    assert deco.is_contaminated(aime[0])
    assert deco.is_contaminated(aime[3].replace("Find", "Determine"))
    boilerplate = (
        "A fair coin is tossed until two heads appear. The probability is m/n, "
        "where m and n are relatively prime positive integers. Find m+n."
    )
    assert not deco.is_contaminated(boilerplate)


def test_decontaminating_dapo_drops_few_and_keeps_the_rest(tmp_path):
    result = prepare_dataset(
        "dapo17k", tmp_path, decontaminator=benchmark_decontaminator(), progress=False
    )
    assert 0 < result.num_contaminated < 0.01 * EXPECTED_ROWS["dapo17k"]
    assert result.num_rows + result.num_contaminated == EXPECTED_ROWS["dapo17k"]


def test_hub_ids_fail_cleanly_offline(tmp_path):
    proc = run_cli(
        "data",
        "prepare",
        "--dataset",
        "hf:org/none",
        "--out",
        str(tmp_path),
        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("rstar2: data error: could not load hf:org/none")
    assert proc.stderr.count("\n") == 1
