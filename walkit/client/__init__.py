"""walkit's client side: today the connection to one bookie (:class:`BookieClient`)."""

from walkit.client._bookie_client import BookieClient, client_ssl_context

__all__ = ["BookieClient", "client_ssl_context"]
