"""moto's S3 server with object writes made atomic, as S3's own are.

moto checks ``If-None-Match: *`` and then stores the object in two steps, and its server
handles requests on threads. Two racing create-only PUTs can both pass the check and both get
200: CI saw two winners of one commit version. Real S3 decides the race atomically, and the
commit protocol (storage.objects.put_if_absent) relies on that. So this launcher wraps the
handlers that check a precondition and then write (PUT object, complete multipart upload) in
one lock, then runs moto's own server entry point. Reads and other requests stay concurrent.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from moto.s3.responses import S3Response
from moto.server import main

_WRITE_LOCK = threading.Lock()


def _serialised(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _WRITE_LOCK:
            return method(*args, **kwargs)

    return locked


S3Response.put_object = _serialised(S3Response.put_object)  # type: ignore[method-assign]
S3Response._key_response_post = _serialised(  # type: ignore[method-assign]
    S3Response._key_response_post)

if __name__ == "__main__":
    main()
