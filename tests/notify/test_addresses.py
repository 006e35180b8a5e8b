"""Owners to addresses: GECOS read from literal passwd lines, each source's place in the order of precedence,
leads, `getent` run for real, and the map file's mistakes."""

from __future__ import annotations

import pytest

from gpulens.checks import read
from gpulens.notify.addresses import AddressBook, Owner, Recipients, gecos_email, getent_passwd, load_map
from gpulens.notify.config import AddressSettings, ConfigError

MAP = """\
users:
  alice: {email: alice@lab.example.org, chat: "@alice"}
  dave: {chat: ["@dave", "<@U024BE7LH>"]}
accounts:
  physics: {email: physics-gpu@example.org, lead: carol}
  chem: {email: [chem@example.org], chat: "@chem", lead: pi@chem.example.org}
  bio: {email: bio@example.org}
  ml: {lead: "@mlr"}
namespaces:
  vision: {email: vision-team@example.org, chat: "@vision"}
"""

PASSWD = {
    "alice": "alice:x:1000:1000:Alice,,,,alice@gecos.example.org:/home/alice:/bin/bash\n",
    "bob": "bob:x:1001:1001:Bob Builder,Room 4,+1 555,,bob@gecos.example.org:/home/bob:/bin/bash\n",
    "carol": "carol:x:1002:1002:Carol Lead <carol@gecos.example.org>:/home/carol:/bin/zsh\n",
    "erin": "erin:x:1003:1003:Erin,,,:/home/erin:/bin/bash\n",
}


@pytest.mark.parametrize(
    ("line", "user", "found"),
    [
        ("bob:x:1001:1001:Bob Builder,Room 4,+1 555,,bob@example.org:/home/bob:/bin/bash\n", "bob", "bob@example.org"),
        ("bob:x:1001:1001:bob@example.org:/home/bob:/bin/sh", "bob", "bob@example.org"),
        ("bob:x:1:1:Bob <bob@example.org>,Room 4:/home/bob:/bin/sh", "bob", "bob@example.org"),
        ("bob:x:1:1: Bob , bob@example.org :/home/bob:/bin/sh", "bob", "bob@example.org"),
        ("bob:x:1:1:Bob Builder,Room 4,,:/home/bob:/bin/sh", "bob", ""),  # no address: Debian's adduser
        ("bob:x:1:1:Bob at example.org,@bob:/home/bob:/bin/sh", "bob", ""),
        (
            "bob:x:1:1:bob@example.org,alt@example.org:/h:/s\nbob:x:1:1:other@example.org:/h:/s\n",
            "bob",
            "bob@example.org",
        ),
        ("root:x:0:0:root@example.org:/root:/bin/sh", "0", ""),  # `getent passwd 0` answers for UID 0
        ("bob:x:1:1:bob@example.org", "bob", ""),  # cut short
        ("", "bob", ""),
    ],
)
def test_the_address_in_a_gecos_field(line, user, found):
    assert gecos_email(line, user) == found


def book(tmp_path, calls: list[str] | None = None, **settings) -> AddressBook:
    path = tmp_path / "owners.yaml"
    path.write_text(MAP)
    calls = [] if calls is None else calls

    def getent(user: str) -> str | None:
        calls.append(user)
        return PASSWD.get(user)

    return AddressBook(read({"map_file": str(path), **settings}, "addresses", AddressSettings), getent=getent)


def test_each_source_in_its_order_of_precedence(tmp_path):
    calls: list[str] = []
    b = book(tmp_path, calls, domain_template="{user}@example.org", chat_template="@{user}")
    # 1. the map file's user, before the job's own word and GECOS, which is not even asked
    assert b.owner(Owner(user="alice", named="alice@annotation.example.org")) == Recipients(
        ("alice@lab.example.org",), ("@alice",), "map file users.alice", "map file users.alice"
    )
    assert calls == []
    # 2. the job's own word, before GECOS
    to = b.owner(Owner(user="bob", named="bob@annotation.example.org"))
    assert (to.emails, to.email_source) == (("bob@annotation.example.org",), "the job's own owner address")
    # 3. GECOS, before the domain template
    to = b.owner(Owner(user="bob", account="physics"))
    assert (to.emails, to.email_source) == (("bob@gecos.example.org",), "the GECOS field of bob")
    assert (to.handles, to.handle_source) == (("@bob",), "addresses.chat_template")
    # 4. the domain template, for a user whose GECOS holds no address, before the account's group address
    to = b.owner(Owner(user="erin", account="physics", namespace="vision"))
    assert (to.emails, to.email_source) == (("erin@example.org",), "addresses.domain_template")
    assert calls == ["bob", "erin"]


