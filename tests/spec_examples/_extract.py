"""Extract the spec's Python examples into generated (committed) test files.

Run from the repository root:

    .venv/bin/python tests/spec_examples/_extract.py [path/to/004_*.txt]

It reads the fenced code blocks of spec file 004 in the line ranges of
``INDEX.md`` §0.1 (driver, dtype, engine, graph core + dim, ops, quantization,
shape, type), keeps the ```` ```python ```` blocks and the ```` ```pycon ````
blocks (``>>>``/``...`` prompts stripped, echoed output lines dropped), and
writes one test per block into ``tests/spec_examples/test_spec_<group>.py``.
Each test runs the block's code *verbatim* through
``_spec_runner.run_example``.

The example's own lines are never changed.  Where a block relies on names the
surrounding prose defines (``DeviceRef`` not imported, ``model`` assumed, a
fragment that needs an open graph ...), ``EXAMPLES`` below adds a documented
``setup``/``context``/``preamble`` and, where the spec states a result,
``postamble``/``check`` code that asserts it.  Printed values stated in
comments (``print(x)  # Outputs: [2, 3]``) are turned into ``stdout``
expectations automatically (see ``_stdout_from_comments``) unless an entry
overrides them.

Marks: ``gpu`` (needs an accelerator), ``gpu2`` (needs two), ``("skip", why)``
for blocks that are not runnable Python by nature (formulas), ``("xfail", why[,
exception name])`` (strict) for blocks that cannot work by nature (hub model files, hypothetical
APIs) and for libremax bugs (reason starts with ``libremax bug:``).
"""

from __future__ import annotations

import pathlib
import re
import sys
from dataclasses import dataclass

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_SPEC = next(iter(sorted(pathlib.Path("/work/shared/spec").glob("004_*.txt"))), None)

# INDEX.md §0.1 line ranges of 004 (inclusive).
GROUPS: list[tuple[str, int, int, str]] = [
    ("driver", 7, 1012, "max.driver"),
    ("dtype", 1014, 1299, "max.dtype"),
    ("engine", 1301, 1670, "max.engine"),
    ("graph", 5035, 7159, "max.graph core classes (Graph, TensorValue, Value, Weight, BufferValue, KernelLibrary) and max.graph.dim"),
    ("ops", 7161, 11217, "max.graph.ops"),
    ("quantization", 11219, 11499, "max.graph.quantization"),
    ("shape", 11501, 11593, "max.graph.shape"),
    ("type", 11595, 12282, "max.graph.type"),
]

# --------------------------------------------------------------------------
# Shared preamble snippets
# --------------------------------------------------------------------------
G_IMPORTS = (
    "# preamble: names the spec's prose assumes\n"
    "import numpy as np\n"
    "from max.dtype import DType\n"
    "from max.graph import DeviceRef, Graph, TensorType, TensorValue, ops\n"
)
DEVREF = "# preamble: the example uses DeviceRef without importing it\nfrom max.graph import DeviceRef\n"
GRAPH_CTX = 'Graph("spec_example")'
X_2x2 = (
    "# preamble: the prose's `x` is a 2x2 float32 tensor [[1, 2], [3, 4]]\n"
    "x = ops.constant(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), DType.float32, device=DeviceRef.CPU())\n"
)
SMALL_MODEL = (
    "# preamble: `model` is a compiled model (the prose assumes one): relu over a 2x3 float32 input\n"
    "from max import driver, engine\n"
    "from max.dtype import DType\n"
    "from max.graph import DeviceRef, Graph, TensorType, ops\n"
    'g = Graph("spec_model", forward=ops.relu, input_types=[TensorType(DType.float32, (2, 3), DeviceRef.CPU())])\n'
    "model = engine.InferenceSession(devices=[driver.CPU()]).load(g)\n"
)
REPEAT_INPUT = (
    G_IMPORTS
    + "from max.graph.ops import repeat_interleave\n"
    + "# `input` is the prose's 2x2 tensor [[1.0, 2.0], [3.0, 4.0]] (L10163)\n"
)
REPEAT_PRE = "input = TensorValue(ops.constant(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), DType.float32, device=DeviceRef.CPU()))\n"


