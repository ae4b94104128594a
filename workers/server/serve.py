"""The uvicorn server ``durable server`` runs: uvicorn's, with a stop the waiting routes hear.

uvicorn stops by closing its listeners and waiting (``timeout_graceful_shutdown``) for the
requests in flight; then it cancels them, and each gets a plain-text 500. A route that waits
(an update's outcome, for up to a minute) was cut off so on every deploy, its caller left
without the update id it needs to go on waiting (a retry without it runs the update twice).
:class:`Server` sets :data:`~workers.server.endpoint.STOPPING` first: those routes answer at
their next look (within a second), as at their timeout.
"""

from __future__ import annotations

from types import FrameType

import uvicorn

from workers.server.endpoint import STOPPING

__all__ = ["Server"]


class Server(uvicorn.Server):
    """:class:`uvicorn.Server` whose stop sets :data:`~workers.server.endpoint.STOPPING` first."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        STOPPING.set()
        super().handle_exit(sig, frame)
