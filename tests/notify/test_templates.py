"""Templates: the built-in ones load and fill, a site's file replaces one, a body line with nothing to say is
left out, and a site's mistake is one line naming the file, the line and the fix when they load."""

from __future__ import annotations

import pytest

from gpulens.notify.config import ConfigError
from gpulens.notify.templates import FIELDS, REASONS, load_templates, parse_template


def test_every_reason_has_a_built_in_template_using_known_fields_only():
    templates = load_templates()
    assert list(templates) == list(REASONS)
    assert all(t.source == f"built-in template {t.reason}.txt" for t in templates.values())
    subject, body = templates["starved"].render(
        {
            "user": "alice",
            "job": "slurm 1234",
            "verdict": "starved for data",
            "since": "2 h",
            "gpus": "2 GPUs: n1/0, n1/1",
            "evidence": "waits on data 61% of each step",
            "tips": "- raise num_workers to 8\n- pin_memory=True",
            "links": "https://gpulens.example.org/job?kind=slurm&id=1234",
        }
    )
    assert subject == "[gpulens] slurm 1234 waits on its input pipeline"
    assert body == (
        "Hello alice,\n\n"
        "Your job slurm 1234 has been starved for data for 2 h, on 2 GPUs: n1/0, n1/1.\n"
        "Evidence: waits on data 61% of each step\n\n"
        "What would help:\n- raise num_workers to 8\n- pin_memory=True\n\n"
        "The job's page: https://gpulens.example.org/job?kind=slurm&id=1234\n\n"
        "-- \ngpulens, the cluster's GPU monitoring\n"
    )


def test_a_line_whose_every_field_is_empty_is_left_out_and_dollars_stay():
    template = parse_template(
        "Subject: $job for ${user}\n\nHello $user,\nEvidence: $evidence\nCost: $$3 per GPU-hour, $job\nBye\n",
        "starved",
        "test",
    )
    assert template.render({"job": "slurm 1", "user": "alice"}) == (
        "slurm 1 for alice",
        "Hello alice,\nCost: $3 per GPU-hour, slurm 1\nBye\n",
    )
    # A value that spans lines stays on one line in the subject.
    assert template.render({"job": "a\nb", "user": "x"})[0] == "a b for x"
    # A subject of fields all empty (a site's test.txt that names $period) is not sent blank.
    blank = parse_template("Subject: $period\n\nHi\n", "reclaim_warning", "test")
    assert blank.render({"job": "slurm 1"})[0] == "[gpulens] reclaim warning"


def test_a_sites_file_replaces_the_built_in_one(tmp_path):
    (tmp_path / "starved.txt").write_text("Subject: Data, $user!\r\n\r\nFeed job $job_id faster.\r\n")
    (tmp_path / "README").write_text("not a template")
    templates = load_templates(str(tmp_path))
    assert templates["starved"].source == f"template file {tmp_path / 'starved.txt'}"
    assert templates["starved"].render({"user": "bob", "job_id": "7"}) == ("Data, bob!", "Feed job 7 faster.\n")
    assert templates["digest"].source == "built-in template digest.txt"


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (
            "starved.txt",
            "Subject: hi\n\nHello $usr,\n",
            "starved.txt: line 3: unknown placeholder $usr; did you mean $user?",
        ),
        (
            "starved.txt",
            "Subject: ${gpu_model}\n\nx\n",
            "starved.txt: line 1: unknown placeholder $gpu_model; use one of",
        ),
        ("starved.txt", "Subject: hi\n\nCosts $5\n", "starved.txt: line 3: a '$' that starts no placeholder; write $$"),
        ("starved.txt", "Hello $user\n", "starved.txt: line 1: write 'Subject: ...' there, then a blank line"),
        (
            "starved.txt",
            "Subject: a\nb\n\nbody\n",
            "starved.txt: line 2: leave it blank, between the Subject: line and the body",
        ),
        ("starved.txt", "Subject: \n\nbody\n", "starved.txt: line 1: write 'Subject: ...' there"),
        (
            "starve.txt",
            "Subject: a\n\nb\n",
            "starve.txt: no reason is called 'starve'; name a template after its reason",
        ),
    ],
)
def test_a_sites_mistake_is_one_line_naming_the_file_the_line_and_the_fix(tmp_path, name, text, said):
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as failed:
        load_templates(str(tmp_path))
    assert str(failed.value).startswith(f"template file {tmp_path}/") and said in str(failed.value), str(failed.value)
    assert "\n" not in str(failed.value)


def test_a_folder_that_is_not_there(tmp_path):
    with pytest.raises(ConfigError, match=r"^templates folder \S+: cannot be read \(No such file or directory\)"):
        load_templates(str(tmp_path / "absent"))


def test_the_fields_are_documented_in_docs_notify():
    from tests.rules.known import ROOT

    text = (ROOT / "docs" / "notify.md").read_text()
    assert [name for name in FIELDS if f"`${name}`" not in text] == []
    assert [reason for reason in REASONS if f"`{reason}`" not in text] == []