def _repeat_check(expected: str) -> dict:
    return dict(
        setup=REPEAT_INPUT,
        context=GRAPH_CTX,
        preamble=REPEAT_PRE,
        postamble="graph.output(output)\n",
        check=f"(got,) = _spec_run(graph)\nnp.testing.assert_array_equal(got, np.array({expected}, np.float32))\n",
    )


# Keyed by the line of the opening fence in 004 ("002:<line>" for seed-page blocks).
# Keys: setup, context, preamble, postamble, check (see _spec_runner.run_example),
# stdout (None: derived from comments), stdout_note, marks, note.
EXAMPLES: dict[int | str, dict] = {
    # ----------------------------------------------------------------- driver
    33: dict(marks=["gpu2"], note="uses Accelerator(id=1): needs two accelerators"),
    76: dict(postamble="assert device_id == 0  # spec: 'Device id is always 0 for CPU devices'\n"),
    131: dict(postamble="assert _spec_values[4] == 'cpu'  # spec: `cpu` for host devices\n"),
    150: dict(marks=["gpu"]),
    163: dict(marks=["gpu2"], note="uses Accelerator(id=1): needs two accelerators"),
    238: dict(marks=["gpu"]),
    293: dict(postamble="assert _spec_values[4] is True  # a CPU device is the host\n"),
    311: dict(postamble="assert _spec_values[4] == 'cpu'  # spec: `cpu` for host devices\n"),
    438: dict(marks=["gpu"]),
    538: dict(marks=["gpu"], note="creates a tensor on driver.Accelerator()"),
    749: dict(stdout=["True"], stdout_note="spec: is_host is true for CPU tensors"),
    # ------------------------------------------------------------------ dtype
    1031: dict(
        postamble=(
            "assert tensor.dtype == np.float32 and max_dtype == DType.float16\n"
            "assert is_float is True  # spec comment: True\n"
            "assert is_int is True    # spec comment: True\n"
            "assert size == 8         # spec comment: 8\n"
        )
    ),
    # ----------------------------------------------------------------- engine
    1316: dict(
        setup="# preamble: names the prose assumes\nfrom pathlib import Path\nfrom max import engine\n",
        marks=[("xfail", "loads a model file from the hub/disk ('bert-base-uncased'), not available here; "
                          "`devices=...` is a literal placeholder", "TypeError")],
    ),
    1557: dict(setup=SMALL_MODEL, check=(
        "# one line for the model's one input (input names are the implementation's choice)\n"
        "(ln,) = _spec_stdout\n"
        "assert ln.startswith('name: ') and ln.endswith(', shape: [2, 3], dtype: DType.float32'), ln\n"
    )),
    1571: dict(setup=SMALL_MODEL, check=(
        "# one line for the model's one output\n"
        "(ln,) = _spec_stdout\n"
        "assert ln.startswith('name: ') and ln.endswith(', shape: [2, 3], dtype: DType.float32'), ln\n"
    )),
    # ------------------------------------------------------------------ graph
    5154: dict(
        setup=DEVREF,
        check=(
            "# the forward function becomes the output: x @ ones(2, 2) + ones(2)\n"
            "(got,) = _spec_run(linear_graph, np.array([1.0, 2.0], np.float32))\n"
            "np.testing.assert_allclose(got, [4.0, 4.0])\n"
        ),
    ),
    5524: dict(setup=DEVREF),
    5640: dict(setup=DEVREF),
    5694: dict(setup=DEVREF),
    5754: dict(setup=DEVREF),
    5782: dict(setup=DEVREF),
    6068: dict(setup=DEVREF),
    6126: dict(setup=DEVREF),
    6180: dict(setup=DEVREF),
    6258: dict(stdout=["New device: gpu:0"], stdout_note="'Output depends on default device' is not asserted",
               note="DeviceRef.GPU() is only a graph-level placement: no accelerator needed to build"),
    6311: dict(setup=DEVREF),
    6438: dict(setup=DEVREF, stdout=["Is c a Value? True"], stdout_note="c = a + b is a Value"),
    6577: dict(setup=DEVREF),
    6614: dict(setup=DEVREF),
    6695: dict(postamble="assert _spec_values[2] is True  # Returns True\nassert _spec_values[4] is True  # Returns True\n"),
    6812: dict(setup="# preamble: DType is not imported by the example\nfrom max.dtype import DType\n",
               postamble="assert tensor_type.shape == ['batch', 10]\n"),
    6825: dict(
        setup="# preamble: names the example uses without importing\nfrom max.graph import AlgebraicDim, StaticDim, SymbolicDim\n",
        postamble=(
            "assert isinstance(some_dims[0], SymbolicDim) and isinstance(some_dims[1], StaticDim)\n"
            "assert isinstance(some_dims[2], AlgebraicDim)\n"
        ),
    ),
    6930: dict(postamble="assert tensor.shape == [4, 5] and tensor.dtype == DType.int64\n"),
    7042: dict(setup="# preamble\nfrom max.graph import SymbolicDim\n", postamble="assert dim.name == 'name'\n"),
    7048: dict(
        setup="# preamble\nfrom max.dtype import DType\nfrom max.graph import SymbolicDim, TensorType\n",
        postamble="assert tensor_type.shape == ['batch', 'x', 10] and tensor_type.dtype == DType.bool\n",
    ),
    # -------------------------------------------------------------------- ops
    7638: dict(marks=[("skip", "math notation describing band_part (`in_band(...)`, trailing '.'), not Python")]),
    7644: dict(marks=[("skip", "math notation describing band_part (`||`), not Python")]),
    7925: dict(
        setup="# preamble: pycon names\nfrom max.graph import Graph, TensorValue\nfrom max.graph.ops import chunk\n",
        context=GRAPH_CTX,
        marks=[("xfail", "spec contradiction (INDEX §0.2 #12): chunk's text says the split must divide evenly, "
                          "yet this example chunks 5 elements by 2; libremax follows the rule and raises ValueError",
                "ValueError")],
    ),
    8190: dict(
        setup=G_IMPORTS,
        check=(
            "# cross-check: padding [0, 1, 2, 1] of the 2x3 input gives padded_input (ops.pad)\n"
            'g2 = Graph("pad", lambda t: ops.pad(t, [0, 1, 2, 1]), input_types=[TensorType(DType.float32, (2, 3), DeviceRef.CPU())])\n'
            "(got,) = _spec_run(g2, np.array(input, np.float32))\n"
            "np.testing.assert_array_equal(got, np.array(padded_input, np.float32))\n"
        ),
    ),
    8350: dict(
        setup=G_IMPORTS,
        check=(
            "# cross-check: padding [0, 1, 2, 1] of the 2x3 input gives padded_input (ops.pad)\n"
            'g2 = Graph("pad", lambda t: ops.pad(t, [0, 1, 2, 1]), input_types=[TensorType(DType.float32, (2, 3), DeviceRef.CPU())])\n'
            "(got,) = _spec_run(g2, np.array(input, np.float32))\n"
            "np.testing.assert_array_equal(got, np.array(padded_input, np.float32))\n"
        ),
    ),
    8689: dict(
        setup=G_IMPORTS + "input_types = [TensorType(DType.float32, (4,), DeviceRef.GPU(i)) for i in range(3)]\n",
        marks=[("xfail", "illustrative: the spec says ops.custom('allreduce', ...) is a hypothetical op, "
                          "'not a public API' (it is called with `inputs=` and no out_types); needs 3 GPUs", "TypeError")],
    ),
    8909: dict(
        setup=G_IMPORTS,
        postamble="assert gathered.type.shape == ['a', 'f', 'e'] and gathered.type.dtype == DType.bfloat16\n",
        stdout=[], stdout_note="the '## Output: TensorType(...)' comment omits the device; shape/dtype asserted instead",
    ),
    9953: dict(
        setup=G_IMPORTS + "from typing import Any\n",
        postamble="# call the function the example defines\nadd_tensors(np.array([1.0], np.float32), np.array([2.0], np.float32))\n",
        check="assert any(ln.startswith('final graph:') for ln in _spec_stdout)\n",
    ),
    10163: dict(setup=G_IMPORTS, context=GRAPH_CTX, preamble=X_2x2,
                postamble="assert input.shape == [2, 2]  # '## Input tensor with shape (2, 2)'\n"),
    10170: _repeat_check("[[1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [3.0, 4.0]]"),
    10178: _repeat_check("[[1.0, 1.0, 2.0, 2.0], [3.0, 3.0, 4.0, 4.0]]"),
    10188: _repeat_check("[[1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [3.0, 4.0], [3.0, 4.0]]"),
    10196: _repeat_check("[1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]"),
    10498: dict(setup=G_IMPORTS, context=GRAPH_CTX,
                postamble="assert result.dtype == DType.int64 and result.shape == [2, 1]\n"),
    10603: dict(
        setup=G_IMPORTS + "from max.graph.ops import slice_tensor\n",
        context=GRAPH_CTX,
        preamble="# preamble: the prose's `x`, a 2x3 tensor\nx = ops.constant(np.arange(6, dtype=np.float32).reshape(2, 3), DType.float32, device=DeviceRef.CPU())\n",
        postamble=(
            "rev, unsq = _spec_values[2], _spec_values[4]\n"
            "assert rev.shape == [2, 3] and unsq.shape == [2, 1, 3]\n"
            "graph.output(rev, unsq)\n"
        ),
        check=(
            "rev, unsq = _spec_run(graph)\n"
            "a = np.arange(6, dtype=np.float32).reshape(2, 3)\n"
            "np.testing.assert_array_equal(rev, a[::-1])\n"
            "np.testing.assert_array_equal(unsq, a[..., None, :])\n"
        ),
    ),
    11137: dict(
        setup=DEVREF,
        postamble="assert isinstance(result, list) and len(result) == 1  # Return type: list[TensorValue]\n",
        check="# run it: the loop counts to 10\nwith g:\n    g.output(*result)\nassert [int(v) for v in _spec_run(g)] == [10]\n",
    ),
    11156: dict(
        setup=DEVREF,
        postamble="assert isinstance(results, list) and len(results) == 2\n",
        check="# run it: x counts 0 -> 10 while y counts 5 -> 15\nwith g:\n    g.output(*results)\nassert [int(v) for v in _spec_run(g)] == [10, 15]\n",
    ),
    # ---------------------------------------------------------- quantization
    11319: dict(
        setup="# preamble: names the example uses without importing\nfrom max.dtype import DType\nfrom max.graph import DeviceRef\n",
        postamble=(
            "assert quantized_weight.quantization_encoding == QuantizationEncoding.Q4_K\n"
            "assert quantized_weight.shape == [4096, 4096] and quantized_weight.dtype == DType.uint8\n"
        ),
        note="DeviceRef.GPU(0) is a graph-level placement: no accelerator needed to declare the weight",
    ),
}

