"""Trace readers: small hand-written files (incl. malformed rows) and the real public traces."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from simulator.errors import InputError
from simulator.workload.traces import (
    MAX_TOKENS,
    read_azure,
    read_csv_trace,
    read_length_column,
    read_mooncake,
    read_trace,
)
from tests.paths import DATA, DataFolder

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
CSV_HEADER = "arrival_s,prompt_len,output_len\n"


@pytest.fixture(scope="module")
def data_dir() -> DataFolder:
    """The real data files (a missing one fails its reader's test, never skips it)."""
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


@pytest.mark.filterwarnings("error")
def test_azure_timestamps_centuries_apart_keep_their_span(tmp_path: Path) -> None:
    # 1500 is outside datetime64[ns] (1677..2262), so pandas parses in microseconds; a cast
    # to nanoseconds used to wrap around silently.
    path = write(tmp_path, "c.csv", AZURE_HEADER + "1500-01-01 00:00:00,1,1\n2200-01-01,2,2\n")
    span = (datetime(2200, 1, 1) - datetime(1500, 1, 1)).total_seconds()
    assert read_azure(path).arrival_s.tolist() == [0.0, span]


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
        ("2023-11-16 18:17:05.0,12,3,99", "malformed CSV row (3 fields expected, 4 found)"),
        ("2023-11-16 18:17:05.0,12,3,", "malformed CSV row (3 fields expected, 4 found)"),
        (
            "2023-11-16 18:17:05.0,12,99999999999999999999",
            "GeneratedTokens: 99999999999999999999 is out of range",
        ),
        ("2023-11-16 18:17:05.0,True,3", "ContextTokens: 'True' is not a number"),
        (",,", "TIMESTAMP: missing value is not a"),
    ],
)
@pytest.mark.filterwarnings("error")  # no numpy RuntimeWarning either
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
        (
            '{"timestamp": 5, "input_length": 1e30, "output_length": 1}',
            "field 'input_length': 1e+30 is out of range (token counts are at most 2147483647)",
        ),
        (
            '{"timestamp": 5, "input_length": 1, "output_length": 100000000000000000000}',
            "field 'output_length': 100000000000000000000 is out of range",
        ),
        (
            '{"timestamp": 5, "input_length": 1' + "0" * 400 + ', "output_length": 1}',
            "field 'input_length': 1" + "0" * 400 + " is out of range",
        ),
        (
            '{"timestamp": 1e300, "input_length": 1, "output_length": 1}',
            "field 'timestamp': 1e+300 ms is out of range",
        ),
        (
            '{"timestamp": 5, "input_length": 7, "output_length": 1, "input_length": 10}',
            "key 'input_length' appears more than once",
        ),
        ("[" * 100_000, "invalid JSON"),
    ],
)
@pytest.mark.filterwarnings("error")
def test_mooncake_malformed_line_names_file_and_line(
    tmp_path: Path, line: str, fragment: str
) -> None:
    good = '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
    path = write(tmp_path, "m.jsonl", good + "\n" + good + line + "\n" + good)
    with pytest.raises(InputError) as err:
        read_mooncake(path)
    assert str(err.value).startswith(f"{path}:4: "), str(err.value)
    assert fragment in str(err.value)


def test_mooncake_accepts_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf"
        b'{"timestamp": 0, "input_length": 5, "output_length": 6}\r\n'
        b"\r\n"
        b'{"timestamp": 2000, "input_length": 7, "output_length": 8}\r\n'
    )
    w = read_mooncake(path)
    assert w.arrival_s.tolist() == [0.0, 2.0]
    assert w.prompt_len.tolist() == [5, 7] and w.output_len.tolist() == [6, 8]


