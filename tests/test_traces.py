"""Trace readers: small hand-written files (incl. malformed rows) and the real public traces."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from simulator.errors import InputError
from simulator.traces import (
    read_azure,
    read_csv_trace,
    read_length_column,
    read_mooncake,
    read_trace,
)
from tests.paths import DATA

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.fixture(scope="module")
def data_dir() -> Path:
    """The shared read-only data directory; missing data is a failure, not a skip."""
    assert DATA.is_dir(), f"shared data not found at {DATA}"
    return DATA


def write(tmp_path: Path, name: str, text: str) -> Path:
    """Write ``text`` to ``tmp_path / name`` and return the path."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- Azure ---------------------------------------------------------------------------------


def test_azure_sample_parses_times_relative_to_first_row(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "a.csv",
        AZURE_HEADER + "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
        "2023-11-16 18:18:05,110,27\n",
    )
    w = read_azure(path)
    # By hand: 04.03196 - 03.97996 = 0.052 s; 18:18:05 - 18:17:03.97996 = 61.02004 s.
    np.testing.assert_allclose(w.arrival_s, [0.0, 0.052, 61.02004], atol=1e-9)
    assert w.prompt_len.tolist() == [4808, 3180, 110]
    assert w.output_len.tolist() == [10, 8, 27]
    assert w.arrival_s.dtype == np.float64 and w.prompt_len.dtype == np.int64
    assert w.notes == ()


def test_azure_timestamps_with_utc_offsets_are_compared_in_utc(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "tz.csv",
        AZURE_HEADER + "2023-11-16 18:17:03+01:00,1,1\n2023-11-16 17:17:04.5,2,2\n",
    )
    # 18:17:03 at UTC+1 is 17:17:03 UTC; the naive second row counts as UTC.
    np.testing.assert_allclose(read_azure(path).arrival_s, [0.0, 1.5])


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ("2023-11-16 18:17:05.0,abc,3", "ContextTokens: 'abc' is not a number"),
        ("2023-11-16 18:17:05.0,12,", "GeneratedTokens: missing value is not a number"),
        ("2023-11-16 18:17:05.0,12", "GeneratedTokens: missing value"),
        ("2023-11-16 25:17:05.0,12,3", "TIMESTAMP: '2023-11-16 25:17:05.0' is not a"),
        ("yesterday,12,3", "TIMESTAMP: 'yesterday'"),
        ("2023-11-16 18:17:05.0,-12,3", "ContextTokens: token count -12 is negative"),
        ("2023-11-16 18:17:05.0,12,3.5", "GeneratedTokens: token count 3.5 is not an integer"),
        ("2023-11-16 18:17:05.0,12,3,99", "malformed CSV row"),
    ],
)
def test_azure_malformed_row_names_file_and_line(tmp_path: Path, row: str, fragment: str) -> None:
    # Line 1 header, 2 good row, 3 blank (still counted, as an editor shows it), 4 the bad row.
    path = write(tmp_path, "bad.csv", AZURE_HEADER + "2023-11-16 18:17:03.0,5,5\n\n" + row + "\n")
    with pytest.raises(InputError) as err:
        read_azure(path)
    message = str(err.value)
    assert message.startswith(f"{path}:4: "), message
    assert fragment in message
    assert "\n" not in message


def test_azure_missing_column_points_at_header(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.0,5\n")
    with pytest.raises(InputError, match=r"a\.csv:1: missing column 'GeneratedTokens'"):
        read_azure(path)


def test_missing_empty_and_header_only_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.csv: file not found"):
        read_trace(tmp_path / "nope.csv", "azure")
    with pytest.raises(InputError, match=r"empty\.csv: empty file"):
        read_azure(write(tmp_path, "empty.csv", ""))
    with pytest.raises(InputError, match=r"head\.csv: no requests"):
        read_azure(write(tmp_path, "head.csv", AZURE_HEADER))


def test_zero_lengths_are_raised_to_one_and_noted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "z.csv",
        AZURE_HEADER + "2023-11-16 18:17:03.0,0,5\n"
        "2023-11-16 18:17:04.0,7,0\n"
        "2023-11-16 18:17:05.0,9,0\n",
    )
    w = read_azure(path)
    assert w.prompt_len.tolist() == [1, 7, 9]
    assert w.output_len.tolist() == [5, 1, 1]
    assert any("1 rows with prompt length 0 set to 1" in n for n in w.notes)
    assert any("2 rows with output length 0 set to 1" in n for n in w.notes)


def test_out_of_order_rows_are_sorted_stably_and_noted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "o.csv",
        AZURE_HEADER + "2023-11-16 18:17:05.0,1,1\n"
        "2023-11-16 18:17:03.0,2,2\n"
        "2023-11-16 18:17:05.0,3,3\n"
        "2023-11-16 18:17:04.0,4,4\n",
    )
    w = read_azure(path)
    # Sorted by time, ties (the two 05.0 rows) in file order; rebased to the earliest (03.0).
    assert w.prompt_len.tolist() == [2, 4, 1, 3]
    np.testing.assert_allclose(w.arrival_s, [0.0, 1.0, 2.0, 2.0])
    assert len(w.notes) == 1 and "2 rows arrive before the row above them" in w.notes[0]


# -- Mooncake ------------------------------------------------------------------------------