# Seed pages 000-003 are flattened text without code fences; their few code
# lines are listed here by hand: (file prefix, first line, last line, lang,
# group, anchor).  Only blocks whose lines are intact are listed (002's
# gpu_profiling example and metadata loops have code glued to prose or lost
# their indentation; the metadata loops are 004 L1557/L1571 anyway).
SEED_BLOCKS: list[tuple[str, int, int, str, str, str]] = [
    ("002", 134, 136, "pycon", "engine", "max.engine.Model.capture"),
]
EXAMPLES["002:134"] = dict(
    setup=SMALL_MODEL + "import numpy as np\n"
    "input_tensor = driver.Buffer.from_numpy(np.array([[-1, 2, 3], [4, -5, 6]], np.float32))\n",
    postamble=(
        "assert _spec_values[2] is None  # debug_verify_replay: 'Return type: None'\n"
        "# replay's return is undocumented; if it returns outputs they must be relu(input)\n"
        "if _spec_values[3] is not None:\n"
        "    np.testing.assert_array_equal(_spec_values[3][0].to_numpy(), [[0, 2, 3], [4, 0, 6]])\n"
    ),
    note="002 only (seed page); on a CPU, capture/replay run the model plainly (DESIGN §4)",
)

# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------
_ANCHOR = re.compile(r"\{#(max\.[A-Za-z0-9_.]+)\}")
_PRINT_COMMENT = re.compile(
    r"""^\s*print\((?P<body>.*)\)\s*#\s*(?:(?:Outputs?|Output):\s*)?(?P<val>.+?)\s*$"""
)
_FSTR = re.compile(r"""^f(["'])(?P<label>[^{}]*)\{[^{}]*\}\1$""")


