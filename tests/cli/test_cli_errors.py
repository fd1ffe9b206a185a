"""Every usage or input error of the command line: exit 2, one line on stderr, no traceback."""

from __future__ import annotations

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