def test_mooncake_not_utf8_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"timestamp": 0, "input_length": 5, "output_length": 6, "x": "\xff"}\n')
    with pytest.raises(InputError, match=r"m\.jsonl: not a UTF-8 text file"):
        read_mooncake(path)


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


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ("1,10,20,30", "malformed CSV row (3 fields expected, 4 found)"),
        ("1,10,20,", "malformed CSV row (3 fields expected, 4 found)"),
        (
            "1,99999999999999999999,21",
            "column prompt_len: 99999999999999999999 is out of range "
            "(token counts are at most 2147483647)",
        ),
        (f"1,10,{MAX_TOKENS + 1}", f"column output_len: {MAX_TOKENS + 1} is out of range"),
        ("1,1e400,21", "column prompt_len: '1e400' is out of range"),
        ("1,-99999999999999999999,21", "prompt_len: token count -99999999999999999999 is negative"),
        ("1e300,10,20", "column arrival_s: 1e300 is out of range (arrival times must be within"),
        ("-1e13,10,20", "column arrival_s: -1e13 is out of range"),
        ("1,10.5,20", "column prompt_len: token count 10.5 is not an integer"),
        ("1,True,20", "column prompt_len: 'True' is not a number"),
        ("1,0x10,20", "column prompt_len: '0x10' is not a number"),
        ('1,"",20', "column prompt_len: missing value is not a number"),
        (",,", "column arrival_s: missing value is not a number"),
        ("nan,10,20", "column arrival_s: 'nan' is not a number"),
    ],
)
@pytest.mark.filterwarnings("error")  # no numpy RuntimeWarning either
def test_plain_csv_malformed_row_names_file_and_line(
    tmp_path: Path, row: str, fragment: str
) -> None:
    path = write(tmp_path, "bad.csv", CSV_HEADER + "0,5,5\n\n" + row + "\n")
    with pytest.raises(InputError) as err:
        read_csv_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}:4: "), message
    assert fragment in message
    assert "\n" not in message


@pytest.mark.filterwarnings("error")
def test_plain_csv_largest_values_are_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", CSV_HEADER + f"-1e12,{MAX_TOKENS},1e3\n1e12,1,1\n")
    w = read_csv_trace(path)
    assert w.arrival_s.tolist() == [0.0, 2e12]
    assert w.prompt_len.tolist() == [MAX_TOKENS, 1] and w.output_len.tolist() == [1000, 1]


@pytest.mark.parametrize(
    ("name", "text", "read", "expected"),
    [
        (
            "x.csv",
            CSV_HEADER + "0,10,20,30\n1,11,21,31\n",
            read_csv_trace,
            "malformed CSV row (3 fields expected, 4 found)",
        ),
        (
            "a.csv",
            AZURE_HEADER + "2023-11-16 18:17:03.0,10,20,30\n2023-11-16 18:17:04.0,11,21,31\n",
            read_azure,
            "malformed CSV row (3 fields expected, 4 found)",
        ),
        (
            "l.csv",
            "a,b\n1,2,3\n",
            lambda path: read_length_column(path, "a"),
            "malformed CSV row (2 fields expected, 3 found)",
        ),
    ],
)
def test_first_row_longer_than_header_is_an_error_not_a_column_shift(
    tmp_path: Path, name: str, text: str, read: Callable[[Path], object], expected: str
) -> None:
    # pandas would take the first field as the row index and shift every column by one.
    path = write(tmp_path, name, text)
    with pytest.raises(InputError) as err:
        read(path)
    assert str(err.value) == f"{path}:2: {expected}"


def test_trailing_comma_in_header_and_rows_is_an_ignored_empty_column(tmp_path: Path) -> None:
    w = read_csv_trace(write(tmp_path, "p.csv", "arrival_s,prompt_len,output_len,\n0,5,6,\n"))
    assert w.prompt_len.tolist() == [5] and w.output_len.tolist() == [6]


def test_bom_crlf_and_cr_line_endings_are_accepted(tmp_path: Path) -> None:
    rows = ["arrival_s,prompt_len,output_len", "0,5,6", "", "2,7,8"]
    for newline in ("\r\n", "\r"):
        path = tmp_path / "p.csv"
        path.write_bytes(b"\xef\xbb\xbf" + newline.join(rows).encode() + newline.encode())
        w = read_csv_trace(path)
        assert w.arrival_s.tolist() == [0.0, 2.0]
        assert w.prompt_len.tolist() == [5, 7] and w.output_len.tolist() == [6, 8]
        # line numbers still count physical lines: the bad value sits on line 5
        path.write_bytes(newline.join([*rows, "3,x,1"]).encode())
        with pytest.raises(InputError, match=r"p\.csv:5: column prompt_len: 'x' is not"):
            read_csv_trace(path)
    azure = tmp_path / "a.csv"
    azure.write_bytes(b"\xef\xbb\xbf" + AZURE_HEADER.encode() + b"2023-11-16 18:17:03.5,5,6\r\n")
    assert read_azure(azure).prompt_len.tolist() == [5]
    lengths = tmp_path / "l.csv"
    lengths.write_bytes(b"\xef\xbb\xbfa,b\r\n3,x\r\n0,y\r\n")
    assert read_length_column(lengths, "a") == (pytest.approx([3, 1]), 1)


