"""MkDocs build hook: the CLI reference page is written from the argparse parser at build time
(tuner.cli.reference), so it cannot drift from what `precision-tuner` accepts; the changelog
page is the repository's CHANGELOG.md (one file, read on GitHub and on the site)."""

from pathlib import Path

MARKER = "<!-- cli-reference -->"
CHANGELOG_MARKER = "<!-- changelog:"


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "changelog.md":
        if CHANGELOG_MARKER not in markdown:
            raise ValueError(f"changelog.md lost its {CHANGELOG_MARKER} marker")
        changelog = Path(config["docs_dir"]).parent / "CHANGELOG.md"
        return changelog.read_text().replace("](docs/", "](")
    if page.file.src_uri != "reference/cli.md":
        return markdown
    from tuner.cli.app import build_parser
    from tuner.cli.reference import cli_reference

    if MARKER not in markdown:
        raise ValueError(f"reference/cli.md lost its {MARKER} marker")
    return markdown.replace(MARKER, cli_reference(build_parser()))
