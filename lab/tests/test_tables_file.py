"""One markdown file of named table sections: written one section at a time, read back in order."""

from rltok_lab.tables_file import put_section, sections


def test_a_section_is_replaced_in_place_and_a_new_one_goes_last(tmp_path):
    path = tmp_path / "tables.md"
    put_section(path, "a", "table a\n", "# Title\n\nWhat these are.\n")
    put_section(path, "b", "\ntable b\n\n", "# ignored once the file exists\n")
    put_section(path, "a", "table a, again", "")
    text = path.read_text()
    assert text == "# Title\n\nWhat these are.\n\n## a\n\ntable a, again\n\n## b\n\ntable b\n"
    assert sections(text) == {"a": "table a, again\n", "b": "table b\n"}


def test_lines_that_are_not_headings_stay_in_their_section():
    text = "# T\n\n## x\n\n| ## not a heading |\n### a sub-heading\n\n## y\nlast"
    assert sections(text) == {"x": "| ## not a heading |\n### a sub-heading\n", "y": "last\n"}
