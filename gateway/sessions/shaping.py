"""The stored operator message: what a turn's `history` opens with (docs/protocol.md §6).

`shape_input_message` builds the transcript's view of a claim's `input_message` (an A2A
message) field by field; nothing the client sent is copied through wholesale, so the
result is bounded and always JSON-serialisable whatever the client sent. Pure: no I/O.

Rules, in order:

- Not a JSON object, `role` not a string, `parts` not a list, an id that is not a string
  (or longer than 256 chars), `metadata` present but not an object, a part that is not
  an object, a text part whose `text` is not a string, or a file part whose `file` is
  not an object -> the message cannot be shaped: `None`, nothing is stored, and the turn
  still runs (shaping never raises).
- `metadata.origin` set (anything but null/absent): a server-fired turn (scheduler,
  watch, background resume); its prompt is machine text that was never a bubble, so
  `None` is returned and the turn history stays empty.
- Kept: `kind: "message"`, `messageId`, `contextId`, `taskId` (strings only), `role`, and
  from `metadata` only `incognito`, `hidden`, `hitl_resume`, `origin` (each kept only
  when its compact JSON is at most 2 KiB). `metadata` is omitted when none is kept.
- `metadata.display` (a string): the console marked the send because it prepended
  attachment context for the model; the display text is stored *instead of* every text
  part, as one text part, first. Only the metadata field is honoured (A2A messages carry
  client extensions in `metadata`; a top-level `display` is ignored like any other
  unknown field), and `display` itself is not stored.
- `metadata.hidden` truthy (an approval/dismissal resume, regenerate, goal kickoff): the
  message is stored without any text part (no bubble), keeping ids, role, the
  whitelisted metadata (the `incognito` stamp) and attachment shells.
- Text is capped at 16,000 characters (Unicode code points) in total over all text
  parts: the part crossing the cap is cut and later text parts are dropped.
- A file part becomes a shell `{"kind": "file", "file": {"name", "mimeType", "uri"}}`:
  `name`/`mimeType` kept when strings (cut to 256 chars); `uri` kept only when it is a
  plain `http(s)://host/...` link of at most 2,048 chars without whitespace/controls.
  An inline payload is recorded as `file.omittedBytes` (int, the payload's byte size):
  base64 `bytes` -> decoded size, a `data:` URI -> decoded size of its payload. Any
  other URI (`blob:`, `file:`, `javascript:`...) is dropped without a size (the bytes
  never reached the server).
- A data part (an inline JSON blob) becomes `{"kind": "data", "omittedBytes": n}`, n
  being the size of its compact JSON encoding.
- Parts of an unknown kind are dropped; at most 64 non-text parts are kept.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import unquote_to_bytes, urlsplit

import orjson

from ..values import encode_json

TEXT_CAP: Final = 16_000
METADATA_KEYS: Final = ("incognito", "hidden", "hitl_resume", "origin")
MAX_METADATA_VALUE_BYTES: Final = 2_048
MAX_ID_CHARS: Final = 256
MAX_NAME_CHARS: Final = 256
MAX_URI_CHARS: Final = 2_048
MAX_ATTACHMENTS: Final = 64

_BAD_URI_CHARS: Final = re.compile(r"[\x00-\x20\x7f]")


class _Unshapeable(Exception):
    pass


def shape_input_message(message: object) -> dict[str, Any] | None:
    """The stored copy of `message`, or None when it cannot (or must not) be stored."""
    try:
        return _shape(message)
    except _Unshapeable:
        return None
    except Exception:  # never raise: a turn runs whatever the client sent
        return None


def _shape(message: object) -> dict[str, Any] | None:
    if not isinstance(message, dict):
        raise _Unshapeable
    raw_meta = message.get("metadata")
    if raw_meta is None:
        raw_meta = {}
    if not isinstance(raw_meta, dict):
        raise _Unshapeable
    if raw_meta.get("origin") is not None:
        return None  # server-fired turn: its prompt was never a bubble

    role = message.get("role")
    if not isinstance(role, str) or not role or len(role) > MAX_ID_CHARS:
        raise _Unshapeable
    parts = message.get("parts")
    if not isinstance(parts, list):
        raise _Unshapeable

    out: dict[str, Any] = {"kind": "message"}
    for key in ("messageId", "contextId", "taskId"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > MAX_ID_CHARS:
            raise _Unshapeable
        out[key] = value
    out["role"] = role

    hidden = bool(raw_meta.get("hidden"))
    display = raw_meta.get("display")
    shaped_parts: list[dict[str, Any]] = []
    texts: list[str] = []
    attachments = 0
    for part in parts:
        if not isinstance(part, dict):
            raise _Unshapeable
        kind = part.get("kind")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise _Unshapeable
            texts.append(text)
        elif kind == "file":
            shell = _file_shell(part.get("file"))
            if attachments < MAX_ATTACHMENTS:
                shaped_parts.append(shell)
                attachments += 1
        elif kind == "data" and attachments < MAX_ATTACHMENTS:
            size = len(encode_json(part.get("data")))
            shaped_parts.append({"kind": "data", "omittedBytes": size})
            attachments += 1
        # unknown kinds are dropped

    if not hidden:
        if isinstance(display, str):
            texts = [display]
        text_parts = [{"kind": "text", "text": t} for t in _cap_texts(texts)]
        shaped_parts = text_parts + shaped_parts
    out["parts"] = shaped_parts

    meta: dict[str, Any] = {}
    for key in METADATA_KEYS:
        if key in raw_meta:
            value = raw_meta[key]
            try:
                encoded = encode_json(value)
            except TypeError:
                continue
            if len(encoded) <= MAX_METADATA_VALUE_BYTES:
                meta[key] = _detached(encoded)
    if meta:
        out["metadata"] = meta
    return out


def _detached(encoded: bytes) -> Any:
    return orjson.loads(encoded)  # a fresh copy: later mutation of the input cannot leak in


def _cap_texts(texts: list[str]) -> list[str]:
    kept: list[str] = []
    budget = TEXT_CAP
    for text in texts:
        if budget <= 0:
            break
        piece = text[:budget]
        budget -= len(piece)
        kept.append(piece)
    return kept


def _file_shell(file: object) -> dict[str, Any]:
    if not isinstance(file, dict):
        raise _Unshapeable
    shell: dict[str, Any] = {}
    for key in ("name", "mimeType"):
        value = file.get(key)
        if isinstance(value, str):
            shell[key] = value[:MAX_NAME_CHARS]
    omitted: int | None = None
    raw_bytes = file.get("bytes")
    if raw_bytes is not None:
        omitted = _payload_size(raw_bytes)
    uri = file.get("uri")
    if isinstance(uri, str):
        if _is_plain_link(uri):
            shell["uri"] = uri
        elif uri[:5].lower() == "data:":
            omitted = (omitted or 0) + _data_uri_size(uri)
    if omitted is not None:
        shell["omittedBytes"] = omitted
    return {"kind": "file", "file": shell}


def _payload_size(value: object) -> int:
    if isinstance(value, str):
        return _base64_size(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    return len(encode_json(value))


def _base64_size(text: str) -> int:
    """Decoded size of base64 text without decoding it; non-base64 text counts as UTF-8."""
    compact = "".join(text.split())
    if compact and re.fullmatch(r"[A-Za-z0-9+/_-]*={0,2}", compact):
        pad = len(compact) - len(compact.rstrip("="))
        return max(len(compact) * 3 // 4 - pad, 0)
    return len(text.encode("utf-8", "surrogatepass"))


def _data_uri_size(uri: str) -> int:
    header, sep, payload = uri.partition(",")
    if not sep:
        return 0
    if header.lower().endswith(";base64"):
        return _base64_size(payload)
    return len(unquote_to_bytes(payload))


def _is_plain_link(uri: str) -> bool:
    if len(uri) > MAX_URI_CHARS or _BAD_URI_CHARS.search(uri):
        return False
    try:
        parts = urlsplit(uri)
    except ValueError:
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
