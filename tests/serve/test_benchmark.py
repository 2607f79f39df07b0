"""``max benchmark`` (client side) against the test server: the table, the JSON and the numbers."""

from __future__ import annotations

import json

from click.testing import CliRunner


def test_run_benchmark_counts_tokens_and_percentiles(server):
    from max.serve.benchmark import format_table, run_benchmark, synthetic_prompts

    assert synthetic_prompts(3, 5, seed=1) == synthetic_prompts(3, 5, seed=1)
    assert all(len(p.split()) == 5 for p in synthetic_prompts(3, 5))
    res = run_benchmark(server.url, num_prompts=8, concurrency=4, prompt_len=8, output_len=6)
    assert res["completed"] == 8 and res["failed"] == 0 and res["model"] == "tiny"
    assert res["total_output_tokens"] == 8 * 6  # ignore_eos: exactly output_len tokens each
    assert res["request_throughput"] > 0 and res["output_throughput"] > 0
    for key in ("ttft_ms", "tpot_ms"):
        s = res[key]
        assert 0 < s["p50"] <= s["p90"] <= s["p99"]
    table = format_table(res)
    assert "Request throughput" in table and "TTFT" in table and "TPOT" in table


def test_benchmark_cli_writes_json(server, tmp_path):
    from max.entrypoints.cli import main

    out = tmp_path / "bench.json"
    r = CliRunner().invoke(main, ["benchmark", "--base-url", server.url, "--num-prompts", "4", "--concurrency", "2",
                                  "--prompt-len", "4", "--output-len", "3", "--endpoint", "completions",
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "Output token throughput" in r.output
    data = json.loads(out.read_text())
    assert data["completed"] == 4 and data["endpoint"] == "completions" and data["total_output_tokens"] == 12


def test_benchmark_cli_reports_an_unreachable_server():
    from max.entrypoints.cli import main
    from max.serve.server import free_port

    r = CliRunner().invoke(main, ["benchmark", "--base-url", f"http://127.0.0.1:{free_port()}", "--num-prompts", "1"])
    assert r.exit_code != 0 and "failed" in r.output
