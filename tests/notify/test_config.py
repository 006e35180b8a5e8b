"""The settings file: every key read, each mistake one line naming the file, the key and the fix; quiet hours
across midnight and daylight saving time."""

from __future__ import annotations

import datetime
import zoneinfo

import pytest

from gpulens.notify.config import Config, ConfigError, QuietHours, load_config

FULL = """\
smtp:
  host: smtp.example.org
  username: gpulens
  password_env: GPULENS_SMTP_PASSWORD
  from: "gpulens <gpulens@example.org>"
  timeout: 1m
webhooks:
  - {kind: mattermost, url: "https://chat.example.org/hooks/abc", channel: gpu-jobs}
  - {kind: slack, url_file: /etc/gpulens/slack-hook}
addresses: {map_file: owners.yaml, gecos: false, domain_template: "{user}@example.org"}
cooldown: 3d
quiet_hours: {hours: "22:00-07:00", timezone: Europe/Berlin}
test_mode: true
admins: [hpc-admins@example.org, "@ops"]
templates: /etc/gpulens/notify-templates
state: /srv/notify
dashboard: https://gpulens.example.org/
"""


def test_every_key_is_read(tmp_path):
    path = tmp_path / "notify.yaml"
    path.write_text(FULL)
    config = load_config(str(path))
    assert config.source == str(path)
    assert config.smtp is not None
    assert (config.smtp.host, config.smtp.port, config.smtp.security, config.smtp.timeout) == (
        "smtp.example.org",
        587,  # STARTTLS' port, security's default
        "starttls",
        60.0,
    )
    assert (config.smtp.username, config.smtp.password_env, config.smtp.sender) == (
        "gpulens",
        "GPULENS_SMTP_PASSWORD",
        "gpulens <gpulens@example.org>",
    )
    assert [(w.kind, w.channel, w.username, w.url_file) for w in config.webhooks] == [
        ("mattermost", "gpu-jobs", "gpulens", ""),
        ("slack", "", "gpulens", "/etc/gpulens/slack-hook"),
    ]
    assert (config.addresses.map_file, config.addresses.gecos) == ("owners.yaml", False)
    assert config.cooldown == 3 * 86_400 and config.quiet_hours == QuietHours("22:00-07:00", "Europe/Berlin")
    assert config.test_mode and config.admins == ("hpc-admins@example.org", "@ops")
    assert (config.templates, config.state, config.dashboard) == (
        "/etc/gpulens/notify-templates",
        "/srv/notify",
        "https://gpulens.example.org",
    )


