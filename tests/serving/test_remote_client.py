"""``RemoteEncoder`` without a server: where httpx is imported, and the key kept out of text
and pickles. Its behaviour on the wire (redirects, deadlines, broken answers) is tested against
hostile servers in tests/serving/test_remote_hostile.py, against a real ``magretrieve serve``
in tests/integrations/test_framework_remote.py."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest

from magretrieve.core.extras import MissingExtra
from magretrieve.serving.remote import RemoteEncoder

KEY = "S3CRclient-key-1234"


def test_httpx_is_imported_only_when_a_remote_client_is_made() -> None:
    code = (
        "import sys, magretrieve, magretrieve.serving.remote, magretrieve.integrations._encoder\n"
        "from magretrieve.integrations._encoder import LazyEncoder\n"
        "LazyEncoder(url='http://127.0.0.1:1')\n"  # opened on first use: no client yet
        "before = 'httpx' in sys.modules\n"
        "magretrieve.serving.remote.RemoteEncoder('http://127.0.0.1:1')\n"
        "print(before, 'httpx' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "True"]


def test_without_httpx_the_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(MissingExtra) as e:
        RemoteEncoder("http://127.0.0.1:1", KEY)
    assert str(e.value) == (
        "the remote embedding client needs httpx: pip install 'magretrieve[langchain]'; "
        "or 'magretrieve[llama-index]' or 'magretrieve[haystack]'"
    )


def test_the_key_is_in_no_text_and_the_client_is_not_pickled() -> None:
    with RemoteEncoder("http://127.0.0.1:1", KEY, timeout=3) as remote:
        assert repr(remote) == "RemoteEncoder(http://127.0.0.1:1, api_key=set, timeout=3)"
        assert KEY not in str(remote)
        for dump in (pickle.dumps, copy.deepcopy):
            with pytest.raises(TypeError, match="not pickled: it holds the server's API key"):
                dump(remote)


def test_a_key_http_cannot_carry_and_a_closed_client_are_one_line_errors() -> None:
    from magretrieve.core.errors import ConfigError
    from magretrieve.serving.remote import RemoteEncoderError

    for bad in ("kéy-1234", "key\n1234", "key\x001234"):
        with pytest.raises(ConfigError, match="api_key must be printable ASCII") as e:
            RemoteEncoder("http://127.0.0.1:1", bad)
        assert bad not in str(e.value)
    remote = RemoteEncoder("http://127.0.0.1:1", KEY)
    remote.close()
    with pytest.raises(RemoteEncoderError, match=r"^GET http://127\.0\.0\.1:1/info: this Remote"):
        remote.info()
