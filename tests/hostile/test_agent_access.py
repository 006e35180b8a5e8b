"""How tools reach agents (gpulens/credentials.py): any GPULENS_AGENT_* setting gives credentials or one
AccessError line, whatever the files it names hold, and a client built from them."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpulens.agentclient import AgentClient
from gpulens.credentials import BASIC_AUTH_FILE, CA_FILE, CERT_FILE, KEY_FILE, AccessError, agent_credentials
from tests.agent.webcerts import Pki
from tests.hostile.common import TEXT, hostile, one_line


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("agent-access")
    pki = Pki.make(folder)
    texts = {
        "userpw": "prometheus:s3cret\n",
        "nocolon": "prometheus\n",
        "colonfirst": ":pw",
        "empty": "",
        "lines": "a:b\nc:d\n",
        "pem-junk": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    }
    paths = [str(pki.ca_file), str(pki.client_cert), str(pki.client_key), str(pki.server_cert)]
    for name, text in texts.items():
        (folder / name).write_text(text)
        paths.append(str(folder / name))
    (folder / "binary").write_bytes(b"\xff\xfe\x00\x80")
    return [*paths, str(folder / "binary"), str(folder), str(folder / "absent"), "a\x00b", "", " "]


@hostile(200)
@given(st.data())
@example(data=None)
def test_any_agent_access_settings_give_credentials_or_one_line(files, data):
    names = (CA_FILE, CERT_FILE, KEY_FILE, BASIC_AUTH_FILE)
    cases = (
        [{name: "a\x00b"} for name in names]
        if data is None
        else [data.draw(st.dictionaries(st.sampled_from(names), st.one_of(st.sampled_from(files), TEXT), max_size=4))]
    )
    for environ in cases:
        try:
            credentials = agent_credentials(environ)
        except AccessError as error:
            one_line(error)
            continue
        AgentClient("http://127.0.0.1:10906", credentials, 1.0, unreachable="check the address")
