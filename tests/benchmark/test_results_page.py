"""The manual's results page is generated from benchmarks/results/, never retyped."""

from __future__ import annotations

import pytest

from edgeattn.benchmark.results_page import PAGE, RESULTS, machine_line, render

pytestmark = pytest.mark.quick


def test_the_results_page_is_what_the_json_files_give():
    assert PAGE.read_text(encoding="utf-8") == render(), "run: python -m edgeattn.benchmark.results_page"


def test_every_results_file_names_its_machine():
    page = render()
    for path in RESULTS.glob("*.json"):
        section = page.split(f"## {path.name}\n", 1)[1].split("\n## ", 1)[0]
        assert "machine: not recorded" not in section, path.name
        assert "cores" in section.splitlines()[1], path.name
    assert machine_line({"cpu": "X", "cores": 2, "instruction_sets": ["avx2"]}) == (
        "machine: X, 2 cores; instruction sets avx2"
    )


def test_the_tables_the_manual_quotes_from_results_files_are_generated():
    from edgeattn.benchmark.results_page import BLOCK, refresh_blocks

    quoted = 0
    for page in sorted(PAGE.parent.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        quoted += len(BLOCK.findall(text))
        assert refresh_blocks(text) == text, f"{page.name}: run python -m edgeattn.benchmark.results_page"
    assert quoted >= 2
