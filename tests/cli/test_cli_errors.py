"""Every usage or input error of the command line: exit 2, one line on stderr, no traceback."""

from __future__ import annotations

import json

import pytest

from eqsat_mirage.cli.main import main


def _files(tmp):
    (tmp / "bad.egg").write_text("(ruleset mine)\n(rewrite (Add a b) (Add b a) :when (a) "
                                 ":ruleset mine)\n")
    (tmp / "bin.egg").write_bytes(b"\xff\xfe(rule")
    (tmp / "bad.json").write_text('{"format": 1, "kernels": [')
    (tmp / "loop.json").write_text('{"format": 1, "name": "m", "inputs": {}, "kernels": '
                                   '[{"kind": "custom", "grid": [1], "forloop": 1000000000}]}')
    from eqsat_mirage.cost.profile import profile_path

    text = profile_path("h100").read_text()
    lines = [("dram_bandwidth_GBps = inf" if line.startswith("dram_bandwidth_GBps") else line)
             for line in text.splitlines()]
    (tmp / "inf.toml").write_text("\n".join(lines) + "\n")
    (tmp / "binary.toml").write_bytes(b"\x00\xff\xfe[figures]")
    good = {"format": "eqsat-mirage.mugraph", "version": 1, "name": "g", "inputs": [
        {"name": "x", "shape": [4], "dtype": "float32"}], "kernels": [
        {"kind": "predefined", "name": "k0", "output": "y", "graph": {
            "name": "k0", "inputs": [{"name": "x", "shape": [4], "dtype": "float32"}],
            "nodes": [{"op": "input", "srcs": [], "arg": "x", "shape": [4], "dtype": "float32"},
                      {"op": "const", "srcs": [], "arg": 2.0, "shape": [], "dtype": "float32"},
                      {"op": "mul", "srcs": [0, 1], "arg": None, "shape": [4],
                       "dtype": "float32"}],
            "outputs": {"y": 2}}}], "outputs": {"y": "y"}}
    (tmp / "good.json").write_text(json.dumps(good))
    (tmp / "kernels.json").write_text(json.dumps({**good, "kernels": {"a": 1}}))
    (tmp / "kernel1.json").write_text(json.dumps({**good, "kernels": [1]}))
    (tmp / "version.json").write_text(json.dumps({**good, "version": 99}))
    (tmp / "nan.json").write_text(json.dumps(good).replace("2.0", "NaN"))
    (tmp / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    hostile = json.loads(json.dumps(good))
    hostile["kernels"][0]["name"] = 'k0"""\nimport os'
    (tmp / "hostile.json").write_text(json.dumps(hostile))


CASES = {
    "unknown command": ["frobnicate"],
    "no command": [],
    "bad option value": ["optimize", "--bench", "gqa", "--time-limit", "abc"],
    "negative limit": ["optimize", "--bench", "lora", "--time-limit", "-1", "--no-cache"],
    "unknown benchmark": ["optimize", "--bench", "nosuch"],
    "malformed rule file": ["check-rules", "{tmp}/bad.egg"],
    "binary rule file": ["check-rules", "{tmp}/bin.egg"],
    "missing rule file": ["check-rules", "{tmp}/none.egg"],
    "rule file in optimize": ["optimize", "--bench", "lora", "--rules", "{tmp}/bad.egg",
                              "--no-cache"],
    "malformed MuGraph JSON": ["verify", "{tmp}/bad.json", "{tmp}/bad.json"],
    "a loop of 10**9 steps": ["verify", "{tmp}/loop.json", "{tmp}/loop.json"],
    "missing JSON": ["verify", "{tmp}/none.json", "{tmp}/none.json"],
    "kernels not a list": ["verify", "{tmp}/good.json", "{tmp}/kernels.json"],
    "a kernel not an object": ["verify", "{tmp}/good.json", "{tmp}/kernel1.json"],
    "unknown JSON version": ["verify", "{tmp}/good.json", "{tmp}/version.json"],
    "NaN constant": ["verify", "{tmp}/good.json", "{tmp}/nan.json"],
    "100000-deep JSON": ["verify", "{tmp}/good.json", "{tmp}/deep.json"],
    "kernel name with quotes": ["verify", "{tmp}/good.json", "{tmp}/hostile.json"],
    "unknown target": ["optimize", "--bench", "lora", "--target", "tpu9", "--no-cache"],
    "infinite bandwidth": ["optimize", "--bench", "lora", "--target", "{tmp}/inf.toml",
                           "--no-cache"],
    "binary profile": ["optimize", "--bench", "lora", "--target", "{tmp}/binary.toml",
                       "--no-cache"],
}


@pytest.mark.parametrize("name", list(CASES))
def test_usage_and_input_errors_exit_2_with_one_line(tmp_path, capsys, name):
    _files(tmp_path)
    argv = [a.format(tmp=tmp_path) for a in CASES[name]]
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse exits itself
        rc = exc.code
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "error" in err


def test_the_good_json_verifies(tmp_path, capsys):
    _files(tmp_path)
    assert main(["verify", str(tmp_path / "good.json"), str(tmp_path / "good.json")]) == 0
