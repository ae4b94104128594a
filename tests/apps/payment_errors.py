"""An exception defined in a module that no workflow or activity lives in, and that
nobody allowed: the codec does not rebuild it (it arrives as ApplicationError)."""

from __future__ import annotations


class GatewayDown(Exception):
    def __init__(self, gateway: str) -> None:
        super().__init__(f"gateway {gateway} is down")
        self.gateway = gateway