def test_mooncake_sample_converts_ms_and_ignores_extra_fields(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "m.jsonl",
        '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]}\n'
        "\n"
        '{"timestamp": 1500, "input_length": 10, "output_length": 3, "extra": "x"}\n'
        '{"timestamp": 2500.5, "input_length": 20, "output_length": 4}\n',
    )
    w = read_mooncake(path)
    np.testing.assert_allclose(w.arrival_s, [0.0, 1.5, 2.5005])
    assert w.prompt_len.tolist() == [6758, 10, 20]
    assert w.output_len.tolist() == [500, 3, 4]


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"timestamp": 5, "input_length": 10', "invalid JSON"),
        ('{"timestamp": 5, "input_length": 10}', "missing field 'output_length'"),
        ('{"timestamp": "5", "input_length": 10, "output_length": 1}', "'timestamp': '5' is not"),
        ('{"timestamp": 5, "input_length": true, "output_length": 1}', "True is not a number"),
        ('{"timestamp": 5, "input_length": 10, "output_length": -1}', "-1 is negative"),
        ('{"timestamp": 5, "input_length": 1.5, "output_length": 1}', "1.5 is not an integer"),
        ("[1, 2, 3]", "expected a JSON object, got list"),
    ],
)
def test_mooncake_malformed_line_names_file_and_line(
    tmp_path: Path, line: str, fragment: str
) -> None:
    good = '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
    path = write(tmp_path, "m.jsonl", good + "\n" + good + line + "\n" + good)
    with pytest.raises(InputError) as err:
        read_mooncake(path)
    assert str(err.value).startswith(f"{path}:4: "), str(err.value)
    assert fragment in str(err.value)


# -- plain CSV -----------------------------------------------------------------------------


def test_plain_csv_trace_rebases_to_first_arrival(tmp_path: Path) -> None:
    path = write(
        tmp_path, "p.csv", "arrival_s, prompt_len, output_len\n10.5,100,20\n11.0,50,1\n12,7,7\n"
    )
    w = read_trace(path, "csv")
    np.testing.assert_allclose(w.arrival_s, [0.0, 0.5, 1.5])
    assert w.prompt_len.tolist() == [100, 50, 7]
    assert w.output_len.tolist() == [20, 1, 7]


def test_plain_csv_bad_number_and_infinite_time(tmp_path: Path) -> None:
    header = "arrival_s,prompt_len,output_len\n"
    with pytest.raises(InputError, match=r"p\.csv:3: column arrival_s: 'inf' is not a number"):
        read_csv_trace(write(tmp_path, "p.csv", header + "0,1,1\ninf,1,1\n"))
    with pytest.raises(InputError, match=r"q\.csv:2: column prompt_len: 'NA' is not a number"):
        read_csv_trace(write(tmp_path, "q.csv", header + "0,NA,1\n"))


def test_unknown_format_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown trace format 'parquet'"):
        read_trace(tmp_path / "x", "parquet")  # type: ignore[arg-type]


def test_length_column_reads_one_column_and_counts_zeros(tmp_path: Path) -> None:
    path = write(tmp_path, "l.csv", "a,b\n3,x\n0,y\n5,z\n")
    values, zeros = read_length_column(path, "a")
    assert values.tolist() == [3, 1, 5] and zeros == 1
    with pytest.raises(InputError, match=r"l\.csv:1: missing column 'c' \(header has: a, b\)"):
        read_length_column(path, "c")


# -- the real public traces ----------------------------------------------------------------

REAL = [
    # file, format, rows (SOURCES.txt), prompt median, output median (SOURCES.txt)
    ("azure2023_code.csv", "azure", 8819, 1469, 13),
    ("azure2023_conv.csv", "azure", 19366, 1020, 129),
]


@pytest.mark.parametrize(("name", "fmt", "rows", "prompt_median", "output_median"), REAL)
def test_real_azure_traces(
    data_dir: Path, name: str, fmt: str, rows: int, prompt_median: int, output_median: int
) -> None:
    start = time.perf_counter()
    w = read_trace(data_dir / name, fmt)  # type: ignore[arg-type]
    assert time.perf_counter() - start < 1.0
    assert len(w) == rows
    assert w.arrival_s[0] == 0.0 and (np.diff(w.arrival_s) >= 0).all()
    # Both traces cover just under an hour (SOURCES.txt: 18:17-19:14 and 18:15-19:14).
    assert 3300 < w.arrival_s[-1] < 3600
    assert np.median(w.prompt_len) == prompt_median
    assert np.median(w.output_len) == output_median


def test_real_mooncake_trace(data_dir: Path) -> None:
    start = time.perf_counter()
    w = read_trace(data_dir / "mooncake_fast25_conversation_trace.jsonl", "mooncake")
    assert time.perf_counter() - start < 1.0
    assert len(w) == 12031
    assert w.arrival_s[0] == 0.0 and (np.diff(w.arrival_s) >= 0).all()
    assert w.arrival_s[-1] == pytest.approx(3536.999)  # SOURCES.txt: timestamps 0..3536999 ms
    assert w.prompt_len.mean() == pytest.approx(12035, rel=0.001)
    assert w.output_len.mean() == pytest.approx(343, rel=0.01)


def test_real_sharegpt_length_columns(data_dir: Path) -> None:
    path = data_dir / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
    prefill, zeros = read_length_column(path, "num_prefill_tokens")
    decode, _ = read_length_column(path, "num_decode_tokens")
    assert len(prefill) == len(decode) == 30731 and zeros == 0
    assert prefill.mean() == pytest.approx(2340, rel=0.001) and prefill.max() == 8141
    assert decode.mean() == pytest.approx(439, rel=0.002) and decode.max() == 1024
