"""The upload limit, held while the request body streams in rather than after it has all arrived.

`UploadLimitHandler` comes first in ``FILE_UPLOAD_HANDLERS``: it counts the file bytes of a multipart body
as they arrive and stops the upload at the first chunk past ``HYDRA_MAX_UPLOAD_MB``. What was received is
discarded with the temporary file, nothing is stored, and the request says so (`upload_refused`), for the
view to answer with the limit. A body only a little over the limit is read to its end (and thrown away) so
that the browser shows that answer; a far larger one is cut off where it stands.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest

DRAIN_MAX_BYTES = 16 << 20  # past the limit by more than this, the connection is reset instead of drained


class UploadLimitHandler(FileUploadHandler):
    def handle_raw_input(self, input_data: Any, META: Any, content_length: int, boundary: Any,
                         encoding: str | None = None) -> None:
        self.body_length = content_length
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        limit = settings.HYDRA.max_upload_bytes
        if self.received > limit:
            self.request.upload_refused = True  # type: ignore[union-attr]
            raise StopUpload(connection_reset=self.body_length > limit + DRAIN_MAX_BYTES)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the next handlers store the file


def upload_refused(request: HttpRequest) -> bool:
    """Whether `UploadLimitHandler` stopped this request's upload at the limit."""
    if request.method == "POST":
        request.POST  # noqa: B018 -- parsing the body is what runs the upload handlers
    return getattr(request, "upload_refused", False)