def test_whitespace_only_lines_are_blank_but_bare_commas_are_not(tmp_path: Path) -> None:
    w = read_csv_trace(write(tmp_path, "p.csv", CSV_HEADER + "0,5,6\n   \n\t\n1,7,8\n"))
    assert w.prompt_len.tolist() == [5, 7]
    with pytest.raises(InputError, match=r"q\.csv:3: column arrival_s: missing value"):
        read_csv_trace(write(tmp_path, "q.csv", CSV_HEADER + "0,5,6\n , ,\n1,7,8\n"))


def test_required_column_twice_in_header_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "arrival_s,prompt_len,output_len,prompt_len\n0,1,2,3\n")
    with pytest.raises(InputError, match=r"d\.csv:1: column 'prompt_len' appears more than once"):
        read_csv_trace(path)
    with pytest.raises(InputError, match=r"e\.csv:1: column 'a' appears more than once"):
        read_length_column(write(tmp_path, "e.csv", "a, a\n1,2\n"), "a")
    # repeated names among the ignored columns do no harm
    w = read_csv_trace(write(tmp_path, "f.csv", "x,x,arrival_s,prompt_len,output_len\n9,9,0,1,2\n"))
    assert w.prompt_len.tolist() == [1]


def test_quoted_fields_spanning_lines_keep_line_numbers_right(tmp_path: Path) -> None:
    # An extra text column may hold quoted newlines; errors still name the editor's line.
    header = "arrival_s,prompt_len,output_len,text\n"
    first = '0,1,2,"three\nline\ntext"\n'  # lines 2-4
    path = write(tmp_path, "q.csv", header + first + "1,3,4,ok\n")
    w = read_csv_trace(path)
    assert w.prompt_len.tolist() == [1, 3] and w.output_len.tolist() == [2, 4]
    for row, fragment in [
        ("1,x,4,ok", "column prompt_len: 'x' is not a number"),
        ("1,3,4,ok,extra", "malformed CSV row (4 fields expected, 5 found)"),
        ('1,3,4,"never closed', "malformed CSV row (a quoted field is never closed"),
    ]:
        with pytest.raises(InputError) as err:
            read_csv_trace(write(tmp_path, "q.csv", header + first + row + "\n"))
        assert str(err.value).startswith(f"{path}:5: {fragment}"), str(err.value)


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
    data_dir: DataFolder, name: str, fmt: str, rows: int, prompt_median: int, output_median: int
) -> None:
    w = read_trace(data_dir / name, fmt)  # type: ignore[arg-type]
    assert len(w) == rows
    assert w.arrival_s[0] == 0.0 and (np.diff(w.arrival_s) >= 0).all()
    # Both traces cover just under an hour (SOURCES.txt: 18:17-19:14 and 18:15-19:14).
    assert 3300 < w.arrival_s[-1] < 3600
    assert np.median(w.prompt_len) == prompt_median
    assert np.median(w.output_len) == output_median


def test_real_mooncake_trace(data_dir: DataFolder) -> None:
    w = read_trace(data_dir / "mooncake_fast25_conversation_trace.jsonl", "mooncake")
    assert len(w) == 12031
    assert w.arrival_s[0] == 0.0 and (np.diff(w.arrival_s) >= 0).all()
    assert w.arrival_s[-1] == pytest.approx(3536.999)  # SOURCES.txt: timestamps 0..3536999 ms
    assert w.prompt_len.mean() == pytest.approx(12035, rel=0.001)
    assert w.output_len.mean() == pytest.approx(343, rel=0.01)


def test_real_sharegpt_length_columns(data_dir: DataFolder) -> None:
    path = data_dir / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
    prefill, zeros = read_length_column(path, "num_prefill_tokens")
    decode, _ = read_length_column(path, "num_decode_tokens")
    assert len(prefill) == len(decode) == 30731 and zeros == 0
    assert prefill.mean() == pytest.approx(2340, rel=0.001) and prefill.max() == 8141
    assert decode.mean() == pytest.approx(439, rel=0.002) and decode.max() == 1024