@dataclass
class Block:
    line: int  # line of the opening fence
    lang: str
    code: str
    anchor: str
    group: str
    src: str = "004"

    @property
    def key(self):
        return self.line if self.src == "004" else f"{self.src}:{self.line}"


def parse(spec: pathlib.Path) -> list[Block]:
    lines = spec.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    anchor = ""
    i = 0
    while i < len(lines):
        n = i + 1
        ln = lines[i]
        m = _ANCHOR.search(ln)
        if m and ln.startswith("#"):
            anchor = m.group(1)
        if ln.startswith("```"):
            lang = ln[3:].strip()
            j = i + 1
            while j < len(lines) and lines[j].rstrip() != "```":
                j += 1
            body = lines[i + 1 : j]
            group = next((g for g, lo, hi, _ in GROUPS if lo <= n <= hi), None)
            if group and lang in ("python", "pycon"):
                if lang == "pycon":
                    kept = []
                    for b in body:
                        if b.startswith(">>> ") or b.startswith("... "):
                            kept.append(b[4:])
                        elif b in (">>>", "..."):
                            kept.append("")
                        # other lines are echoed output: dropped
                    body = kept
                blocks.append(Block(n, lang, "\n".join(body) + "\n", anchor, group))
            i = j + 1
            continue
        i += 1
    return blocks


