"""The Python example in README.md runs and prints what the README promises."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def readme_block(lang):
    text = (ROOT / "README.md").read_text()
    m = re.search(r"```" + lang + r"\n(.*?)```", text, re.S)
    assert m, f"README.md has no ```{lang} block"
    return m.group(1)


def test_python_example_runs():
    out = subprocess.run([sys.executable, "-c", readme_block("python")], capture_output=True,
                         text=True, check=True).stdout
    assert "codes: 0x1D 0x38 0x45 0x79 0x7E" in out
    assert "values: [0.1015625, 1.0, 3.25, 288.0, 448.0]" in out
    assert "e4m3fn: max 448.0, smallest subnormal 0.001953125" in out


def test_example_file_matches_readme():
    example = (ROOT / "python" / "examples" / "quickstart.py").read_text()
    body = example.split('"""', 2)[2].lstrip("\n")  # without the docstring
    assert body == readme_block("python")
