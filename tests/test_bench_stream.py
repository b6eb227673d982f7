"""`sgl_sidp.bench.stream`: the stand-in's chunks as SGLang streams them, and the client's intake timed end to end."""

import json

import pytest

from sgl_sidp.bench.stream import chunk, main, measure


def body(line: bytes) -> dict:
    assert line.startswith(b"data: ") and line.endswith(b"\n\n")
    return json.loads(line[6:])


def test_a_default_chunk_carries_the_whole_output_so_far_and_an_incremental_one_the_new_token():
    for k in (1, 7, 300):
        whole, new = body(chunk(k, True)), body(chunk(k, False))
        assert whole["output_ids"] == list(range(1, k + 1)) and new["output_ids"] == [k]
        assert len(whole["text"]) == k * len(new["text"])
        assert whole["meta_info"]["completion_tokens"] == new["meta_info"]["completion_tokens"] == k
    assert len(chunk(512, True)) > 20 * len(chunk(512, False))  # 4,659 bytes against 168


@pytest.mark.parametrize("cumulative", [True, False])
def test_the_client_counts_every_streamed_token(cumulative):
    r = measure(streams=3, output_len=20, cumulative=cumulative)
    assert (r["tokens"], r["failed"], r["cumulative"]) == (60, 0, cumulative)
    assert r["tokens_per_s"] == pytest.approx(60 / r["seconds"])


def test_bad_sizes_get_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--streams", "0"])
    assert e.value.code == 2
    assert "error: --streams 0" in capsys.readouterr().err.strip().splitlines()[-1]
    with pytest.raises(ValueError, match="at least 1"):
        measure(streams=1, output_len=0, cumulative=True)