def parse_seed(spec_dir: pathlib.Path) -> list[Block]:
    out = []
    for prefix, lo, hi, lang, group, anchor in SEED_BLOCKS:
        f = next(iter(sorted(spec_dir.glob(f"{prefix}_*.txt"))))
        body = f.read_text(encoding="utf-8").splitlines()[lo - 1 : hi]
        if lang == "pycon":
            body = [b[4:] if b.startswith((">>> ", "... ")) else "" for b in body]
        out.append(Block(lo, lang, "\n".join(body) + "\n", anchor, group, prefix))
    return out


def _stdout_from_comments(code: str) -> list[str]:
    """``print(f"Label: {v}")  # Output: X`` -> "Label: X"; ``print(v)  # Outputs: X`` -> "X".

    A bare comment counts only when it looks like a value (starts with ``[``,
    ``DType``, ``gpu``/``cpu``).  A comment that already repeats the label is
    taken as the whole line.
    """
    want = []
    for ln in code.splitlines():
        m = _PRINT_COMMENT.match(ln)
        if not m:
            continue
        body, val = m.group("body").strip(), m.group("val")
        explicit = re.search(r"#\s*Outputs?:", ln) is not None
        if not explicit and not re.match(r"(\[|DType\.|gpu:|cpu:)", val) and ":" not in val:
            continue
        if "depends" in val:
            continue
        fm = _FSTR.match(body)
        if fm:
            label = fm.group("label")
            if val.startswith(label.strip()):
                want.append(val)
            else:
                want.append(label + val)
        elif not body.startswith(("f'", 'f"', "'", '"')) and not explicit and ":" in val:
            continue
        else:
            want.append(val)
        if ".shape" in body:
            # MAX 26.7 prints a Shape as its Dims (max-behaviours.md B1.6; the spec's own L6180/L6614
            # comments show that form too): "[2, 3]" -> "[Dim(2), Dim(3)]"
            want[-1] = re.sub(r"\[(\d+(?:, \d+)*)\]$",
                              lambda m: "[" + ", ".join(f"Dim({d})" for d in m.group(1).split(", ")) + "]",
                              want[-1])
    return want


