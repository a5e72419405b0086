"""Reading a client frame's headers: required ones, integers, a selector, a
durable subscription's name in the dialects users migrate from; and
:class:`FrameRejected`, what the session raises for a frame it refuses."""

from __future__ import annotations

from core.authorization import ANONYMOUS_PRINCIPAL
from core.clients import Client
from core.durables import USER_PREFIX
from core.selectors import Selector, SelectorError, compile_selector
from core.subscriptions import AckMode
from gateway.stomp import frames

ACK_MODES = {mode.value: mode for mode in AckMode}
# Headers a SEND carries that are not the application's: the transport's own,
# the ones mapped onto message fields, and the ones the broker sets on MESSAGE
# (a producer's values for those are dropped).
SEND_OWN_HEADERS = frozenset(
    {
        "destination", "receipt", "transaction", "content-length",
        "persistent", "priority", "expires", "expiration",
        "message-id", "subscription", "ack", "redelivered", "timestamp", "x-delivery-count",
    }
)
# Those of them whose value the session does not read: a SEND with only
# these makes a message with the defaults and no headers of its own.
SEND_DROPPED_HEADERS = SEND_OWN_HEADERS - {"persistent", "priority", "expires", "expiration", "transaction"}


class FrameRejected(Exception):
    """A well-formed frame the session refuses; ``reason`` goes in the ERROR."""

    def __init__(self, reason: str, **headers: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.headers = headers


def selector(frame: frames.Frame) -> Selector | None:
    """The SUBSCRIBE's JMS selector, compiled once; an invalid one is refused
    with where it failed."""
    text = frame.headers.get("selector")
    if text is None or not text.strip():
        return None
    try:
        return compile_selector(text)
    except SelectorError as exc:
        raise FrameRejected(f"invalid selector at character {exc.position}: {exc.reason}") from None


def require(frame: frames.Frame, name: str) -> str:
    value = frame.headers.get(name)
    if value is None:
        raise FrameRejected(f"{frame.command} frame requires a '{name}' header")
    return value


def int_header(frame: frames.Frame, name: str, default: int) -> int:
    return int_value(name, frame.headers.get(name), default)


def int_value(name: str, value: str | None, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise FrameRejected(f"header '{name}' must be an integer, not {value[:40]!r}") from None


def durable_owner(frame: frames.Frame, sub_id: str, client: Client) -> tuple[str, str] | None:
    """(client id, name) if the SUBSCRIBE asks for a durable subscription,
    in any of the three dialects users migrate from."""
    headers = frame.headers
    name = headers.get("activemq.subscriptionName") or headers.get("durable-subscription-name")
    if name is not None:  # ActiveMQ, Artemis: named within the connection's client-id
        client_id = client.client_id
        if not client_id:
            raise FrameRejected("a durable subscription needs a client-id header on CONNECT")
        return client_id, name
    if "true" in (headers.get("durable"), headers.get("persistent")) and headers.get("auto-delete") != "true":
        # RabbitMQ: the subscription id names it, within the client-id if
        # there is one, else within the user's own scope, so one user's
        # id:sub-0 is not another's.  (Anonymous: the old broker-wide
        # scope, for an open broker; a secured one refuses it.)
        principal = client.principal
        scope = "" if principal is ANONYMOUS_PRINCIPAL else USER_PREFIX + principal.name
        return client.client_id or scope, sub_id
    return None