def test_without_a_file_the_built_in_settings():
    config = Config()
    assert (config.smtp, config.webhooks, config.cooldown, config.quiet_hours) == (None, (), 7 * 86_400, None)
    assert config.addresses.gecos and config.state == "/var/lib/gpulens/notify"


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ("smtp: {host: h}\n", "smtp: missing key 'from'; add it"),
        ("- smtp\n- webhooks\n", "expected a mapping, got a list; write it as key: value lines"),
        (
            "smtp: {host: 'smtp.example.org:25', from: a@example.org}\n",
            "smtp.host: 'smtp.example.org:25' holds a port; write host: smtp.example.org and port: 25",
        ),
        ("smtp: {host: ' ', from: a@example.org}\n", "smtp.host: expected a non-empty string"),
        ("smtp: {host: h, from: gpulens}\n", "smtp.from: 'gpulens' is not an address; write e.g. 'gpulens <gpulens"),
        (
            "smtp: {host: h, from: a@example.org, security: ssl}\n",
            "smtp.security: unknown value 'ssl'; use one of none",
        ),
        ("smtp: {host: h, from: a@example.org, port: 0}\n", "smtp.port: must be between 1 and 65535, got 0"),
        (
            "smtp: {host: h, from: a@example.org, password: x}\n",
            "smtp: unknown key 'password'; did you mean 'password_env'?",
        ),
        (
            "smtp: {host: h, from: a@example.org, username: u}\n",
            "smtp.username: is given without password_file or password_env; give one of them",
        ),
        (
            "smtp: {host: h, from: a@example.org, username: u, password_file: f, password_env: E}\n",
            "smtp.password_env: is given with password_file; keep one",
        ),
        ("smtp: {host: h, from: a@example.org, timeout: soon}\n", "smtp.timeout: 'soon' is not a duration"),
        ("webhooks: [{kind: teams, url: 'http://x'}]\n", "webhooks[0].kind: unknown value 'teams'; use one of slack"),
        ("webhooks: [{kind: slack}]\n", "webhooks[0]: gives no url; give one of url, url_file, url_env"),
        ("webhooks: [{kind: slack, url: 'hooks.slack.com/x'}]\n", "webhooks[0].url: is not an http:// or https:// URL"),
        ("addresses: {domain_template: example.org}\n", "addresses.domain_template: 'example.org' does not make an"),
        ("addresses: {chat_template: '{user}'}\n", "addresses.chat_template: '{user}' does not make an address"),
        ("addresses: {gecos: yes please}\n", "addresses.gecos: expected true or false"),
        ("cooldown: -1d\n", "cooldown: '-1d' must not be negative"),
        ("quiet_hours: {hours: '22:00-07:00'}\n", "quiet_hours: missing key 'timezone'"),
        ("quiet_hours: {hours: '10pm-7am', timezone: UTC}\n", "quiet_hours.hours: '10pm-7am' is not a span of hours"),
        ("quiet_hours: {hours: '22:00-22:00', timezone: UTC}\n", "quiet_hours.hours: starts and ends at the same"),
        ("quiet_hours: {hours: '22:00-07:00', timezone: Berlin}\n", "quiet_hours.timezone: unknown time zone 'Berlin'"),
        ("test_mode: true\n", "admins: is empty in test mode, which sends every message to the admins; list them"),
        ("admins: [ops]\n", "admins[0]: 'ops' is neither an e-mail address nor a chat mention"),
        ("dashboard: gpulens.example.org\n", "dashboard: is not the dashboard's base URL"),
        ("cooldwn: 1d\n", "unknown key 'cooldwn'; did you mean 'cooldown'?"),
        ("smtp: [\n", "invalid YAML"),
    ],
)
def test_a_mistake_is_one_line_naming_the_file_the_key_and_the_fix(tmp_path, document, said):
    path = tmp_path / "notify.yaml"
    path.write_text(document)
    with pytest.raises(ConfigError) as failed:
        load_config(str(path))
    assert str(failed.value).startswith(f"config file {path}: ") and said in str(failed.value), str(failed.value)
    assert "\n" not in str(failed.value)


def at(zone: str, *when: int) -> float:
    return datetime.datetime(*when, tzinfo=zoneinfo.ZoneInfo(zone)).timestamp()


@pytest.mark.parametrize(
    ("local", "ends"),
    [
        ((2026, 7, 1, 21, 59), None),
        ((2026, 7, 1, 22, 0), (2026, 7, 2, 7, 0)),
        ((2026, 7, 1, 23, 30), (2026, 7, 2, 7, 0)),
        ((2026, 7, 2, 3, 0), (2026, 7, 2, 7, 0)),
        ((2026, 7, 2, 6, 59), (2026, 7, 2, 7, 0)),
        ((2026, 7, 2, 7, 0), None),
        ((2026, 7, 2, 12, 0), None),
        # The night the clocks go forward (2026-03-29, 02:00 -> 03:00 in Berlin): the end is still 07:00 local.
        ((2026, 3, 28, 23, 0), (2026, 3, 29, 7, 0)),
    ],
)
def test_quiet_hours_across_midnight_end_at_their_local_time(local, ends):
    quiet = QuietHours("22:00-07:00", "Europe/Berlin")
    until = quiet.until(at("Europe/Berlin", *local))
    assert until == (at("Europe/Berlin", *ends) if ends else None)


def test_quiet_hours_within_one_day():
    quiet = QuietHours("12:00-13:30", "UTC")
    assert quiet.until(at("UTC", 2026, 7, 1, 11, 59)) is None
    assert quiet.until(at("UTC", 2026, 7, 1, 12, 0)) == at("UTC", 2026, 7, 1, 13, 30)
    assert quiet.until(at("UTC", 2026, 7, 1, 13, 30)) is None
