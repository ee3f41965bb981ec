"""MkDocs build hook: the CLI reference page is written from the argparse parser at build time
(tuner.cli.reference), so it cannot drift from what `precision-tuner` accepts."""

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "reference/cli.md":
        return markdown
    from tuner.cli.app import build_parser
    from tuner.cli.reference import cli_reference

    if MARKER not in markdown:
        raise ValueError(f"reference/cli.md lost its {MARKER} marker")
    return markdown.replace(MARKER, cli_reference(build_parser()))