def test_a_group_address_where_the_person_has_none(tmp_path):
    b = book(tmp_path, gecos=False)
    # A pod run by a service account: the namespace's entry, before the account's.
    to = b.owner(Owner(user="system:serviceaccount:vision:default", account="physics", namespace="vision"))
    assert to == Recipients(
        ("vision-team@example.org",), ("@vision",), "map file namespaces.vision", "map file namespaces.vision"
    )
    to = b.owner(Owner(user="zed", account="chem"))
    assert to == Recipients(("chem@example.org",), ("@chem",), "map file accounts.chem", "map file accounts.chem")
    # The map file's user with handles only gets the account's e-mail address.
    to = b.owner(Owner(user="dave", account="bio"))
    assert to == Recipients(
        ("bio@example.org",), ("@dave", "<@U024BE7LH>"), "map file accounts.bio", "map file users.dave"
    )
    # A handle the job names itself.
    assert b.owner(Owner(user="zed", named="@zed")).handles == ("@zed",)


def test_no_address_says_where_it_looked_and_the_fix(tmp_path):
    b = book(tmp_path)
    owner = Owner(user="erin", account="nowhere")
    assert not b.owner(owner)
    assert b.missing(owner) == (
        "no address for user erin, account nowhere (looked in the map file and GECOS); add them to the map file "
        "(addresses.map_file) or set addresses.domain_template"
    )
    # A user name the template cannot make an address of: it is no user name, whatever the map file says.
    b = book(tmp_path, gecos=False, domain_template="{user}@example.org")
    for user in ("bad name", "alice;rm"):
        assert b.owner(Owner(user=user)) == Recipients()
        assert b.missing(Owner(user=user)) == (
            f"no address for user {user}: {user!r} is not a user name (addresses.domain_template makes no address of "
            "it); give the owner's user name"
        )


def test_an_accounts_lead_by_user_name_address_or_chat_handle(tmp_path):
    b = book(tmp_path)
    assert b.lead("physics") == Recipients(("carol@gecos.example.org",), (), "the GECOS field of carol", "")
    assert b.lead("chem") == Recipients(("pi@chem.example.org",), (), "map file accounts.chem.lead", "")
    assert b.lead("ml") == Recipients((), ("@mlr",), "", "map file accounts.ml.lead")
    assert b.lead("bio") == Recipients() and b.lead("unknown") == Recipients()


def test_getent_for_real_and_without_getent(monkeypatch, tmp_path):
    line = getent_passwd("root")
    assert line is not None and line.startswith("root:x:0:0:")
    assert getent_passwd("no-such-user-gpulens-test") is None
    assert getent_passwd("--help") is None  # never an option
    monkeypatch.setenv("PATH", str(tmp_path))  # no getent here
    assert getent_passwd("root") is None
    # ... and the book goes on to the next source.
    b = AddressBook(read({"domain_template": "{user}@example.org"}, "addresses", AddressSettings))
    assert b.owner(Owner(user="root")).emails == ("root@example.org",)


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ("users: {alice: {email: alice}}\n", "users.alice.email: 'alice' is not an e-mail address"),
        ("users: {alice: {email: [a@example.org, 'b@x']}}\n", "users.alice.email[1]: 'b@x' is not an e-mail address"),
        ("users: {alice: {chat: alice}}\n", "users.alice.chat: 'alice' is not a chat mention; write '@alice'"),
        ("users: {alice: {lead: carol}}\n", "users.alice: unknown key 'lead'; use one of email, chat"),
        ("accounts: {physics: {mail: p@example.org}}\n", "accounts.physics: unknown key 'mail'; did you mean 'email'?"),
        ("people: {}\n", "owners.yaml: unknown key 'people'; use one of users, accounts, namespaces"),
        ("users: [alice]\n", "users: expected a mapping, got a list"),
    ],
)
def test_a_map_file_mistake_is_one_line_naming_the_file_and_the_key(tmp_path, document, said):
    path = tmp_path / "owners.yaml"
    path.write_text(document)
    with pytest.raises(ConfigError) as failed:
        load_map(str(path))
    assert str(failed.value).startswith(f"map file {path}: ") and said in str(failed.value)
    assert "\n" not in str(failed.value)
