"""`Connection`: one HTTP session with a Hydra server's API, and what every call shares: the base URL checked,
the token and team headers, the answer turned into JSON or into a `HydraError`, a 429 waited out, pages walked
and files streamed to disk. `Hydra` is a `Connection` with the API's resources on it; the resources call through
the connection alone, so they need not know `Hydra`."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import requests
import urllib3

API_PREFIX = "/api/v1"
TEAM_HEADER = "X-Hydra-Team"
PAGE_SIZE = 100  # the largest page the server gives
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRIES = 3  # tries again after a 429 this many times
MAX_RETRY_AFTER_S = 60.0  # the server's rate limit counts per minute: never a longer wait than that
CHUNK_BYTES = 1 << 16

Progress = Callable[[int, int | None], None]  # bytes so far, and the total when the server says it
log = logging.getLogger("hydra_client")


class HydraError(Exception):
    """The server refused a call (`status`, its ``detail`` and field ``errors``), or work it did failed
    (`status` None: a dataset whose tokenizer failed, a model that could not be packed, a wait that ran out)."""

    def __init__(self, status: int | None, detail: str, errors: Mapping[str, list[str]] | None = None, *,
                 retry_after: float | None = None) -> None:
        self.status = status
        self.detail = detail
        self.errors = {field: list(messages) for field, messages in (errors or {}).items()}
        self.retry_after = retry_after
        super().__init__(self.describe())

    def describe(self) -> str:
        """The detail, then each field error named by its field (indented). A detail that only repeats the field
        errors (a form's messages, joined) gives way to them, so that nothing is said twice."""
        fields = [message if field == "__all__" else f"{field}: {message}"
                  for field, messages in self.errors.items() for message in messages]
        repeated = " ".join(m for messages in self.errors.values() for m in messages)
        if fields and self.detail.strip() == repeated.strip():
            head, rest = fields[0], fields[1:]
        else:
            head, rest = self.detail, fields
        return "\n".join([head, *("  " + line.replace("\n", "\n    ") for line in rest)])


class HydraUnreachable(HydraError):
    """The server could not be reached, or did not answer in time."""

    def __init__(self, detail: str) -> None:
        super().__init__(None, detail)


def api_base(url: str) -> str:
    """The server's root URL without a trailing slash or the API's prefix, checked to be HTTP(S)."""
    url = url.strip().rstrip("/")
    url = url.removesuffix(API_PREFIX)
    if not re.match(r"https?://[^/]+", url):
        raise ValueError(f"{url or '(empty)'} is not a server address: give it as http://host:port or https://host.")
    return url


def sends_in_clear(url: str) -> bool:
    """Whether requests to the server at `url` (an `api_base`) cross a network unencrypted: plain http:// to a
    host other than this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    parsed = urlsplit(url)
    if parsed.scheme != "http":
        return False
    host = (parsed.hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return True


def _header(value: str, what: str) -> str:
    """`value` stripped, checked to be printable ASCII as an HTTP header takes it (a token pasted with a stray
    character would otherwise fail deep inside the HTTP library)."""
    value = value.strip()
    if not value.isascii() or not value.isprintable():
        raise ValueError(f"The {what} has characters no {what} has: paste it again, as plain text.")
    return value


def _retry_after(response: requests.Response) -> float:
    """The seconds the server asks to wait (its Retry-After), within 0 to `MAX_RETRY_AFTER_S`."""
    try:
        seconds = float(response.headers.get("Retry-After", "1"))
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def error_from(response: requests.Response) -> HydraError:
    """The `HydraError` of a refused answer: the API's ``{"detail", "errors"}``, or a plain line for anything
    else (a proxy's page, a server that is not Hydra)."""
    retry_after = _retry_after(response) if response.status_code == 429 else None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        errors = body.get("errors") if isinstance(body.get("errors"), dict) else {}
        return HydraError(response.status_code, body["detail"], errors, retry_after=retry_after)
    detail = f"HTTP {response.status_code} {response.reason or ''}".strip()
    if response.status_code == 404:
        detail += f" at {response.url}: is this the address of a Hydra server?"
    return HydraError(response.status_code, detail, retry_after=retry_after)


def attachment_name(header: str, fallback: str) -> str:
    """The file name a Content-Disposition header gives, reduced to a bare name (no folders)."""
    match = re.search(r"filename\*\s*=\s*(?:[\w-]+'[\w-]*')?\"?([^\";]+)", header, re.IGNORECASE)
    if match:
        name = unquote(match.group(1))
    else:
        match = re.search(r"filename\s*=\s*\"?([^\";]+)", header, re.IGNORECASE)
        name = match.group(1) if match else ""
    name = name.replace("\\", "/").rsplit("/", 1)[-1].strip()
    return name if name not in ("", ".", "..") else fallback


def _rewind(files: Mapping[str, Any] | None) -> None:
    """Put every file of a multipart body back at its start, so that a retried upload sends it whole."""
    for value in (files or {}).values():
        handle = value[1] if isinstance(value, tuple) else value
        if hasattr(handle, "seek"):
            handle.seek(0)


def _query(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Query parameters without the unset ones (None), so that the server applies its defaults."""
    return {key: value for key, value in (params or {}).items() if value is not None}


class Connection:
    """One HTTP session with a Hydra server's API, as `token` sees it in `team`: the calls every resource makes.
    `Hydra` names what its arguments mean."""

    def __init__(self, url: str, token: str, team: int | str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES) -> None:
        self.url = api_base(url)
        self.timeout = timeout
        self.retries = retries
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {_header(token, 'token')}",
                                     "Accept": "application/json", "User-Agent": "hydra-client/1"})
        if team is not None and str(team).strip():
            self.session.headers[TEAM_HEADER] = _header(str(team), "team")

    def close(self) -> None:
        self.session.close()

    def api_url(self, path: str) -> str:
        """The absolute URL of an API path, given with or without the ``/api/v1`` prefix."""
        path = "/" + path.lstrip("/")
        return self.url + (path if path.startswith(API_PREFIX + "/") else API_PREFIX + path)

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None,
                data: Mapping[str, Any] | None = None, files: Mapping[str, Any] | None = None,
                stream: bool = False) -> requests.Response:
        """Send one call and return its answer, or raise `HydraError` / `HydraUnreachable`; waits out a 429 up
        to `retries` times."""
        url = self.api_url(path)
        attempt = 0
        while True:
            _rewind(files)
            try:
                response = self.session.request(method, url, params=_query(params), json=json, data=data,
                                                files=files, stream=stream, timeout=self.timeout)
            except requests.Timeout:
                raise HydraUnreachable(f"{self.url} did not answer within {self.timeout:g} s.") from None
            except requests.RequestException as error:
                raise HydraUnreachable(f"{self.url} cannot be reached: {_reason(error)}") from None
            if response.status_code == 429 and attempt < self.retries:
                response.close()
                wait = _retry_after(response)
                log.warning("Too many requests with this token: trying again in %g s.", wait)
                time.sleep(wait)
                attempt += 1
                continue
            if response.status_code < 400:
                return response
            error = error_from(response)
            response.close()
            del response  # the error's traceback may outlive the call: it must not hold the connection open
            raise error

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """`request`, and the answer's JSON."""
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise HydraError(response.status_code, f"The answer to {method} {path} is not JSON: is {self.url} "
                                                   "a Hydra server?") from None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, json=body if body is not None else {})

    def paginate(self, path: str, params: Mapping[str, Any] | None = None, page_size: int = PAGE_SIZE,
                 ) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list (``{"items", "count"}``), fetching one page at a time as it goes."""
        offset = 0
        while True:
            page = self.call("GET", path, params={**(params or {}), "limit": page_size, "offset": offset})
            items = page["items"]
            yield from items
            offset += len(items)
            if not items or offset >= page["count"]:
                return

    def download_file(self, path: str, dest_dir: str | os.PathLike[str], *, fallback_name: str,
                      progress: Progress | None = None) -> Path:
        """Stream the file at `path` into `dest_dir` under the name the server gives it; written beside as a
        ``.part`` file and renamed once complete, so that a broken download never looks like a whole one."""
        folder = Path(dest_dir)
        folder.mkdir(parents=True, exist_ok=True)
        with self.request("GET", path, stream=True) as response:
            name = attachment_name(response.headers.get("Content-Disposition", ""), fallback_name)
            total = int(response.headers["Content-Length"]) if "Content-Length" in response.headers else None
            target, partial = folder / name, folder / f".{name}.part"
            done = 0
            if progress:
                progress(done, total)
            try:
                with partial.open("wb") as out:
                    # The bytes as sent: a proxy's Content-Encoding must not turn the .tar.gz into a .tar.
                    for chunk in response.raw.stream(CHUNK_BYTES, decode_content=False):
                        out.write(chunk)
                        done += len(chunk)
                        if progress:
                            progress(done, total)
            except (requests.RequestException, urllib3.exceptions.HTTPError) as error:
                partial.unlink(missing_ok=True)
                raise HydraUnreachable(f"The download from {self.url} broke off: {_reason(error)}") from None
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        if total is not None and done != total:
            partial.unlink(missing_ok=True)
            raise HydraUnreachable(f"The download from {self.url} broke off after {done} of {total} bytes.")
        partial.replace(target)
        return target


def _reason(error: BaseException) -> str:
    """The innermost reason of a requests error ("Connection refused"), without urllib3's retry wording."""
    inner = error
    for _ in range(8):
        deeper = getattr(inner, "reason", None)
        if not isinstance(deeper, BaseException) and inner.args and isinstance(inner.args[0], BaseException):
            deeper = inner.args[0]
        if not isinstance(deeper, BaseException) or deeper is inner:
            break
        inner = deeper
    text = str(inner)
    match = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    return match.group(1).strip() if match else (text or type(error).__name__)
