"""Execute notebooks top to bottom at their full setting and store the outputs in the .ipynb
(``make notebooks``), so that they open with their figures where the code is browsed.

    python notebooks/execute.py [notebooks/<name>.ipynb ...]    # default: every notebook

The full setting: the step variables the tests set (``CODA_FIG2_STEPS`` and the others) are
removed from the environment, so each notebook trains its default steps. What is stored is what
a reader needs and nothing that changes from one execution to the next: the outputs, each code
cell's execution count, and in the notebook's metadata the SHA-256 of its code cells' sources
(``attnrepro.code_sha256``: tests/docs/test_notebooks.py finds a cell edited since); no
timings, kernel versions or absolute paths. A notebook is written only when it ran without an
error, through a temporary file, so an interrupted run leaves the committed one as it was.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

HERE = Path(__file__).resolve().parent
#: the environment variables of the short setting (tests/docs/test_notebooks.py's SHORT)
STEP_VARIABLES = ("CODA_FIG2_STEPS", "WINDOW_MASKS_STEPS", "DECOMP_MAPS_STEPS",
                  "DENSITY_MATRIX_STEPS", "CODA_ANATOMY_STEPS")
KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}
#: an absolute path of this machine in an output (a stored notebook must not name one)
ABSOLUTE = re.compile(r"(?<![\w.~/-])/(?:home|root|tmp|work|usr|opt|var|Users|private)/")


def code_digest(nb: nbformat.NotebookNode) -> str:
    """SHA-256 of the code cells' sources, in order."""
    return hashlib.sha256("\0".join(c.source for c in nb.cells if c.cell_type == "code")
                          .encode()).hexdigest()


def output_text(output: dict) -> str:
    """What an output shows as text: a stream's text, an error, or its text/* data."""
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    return "".join(v if isinstance(v, str) else "".join(v)  # in a stored file's key order
                   for k, v in sorted(output.get("data", {}).items()) if k.startswith("text/"))


def execute(nb: nbformat.NotebookNode, timeout: int | None = None) -> nbformat.NotebookNode:
    """Run ``nb`` in a fresh python3 kernel from notebooks/ (in place; returns it)."""
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def normalised(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with only what is stored: no cell metadata (timings, collapsed state), the
    notebook's metadata the kernel, the language and the code digest."""
    for cell in nb.cells:
        cell.metadata = nbformat.NotebookNode()
    nb.metadata = nbformat.NotebookNode(
        kernelspec=KERNEL, language_info={"name": "python"},
        attnrepro={"code_sha256": code_digest(nb)})
    return nb


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """What a stored notebook must not hold: errors, anything written to stderr (warnings,
    Lightning's INFO lines: the studies silence what they expect), absolute paths."""
    found = []
    for i, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            text = output_text(output)
            if output.get("output_type") == "error":
                found.append(f"cell {i}: {output.get('ename')}: {output.get('evalue')}")
            elif output.get("name") == "stderr":
                found.append(f"cell {i}: on stderr: {text.strip()[:120]}")
            elif ABSOLUTE.search(text):
                line = next(x for x in text.splitlines() if ABSOLUTE.search(x))
                found.append(f"cell {i}: an absolute path: {line.strip()[:120]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python notebooks/execute.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        default=sorted(HERE.glob("*.ipynb")))
    args = parser.parse_args(argv)
    for variable in STEP_VARIABLES:
        os.environ.pop(variable, None)
    failed = []
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        try:
            found = problems(execute(nb))
        except CellExecutionError as error:
            found = [str(error)]
        if found:
            print(f"{path}: not stored, left as it was:\n  " + "\n  ".join(found),
                  file=sys.stderr)
            failed.append(path)
            continue
        part = path.with_name(path.name + ".part")
        nbformat.write(normalised(nb), part)
        part.replace(path)
        print(f"{path}: {time.perf_counter() - start:.0f} s, {path.stat().st_size:,} bytes",
              flush=True)
    if failed:
        print(f"{len(failed)} of {len(args.notebooks)} notebook(s) failed: "
              + " ".join(map(str, failed)), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
