"""``titan-rocm plan`` on mutated TOMLs: never a traceback, exit 0 or 2, one reason on exit 2.

Each example starts from one of configs/*.toml and mutates its text: a value replaced by one
of another type or an odd one, a key renamed, dropped, duplicated or added, a section added,
bytes flipped, inserted or deleted. Whatever comes out, plan must answer with a plan (0) or
one line saying why the job would not start or the file cannot be used (2).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from titan_rocm.cli import main

REPO = Path(__file__).resolve().parents[2]
# The debug files build their models fastest; one full-size file keeps the large flavors in.
CONFIGS = sorted((REPO / "configs").glob("*debug*.toml")) + [
    REPO / "configs" / "deepseek_v3_16b_bf16.toml"]
ASSIGNMENT = re.compile(r"^(\s*)([A-Za-z_][\w]*)(\s*=\s*)(.*)$")
DEGREES = ["data_parallel_replicate_degree", "data_parallel_shard_degree",
           "context_parallel_degree", "tensor_parallel_degree", "pipeline_parallel_degree",
           "expert_parallel_degree", "expert_tensor_parallel_degree"]
KEYS = ["converters", "name", "flavor", "custom_import", "custom_config_module",
        "local_batch_size", "global_batch_size", "seq_len", "dtype", "enable", "components",
        "mixed_precision_param", "hf_assets_path", *DEGREES]
CONVERTERS = ["rocm", "rocm.grouped_mm", "rocm.precision_casts", "rocm.precision_cast",
              "quantize.linear.float8", "", " rocm", "rocm.divergence_guard"]

# Values as TOML text. Strings never name an importable module by chance (x_ prefix), so
# custom_import and custom_config_module can only fail to import or be titan-rocm's.
names = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=8)
toml_values = st.one_of(
    st.integers(-2, 16).map(str),
    st.integers(-2, 16).map(str),
    st.integers(-3, 1 << 40).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["true", "false", "nan", "inf", "-inf", "[]", "[3]", '[""]', "{}",
                     '"rocm"', '"two"', '""', '" rocm"', '"-1"', '"titan_rocm"',
                     '"titan_rocm.config"', '["rocm", "rocm"]', '["rocm", " x"]',
                     '"bfloat16"', '"16B"', '"gfx942"', "1979-05-27", '"\\u00e9"']),
    names.map(lambda s: f'"x_{s}"'),
    st.lists(names.map(lambda s: f'"{s}"'), max_size=3).map(lambda v: f"[{', '.join(v)}]"),
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    text = draw(st.sampled_from(CONFIGS)).read_text()
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        assignments = [i for i, line in enumerate(lines) if ASSIGNMENT.match(line)]
        i = draw(st.sampled_from(assignments)) if assignments else 0
        indent, key, eq, _ = ASSIGNMENT.match(lines[i]).groups() if assignments else (
            "", "x", " = ", "")
        op = draw(st.sampled_from(["value", "key-value", "key-value", "degree", "degree",
                                   "converters", "rename", "drop", "duplicate", "add-key",
                                   "add-section"]))
        if op == "key-value":  # a setting start-up depends on, given any value
            key = draw(st.sampled_from(KEYS))
            i = next((n for n, line in enumerate(lines) if re.match(rf"{key}\s*=", line)), i)
            indent, _, eq, _ = ASSIGNMENT.match(lines[i]).groups() if assignments else (
                "", "", " = ", "")
            lines[i] = f"{indent}{key}{eq}{draw(toml_values)}"
        elif op == "value":
            lines[i] = f"{indent}{key}{eq}{draw(toml_values)}"
        elif op == "degree":  # the parallel layout, against the world size plan derives
            degree = draw(st.sampled_from(DEGREES))
            lines = [line for line in lines if not re.match(rf"\s*{degree}\s*=", line)]
            if "[parallelism]" not in lines:
                lines.append("[parallelism]")
            lines.insert(lines.index("[parallelism]") + 1,
                         f"{degree} = {draw(st.sampled_from([-1, 0, 1, 2, 3, 4, 8]))}")
        elif op == "converters":
            chosen = draw(st.lists(st.sampled_from(CONVERTERS), max_size=3))
            lines = [line for line in lines if not line.startswith("converters")]
            lines.insert(lines.index("[model]") + 1 if "[model]" in lines else 0,
                         f"converters = [{', '.join(repr(c) for c in chosen)}]")
        elif op == "rename":
            lines[i] = f"{indent}{key}{draw(names)}{eq}{draw(toml_values)}"
        elif op == "drop":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "add-key":
            lines.insert(i + 1, f"x_{draw(names)} = {draw(toml_values)}")
        elif op == "add-section":
            section = f"x_{draw(names)}"
            lines.append(f"[{section}]\n{draw(names)} = {draw(toml_values)}")
    data = bytearray("\n".join(lines).encode())
    if draw(st.sampled_from(["text", "text", "text", "text", "bytes"])) == "bytes":  # rarer
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.integers(0, len(data) - 1))
            kind = draw(st.sampled_from(["set", "insert", "delete"]))
            if kind == "set":
                data[pos] = draw(st.integers(0, 255))
            elif kind == "insert":
                data.insert(pos, draw(st.sampled_from(list(b'[]="\n\x00\xff#,.'))))
            else:
                del data[pos]
    return bytes(data)


@pytest.fixture(autouse=True)
def _stock_torchtitan_afterwards() -> Iterator[None]:
    """A plan in this process patches TorchTitan's modules as it would in the job's."""
    from tests.support.moe_test_models import clean_patches

    with clean_patches():
        yield


@pytest.mark.slow
@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=mutated(), launcher=st.sampled_from(["torchtitan", "titan-rocm"]))
def test_plan_never_tracebacks_on_mutated_tomls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    data: bytes, launcher: str,
) -> None:
    monkeypatch.chdir(REPO)
    job = tmp_path / "job.toml"
    job.write_bytes(data)
    code = main(["plan", "--arch", "gfx942", "--launcher", launcher, "--job.config_file",
                 str(job)])
    out, err = capsys.readouterr()
    assert code in (0, 2)
    assert "Traceback" not in err
    if code == 2:
        reasons = [line for line in err.splitlines() if line.startswith("titan-rocm plan: ")]
        assert len(reasons) == 1 and len(reasons[0]) > len("titan-rocm plan: ") + 10, err
    else:
        assert out.startswith("verdict: the job starts (") and "\njob:      " in out
