"""The errors hf_posenc raises when the Hub refuses or fails, with every token taken out of them.

A Hub server (or a proxy) may echo the request's ``Authorization: Bearer <token>`` header in its error, and the
Hub client's exception keeps the request (headers included) in ``response``. So an error of the Hub is never
re-raised or chained: :func:`call_hub` raises a new :class:`HubError` with a redacted message, outside the
``except`` block, so that neither its ``__cause__`` nor its ``__context__`` holds the original. A name written as
a path to nothing is refused before the Hub is asked (:func:`refuse_missing_folder`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from huggingface_hub import get_token

T = TypeVar("T")

# What a credential looks like wherever it is echoed: an Authorization header's value, or a Hugging Face token.
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9\-._~+/]+=*", flags=re.IGNORECASE)  # RFC 6750's b64token
_HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{10,}")
_HINTS = {
    401: "\nCheck the token: log in with `hf auth login`, set HF_TOKEN, or pass `token`.",
    403: "\nThe token may not do this: a push needs write access to the namespace, a gated model granted access.",
    409: "\nThe repo already exists; pass `exist_ok` to push a new commit to it.",
}


class HubError(RuntimeError):
    """The Hub refused or failed a request. The message never contains the token.

    Attributes:
        status_code (`int`, *optional*): HTTP status of the failing answer, when there was one.
    """

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class HubPushError(HubError):
    """A push failed; nothing was changed locally and nothing was committed."""


def redact(text: str, token: str | bool | None = None) -> str:
    """``text`` with ``token``, the saved login's token, any ``Bearer`` credential and anything shaped like a
    Hugging Face token (``hf_`` and 10 or more letters and digits) replaced by ``***``.

    Args:
        text (`str`): a message about to be shown.
        token (`str`, *optional*): the token the request was made with (``True``, transformers' "the saved
            login", or None: only the saved login's).
    """
    return _redacted(text, (token, _login_token()))


def _redacted(text: str, secrets: tuple[Any, ...]) -> str:
    """``text`` with each of ``secrets`` (the non-empty strings among them) and the credential patterns replaced."""
    for secret in secrets:
        if isinstance(secret, str) and secret:
            text = text.replace(secret, "***")
    return _HF_TOKEN.sub("***", _BEARER.sub(r"\1***", text))


# keys naming a secret: token, hf_token, use_auth_token, api_key, ... (not tokens, tokenizer, max_new_tokens)
SECRET_KEY = re.compile(r"(.*_)?(token|api_?key|password|passwd|secret|credentials?)", flags=re.IGNORECASE)


def redact_secrets(value: Any) -> Any:
    """``value`` (JSON-like: a results record, a run's arguments) with every entry whose key names a secret
    (``token``, ``hf_token``, ``use_auth_token``, ``api_key``, ...) replaced by ``"***"``, and every string
    :func:`redact`-ed: what a file written or pushed may hold."""
    login = _login_token()  # read once, not per string

    def clean(item: Any) -> Any:
        if isinstance(item, dict):
            return {key: "***" if SECRET_KEY.fullmatch(str(key)) else clean(entry) for key, entry in item.items()}
        if isinstance(item, list | tuple):
            return [clean(entry) for entry in item]
        return _redacted(item, (login,)) if isinstance(item, str) else item

    return clean(value)


def _login_token() -> str | None:
    """The saved login's token, or None when it cannot be read (a failed OIDC exchange raises): redaction must not
    fail while an error is reported, and the patterns still apply."""
    try:
        return get_token()
    except Exception:
        return None


def refuse_missing_folder(name: str) -> None:
    """Raise ``FileNotFoundError`` when ``name`` is written as a path (it starts with ``/``, ``.`` or ``~``, holds a
    backslash or more than one ``/``: no Hub id does) and nothing is there. Asked for it, the Hub would answer
    that the name is no valid repo id."""
    if (name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1) and not Path(name).exists():
        raise FileNotFoundError(f"{name!r}: no such file or folder (a path, not a Hub id)")


def call_hub(call: Callable[[], T], error_type: type[HubError], action: str, token: str | bool | None) -> T:
    """``call()``, with a failure of the Hub raised as ``error_type("<action> failed: <the error>")``, redacted.

    A failure of the Hub is any error whose chain holds an ``httpx2.HTTPError`` (``HfHubHTTPError`` is one;
    transformers wraps them in ``OSError``); other errors pass through unchanged. The notes of the error
    (``add_note``) end the message.

    Args:
        call (`Callable[[], T]`): the requests to make.
        error_type (`type[HubError]`): what to raise.
        action (`str`): what was being done, for the message (``"Pushing to 'me/model'"``).
        token (`str`, *optional*): the token the requests carry, redacted with :func:`redact`'s patterns.
    """
    try:
        return call()
    except Exception as error:
        http_errors = [link for link in _chain(error) if isinstance(link, httpx2.HTTPError)]
        if not http_errors:
            raise
        status = getattr(getattr(http_errors[0], "response", None), "status_code", None)
        notes = "".join(f"\n{note}" for note in getattr(error, "__notes__", ()))  # a branch left behind, say
        message = redact(f"{action} failed: {type(error).__name__}: {error}{notes}", token)
        failure = error_type(message + _HINTS.get(status, ""), status_code=status)
    raise failure  # here, not in the except block: the original (and its token) is not the __context__


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error`` and the errors it was raised from or while handling."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__
