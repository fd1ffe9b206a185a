"""The README's Python example runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["out"]["O"].shape == (2, 256, 64)
    assert namespace["r"].equivalent
    assert namespace["res"].cost_us <= namespace["res"].baseline_cost_us


def test_readme_opens_with_the_two_commands():
    head = README.read_text().splitlines()[:6]
    assert "make demo" in "\n".join(head) and "make test" in "\n".join(head)
