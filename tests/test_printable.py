"""Text a job names (its name, account, pod), shown as written: on one line, in Markdown and in a code span."""

from __future__ import annotations

import pytest

from gpulens.printable import markdown_code, markdown_text, printable


def test_what_is_not_printable_is_written_as_an_escape():
    assert printable("a\x1b[2Jb\u202ec\nd") == "a\\x1b[2Jb\\u202ec\\nd"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("[pay](http://e.vil)", "\\[pay\\](http:\u2060//e.vil)"),  # no link
        ("![](http://e.vil/x.png)", "!\\[\\](http:\u2060//e.vil/x.png)"),  # no image fetched by every viewer
        # No autolink of GitHub's or Streamlit's (GFM "Autolinks (extension)"): a scheme's '://', a 'www.', an
        # address (a word joiner inside each, which cmark-gfm and remark-gfm link none of), nor a chat mention.
        ("login at https://evil.example.com/reset", "login at https:\u2060//evil.example.com/reset"),
        ("www.evil.example.com WWW.e.com", "www\u2060.evil.example.com WWW\u2060.e.com"),
        ("ftp://e.com", "ftp:\u2060//e.com"),
        ("mail alice@example.com or @channel", "mail alice@\u2060example.com or @\u2060channel"),
        ("step 12:30 a.www", "step 12:30 a.www"),  # a colon or a 'www' that starts no link stays as it is
        ("<script>alert(1)</script>", "\\<script\\>alert(1)\\</script\\>"),
        ("a|b", "a\\|b"),  # no new table cell
        ("$x^2$ `code` **b**", "\\$x^2\\$ \\`code\\` \\*\\*b\\*\\*"),
        ("two\nlines", "two lines"),
        ("resnet_ddp 8.5", "resnet_ddp 8.5"),  # plain words stay as they are
        (
            "__name__ p_*x*_ ~~gone~~",
            "\\_\\_name\\_\\_ p\\_\\*x\\*\\_ \\~\\~gone\\~\\~",
        ),  # no bold, italics, strikethrough
    ],
)
def test_a_name_in_markdown_is_shown_as_written(name, shown):
    assert markdown_text(name) == shown


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        # No emoji of a shortcode (Streamlit's remark-emoji, GitHub's), icon, nor colour, badge or size directive of
        # Streamlit's: a WORD JOINER after the ':' that would start one.
        ("bob:rotating_light:", "bob:\u2060rotating_light:"),
        (":+1: a:100:", ":\u2060+1: a:\u2060100:"),
        (":material/delete:", ":\u2060material/delete:"),
        (":red[ADMIN] :blue-background[bg]", ":\u2060red\\[ADMIN\\] :\u2060blue-background\\[bg\\]"),
        ("ns:pod", "ns:\u2060pod"),  # a directive without its [text] is one too (its name gone, in Streamlit)
        ("at 12:30, ratio 3:1 or a: b", "at 12:30, ratio 3:1 or a: b"),  # a ':' that starts none stays as it is
    ],
)
def test_a_name_in_markdown_makes_no_emoji_icon_or_colour_of_streamlits(name, shown):
    assert markdown_text(name) == shown
    assert markdown_text(name, urls=True) == shown


def test_a_chat_message_keeps_its_urls_links_and_no_mention():
    said = "page https://gpulens.example.org/job?id=1 for @channel [x](y)"
    assert markdown_text(said, urls=True) == "page https://gpulens.example.org/job?id=1 for @\u2060channel \\[x\\](y)"


def test_a_code_span_no_backtick_inside_can_close():
    assert markdown_code("job-bob") == "`job-bob`"
    assert markdown_code("a`b") == "``a`b``"
    assert markdown_code("`x") == "`` `x ``"
