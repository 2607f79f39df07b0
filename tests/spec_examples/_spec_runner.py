"""Runs one spec example verbatim (used by the generated ``test_spec_*.py`` files).

``run_example`` executes, in a fresh namespace:

1. ``setup``     -- our documented preamble (imports / names the surrounding
                    prose assumes), outside any graph;
2. ``context``   -- optional expression for a context manager (usually a
                    ``Graph``) entered around steps 3-5 and bound to ``graph``;
3. ``preamble``  -- more preamble inside that context (e.g. ``x = ops.constant(...)``);
4. the example's own code, compiled from the spec text unchanged (its file name
   is ``spec004:L<line>``, or ``spec002:L<line>`` for seed page 002, so
   tracebacks point at the spec); the values of its top-level expression statements are kept in ``_spec_values[<line in block>]``
   (the statement is otherwise evaluated exactly as written);
5. ``postamble`` -- checks inside the context (e.g. ``graph.output(output)``);
6. ``check``     -- checks after the context has exited (e.g. running the graph);
                    ``_spec_stdout`` holds the printed lines, ``_spec_run`` runs a graph.

Everything the example prints is captured; each string in ``stdout`` must
appear, in order, as a whole line of that output (the printed values the spec
states in comments such as ``# Outputs: [2, 3]``).
"""

from __future__ import annotations

import ast
import contextlib
import io
from typing import Any, Sequence

import numpy as np


class _RecordExprs(ast.NodeTransformer):
    """``expr`` at module level -> ``_spec_values[lineno] = expr`` (same evaluation)."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        body = []
        for stmt in node.body:
            if isinstance(stmt, ast.Expr):
                target = ast.Subscript(
                    value=ast.Name(id="_spec_values", ctx=ast.Load()),
                    slice=ast.Constant(value=stmt.lineno),
                    ctx=ast.Store(),
                )
                new = ast.Assign(targets=[target], value=stmt.value)
                ast.copy_location(new, stmt)
                ast.fix_missing_locations(new)
                body.append(new)
            else:
                body.append(stmt)
        node.body = body
        return node


def _compile(src: str, filename: str, record: bool = False):
    tree = ast.parse(src, filename=filename)
    if record:
        tree = _RecordExprs().visit(tree)
        ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec")


def run_example(
    code: str,
    *,
    line: int,
    spec: str = "004",
    setup: str = "",
    context: str | None = None,
    preamble: str = "",
    postamble: str = "",
    check: str = "",
    stdout: Sequence[str] = (),
) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__spec_example__", "_spec_values": {}, "_spec_run": spec_run}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if setup:
            exec(_compile(setup, f"<setup L{line}>"), ns)
        ctx = eval(context, ns) if context else contextlib.nullcontext()
        with ctx as entered:
            if context:
                ns["graph"] = entered
            if preamble:
                exec(_compile(preamble, f"<preamble L{line}>"), ns)
            exec(_compile(code, f"spec{spec}:L{line}", record=True), ns)
            if postamble:
                exec(_compile(postamble, f"<postamble L{line}>"), ns)
    printed = [ln.rstrip() for ln in out.getvalue().splitlines()]
    ns["_spec_stdout"] = printed
    if check:
        exec(_compile(check, f"<check L{line}>"), ns)
    pos = 0
    for want in stdout:
        for i in range(pos, len(printed)):
            if printed[i] == want:
                pos = i + 1
                break
        else:
            raise AssertionError(
                f"spec example L{line}: expected the printed line {want!r} (in order); printed:\n" + "\n".join(printed)
            )
    return ns


def spec_run(graph: Any, *inputs: Any) -> list[np.ndarray]:
    """Compile ``graph`` on the CPU, run it on numpy ``inputs``, return numpy outputs."""
    from max import driver
    from max.engine import InferenceSession

    model = InferenceSession(devices=[driver.CPU()]).load(graph)
    args = [driver.Buffer.from_numpy(np.ascontiguousarray(a)) for a in inputs]
    return [o.to_numpy() for o in model.execute(*args)]
