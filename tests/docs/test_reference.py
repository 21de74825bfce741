"""docs/reference/ is generated from the Typer app; a committed page that differs is stale.

Regenerate with `make docs-reference` (``python docs/gen_reference.py``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import typer
import yaml

from ckpt_cli.app import app
from ckpt_cli.commands import COMMANDS as REGISTRY
from tests.support.paths import REPO


def _generator(name: str = "gen_reference") -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "docs" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
LISTS = _generator("gen_lists")
COMMANDS = [c.name for c in REGISTRY]


def test_the_committed_reference_pages_are_current() -> None:
    assert COMMANDS
    stale = GEN.stale_pages()
    assert not stale, f"stale reference pages {stale}: run `make docs-reference` and commit them"


def test_the_staleness_check_names_the_page_to_regenerate(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "reference"
    assert GEN.write_pages(out)
    assert GEN.stale_pages(out) == []
    page = out / "reshard.md"
    page.write_text(page.read_text().replace("--memory-limit", "--memory-cap"))
    (out / "ls.md").unlink()
    (out / "frobnicate.md").write_text(GEN.HEADER + "\n\n# ckpt frobnicate\n")
    (out / "json.md").write_text("# JSON output\n")  # hand-written: not the generator's
    assert GEN.stale_pages(out) == [
        "docs/reference/ls.md",
        "docs/reference/reshard.md",
        "docs/reference/frobnicate.md (no such command)",
    ]
    GEN.write_pages(out)
    assert not (out / "frobnicate.md").exists()
    assert (out / "json.md").read_text() == "# JSON output\n"


def test_every_option_of_every_command_is_on_its_page() -> None:
    group = typer.main.get_command(app)
    assert COMMANDS
    for name in COMMANDS:
        text = (REPO / "docs" / "reference" / f"{name}.md").read_text()
        params = group.commands[name].params  # type: ignore[attr-defined]
        # A hidden option is an old name kept for scripts (trend's --match): not offered.
        options = [p for p in params if p.param_type_name == "option" and not p.hidden]
        assert options, name
        for p in options:
            for decl in [*p.opts, *p.secondary_opts]:
                assert f"`{decl}`" in text, f"{name}: {decl} missing from docs/reference/{name}.md"
        assert "## Exit codes" in text and "| 0 |" in text, name


def site_nav() -> list[object]:
    """The nav the site is built with: mkdocs.yml's, with the hook's command pages."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    return _hooks().with_commands(nav, LISTS.nav_entries())  # type: ignore[no-any-return]


def test_every_reference_page_is_in_the_site_nav_and_linked_from_a_guide() -> None:
    flat = yaml.safe_dump(site_nav())
    generated = set(GEN.render_all())
    guides = [p for p in (REPO / "docs").rglob("*.md") if p not in generated]
    assert guides
    for name in COMMANDS:
        assert f"reference/{name}.md" in flat, f"reference/{name}.md is not in mkdocs.yml's nav"
        assert any(f"reference/{name}.md" in g.read_text() for g in guides), (
            f"no topic page links to reference/{name}.md"
        )


def test_mkdocs_yml_names_no_command_the_hook_adds() -> None:
    """The nav's command pages come from the registry alone: listing one by hand is refused."""
    hooks = _hooks()
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    assert "reference/ls.md" not in yaml.safe_dump(nav)
    entries = LISTS.nav_entries()
    assert entries[0] == {"ckpt ls": "reference/ls.md"}
    with pytest.raises(ValueError, match="by hand"):
        hooks.with_commands([{"Reference": ["reference/index.md", "reference/ls.md"]}], entries)
    with pytest.raises(ValueError, match=r"no reference/index\.md"):
        hooks.with_commands([{"Home": "index.md"}], entries)


def test_the_lists_of_commands_in_readme_index_and_json_are_current() -> None:
    stale = LISTS.stale_blocks()
    assert not stale, f"{stale}: run `make docs-reference` and commit the result"


def test_the_block_check_names_what_is_stale_and_what_to_write(tmp_path: Path) -> None:
    for name in LISTS.BLOCK_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((REPO / name).read_text())
    assert LISTS.stale_blocks(tmp_path) == []
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("— remove a pin", "— unpin"))
    page = tmp_path / "docs" / "reference" / "json.md"
    text = page.read_text()
    start = text.index("## `ckpt pin`")
    page.write_text(text[:start] + text[text.index("## `ckpt unpin`") :])
    assert LISTS.stale_blocks(tmp_path) == [
        "README.md",
        'docs/reference/json.md: no section "## `ckpt pin`" (write what its --json prints)',
    ]
    changed, problems = LISTS.write_blocks(tmp_path)
    assert changed == [readme] and len(problems) == 1
    assert "- `ckpt unpin ROOT STEP` — remove a pin (" in readme.read_text()


def test_a_block_needs_both_markers() -> None:
    assert LISTS.fill_block("a\n<!-- x -->\nold\n<!-- /x -->\nb", "x", "new") == (
        "a\n<!-- x -->\nnew\n<!-- /x -->\nb"
    )
    assert LISTS.fill_block("a\n<!-- x -->\nold\n", "x", "new") is None