def _marks(ex: dict) -> list[str]:
    out = []
    for mk in ex.get("marks", []):
        if mk == "gpu":
            out.append("@pytest.mark.gpu")
        elif mk == "gpu2":
            out.append("@pytest.mark.gpu")
            out.append('@pytest.mark.skipif(_gpu_count() < 2, reason="needs two accelerators")')
        elif isinstance(mk, tuple) and mk[0] == "skip":
            out.append(f"@pytest.mark.skip(reason={mk[1]!r})")
        elif isinstance(mk, tuple) and mk[0] == "xfail":
            raises = f", raises={mk[2]}" if len(mk) > 2 else ""
            out.append(f"@pytest.mark.xfail(strict=True{raises}, reason={mk[1]!r})")
        else:
            raise ValueError(mk)
    return out


def _lit(s: str) -> str:
    if "'''" not in s and "\\" not in s:
        return "'''\\\n" + s + "'''"
    return repr(s)


def render(group: str, title: str, blocks: list[Block], spec_name: str) -> str:
    out = [
        f'"""Spec examples for {title} (004 lines {next(f"{lo}-{hi}" for g, lo, hi, _ in GROUPS if g == group)}).',
        "",
        f"GENERATED by tests/spec_examples/_extract.py from {spec_name}: edit the",
        "generator (its EXAMPLES table) and re-run it instead of editing this file.",
        "Each test runs one spec block verbatim (CODE); setup/preamble/checks are ours.",
        '"""',
        "",
        "import pytest",
        "",
        "from _spec_runner import run_example",
        "",
        "",
        "def _gpu_count() -> int:",
        "    try:",
        "        import torch",
        "",
        "        return torch.cuda.device_count()",
        "    except Exception:  # pragma: no cover",
        "        return 0",
        "",
    ]
    seen: dict[str, int] = {}
    for b in blocks:
        ex = EXAMPLES.get(b.key, {})
        slug = re.sub(r"\W", "_", b.anchor.removeprefix("max.")) or group
        name = f"test_L{b.line}_{slug}" if b.src == "004" else f"test_{b.src}_L{b.line}_{slug}"
        seen[name] = seen.get(name, 0) + 1
        stdout = ex.get("stdout")
        if stdout is None:
            stdout = _stdout_from_comments(b.code)
        out.append("")
        for mk in _marks(ex):
            out.append(mk)
        out.append(f"def {name}():")
        doc = f"{b.src} L{b.line} ({b.anchor or group}{', pycon prompts stripped' if b.lang == 'pycon' else ''})."
        if ex.get("note"):
            doc += " " + ex["note"] + "."
        out.append(f"    {doc!r}")
        out.append(f"    CODE = {_lit(b.code)}")
        args = [f"line={b.line}"] + ([f"spec={b.src!r}"] if b.src != "004" else [])
        for key in ("setup", "context", "preamble", "postamble", "check"):
            if ex.get(key):
                out.append(f"    {key.upper()} = {_lit(ex[key]) if key != 'context' else repr(ex[key])}")
                args.append(f"{key}={key.upper()}")
        if stdout:
            if ex.get("stdout_note"):
                out.append(f"    # {ex['stdout_note']}")
            out.append(f"    STDOUT = {stdout!r}")
            args.append("stdout=STDOUT")
        elif ex.get("stdout_note"):
            out.append(f"    # stdout not asserted: {ex['stdout_note']}")
        out.append(f"    run_example(CODE, {', '.join(args)})")
        out.append("")
    dup = [k for k, v in seen.items() if v > 1]
    assert not dup, dup
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    spec = pathlib.Path(argv[1]) if len(argv) > 1 else DEFAULT_SPEC
    if spec is None or not spec.exists():
        print("spec file 004_*.txt not found", file=sys.stderr)
        return 1
    blocks = parse(spec) + parse_seed(spec.parent)
    unknown = set(EXAMPLES) - {b.key for b in blocks}
    assert not unknown, f"EXAMPLES entries for lines with no block: {sorted(unknown)}"
    total = 0
    for group, _lo, _hi, title in GROUPS:
        gb = [b for b in blocks if b.group == group]
        path = HERE / f"test_spec_{group}.py"
        if not gb:
            if path.exists():
                path.unlink()
            continue
        path.write_text(render(group, title, gb, spec.name), encoding="utf-8")
        total += len(gb)
        print(f"{path.relative_to(HERE.parent.parent)}: {len(gb)} examples")
    print(f"total: {total} examples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
